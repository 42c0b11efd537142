"""A small in-memory :class:`~rlsched.runtime.backend.GpuBackend` and spec builders for unit tests.

The fake keeps GPUs as mutable dicts and rebuilds frozen ``NodeInfo`` on every read,
so tests can change the "hardware" between plan and apply exactly as a person
with nvidia-smi would. Every mutating call is recorded in ``calls``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlsched.runtime.backend import BackendError, GpuInfo, GpuInUseError, MigDevice, NodeInfo
from rlsched.spec.model import DisruptionDecl, LifecycleDecl, MigLayoutDecl, PolicyDecl, PoolDecl, QuotaDecl, Spec

BALANCED = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


class FakeBackend:
    """GPUs in dicts; ``jobs`` per node drive drains; ``fail`` maps (op, host) to an error to raise once."""

    name = "fake"

    def __init__(self, hosts: Mapping[str, int] | None = None, model: str = "H100-80GB") -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.jobs: dict[str, int] = {}
        self.fail: dict[tuple[str, str], Exception] = {}
        self._mig_serial = 0
        for host, n in (hosts or {}).items():
            self.add_node(host, n, model)

    def add_node(self, host: str, gpus: int = 2, model: str = "H100-80GB") -> None:
        self.nodes[host] = {"reachable": True, "cordoned": False, "gpus": [
            {"index": i, "uuid": f"GPU-{host}-{i}", "model": model, "mig": False, "pending": False, "devices": []}
            for i in range(gpus)]}

    # -- test controls --

    def gpu(self, host: str, index: int) -> dict[str, Any]:
        return self.nodes[host]["gpus"][index]

    def set_layout(self, host: str, index: int, layout: Mapping[str, int]) -> None:
        g = self.gpu(host, index)
        g["mig"] = g["pending"] = True
        g["devices"] = self._make(layout)

    def _make(self, layout: Mapping[str, int]) -> list[tuple[str, str]]:
        out = []
        for prof, n in sorted(layout.items()):
            for _ in range(n):
                self._mig_serial += 1
                out.append((prof, f"MIG-{self._mig_serial}"))
        return out

    def _raise(self, op: str, host: str) -> None:
        exc = self.fail.pop((op, host), None)
        if exc is not None:
            raise exc

    # -- GpuBackend --

    def _info(self, host: str) -> NodeInfo:
        n = self.nodes[host]
        if not n["reachable"]:
            return NodeInfo(host, (), reachable=False)
        gpus = tuple(GpuInfo(index=g["index"], uuid=g["uuid"], name="NVIDIA H100 80GB HBM3", model=g["model"],
                             memory_mib=81559, mig_current=g["mig"], mig_pending=g["pending"],
                             mig_devices=tuple(MigDevice(p, u, i) for i, (p, u) in enumerate(g["devices"])))
                     for g in n["gpus"])
        return NodeInfo(host, gpus, reachable=True, cordoned=n["cordoned"])

    def inventory(self) -> list[NodeInfo]:
        return [self._info(h) for h in sorted(self.nodes)]

    def node(self, hostname: str) -> NodeInfo:
        if hostname not in self.nodes or not self.nodes[hostname]["reachable"]:
            raise BackendError(f"node {hostname} is unreachable")
        return self._info(hostname)

    def cordon(self, hostname: str, on: bool) -> None:
        self._raise("cordon", hostname)
        self.calls.append(("cordon", hostname, on))
        self.nodes[hostname]["cordoned"] = on

    def running_jobs(self, hostname: str) -> int:
        return self.jobs.get(hostname, 0)

    def _find(self, host: str, uuid: str) -> dict[str, Any]:
        return next(g for g in self.nodes[host]["gpus"] if g["uuid"] == uuid)

    def set_mig_mode(self, hostname: str, gpu_uuid: str, enabled: bool) -> None:
        self._raise("mode", hostname)
        if self.jobs.get(hostname):
            raise GpuInUseError(f"{hostname}: in use")
        self.calls.append(("mode", hostname, gpu_uuid, enabled))
        g = self._find(hostname, gpu_uuid)
        g["mig"] = g["pending"] = enabled
        g["devices"] = []

    def set_mig_layout(self, hostname: str, gpu_uuid: str, devices: Mapping[str, int]) -> GpuInfo:
        self._raise("layout", hostname)
        self.calls.append(("layout", hostname, gpu_uuid, dict(devices)))
        g = self._find(hostname, gpu_uuid)
        if not g["mig"]:
            raise BackendError("MIG disabled")
        g["devices"] = self._make(devices)
        return next(x for x in self._info(hostname).gpus if x.uuid == gpu_uuid)


def make_spec(pools: Mapping[str, tuple[str, ...]] | None = None, *, layout: Mapping[str, int] | None = None,
              mig_pools: tuple[str, ...] = (), prevent_destroy: tuple[str, ...] = (), max_unavailable: int = 1,
              drain_timeout_s: float = 60.0, quotas: Mapping[str, QuotaDecl] | None = None,
              policies: Mapping[str, PolicyDecl] | None = None, gpu_model: str = "H100-80GB") -> Spec:
    """A Spec built directly (no HCL): ``pools`` maps pool name to node hostnames."""
    decls = {}
    for name, nodes in (pools or {}).items():
        decls[name] = PoolDecl(name=name, gpu_model=gpu_model, nodes=tuple(nodes),
                               mig_layout="lay" if name in mig_pools else None,
                               disruption=DisruptionDecl(drain_timeout_s=drain_timeout_s,
                                                         max_unavailable=max_unavailable),
                               lifecycle=LifecycleDecl(prevent_destroy=name in prevent_destroy))
    layouts = {"lay": MigLayoutDecl("lay", dict(layout or BALANCED))}
    return Spec(pools=decls, layouts=layouts, quotas=dict(quotas or {}), policies=dict(policies or {}))
