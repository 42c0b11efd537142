"""A small in-memory :class:`~rlsched.runtime.backend.GpuBackend` and spec builders for unit tests.

The fake keeps GPUs as mutable dicts and rebuilds frozen ``NodeInfo`` on every read,
so tests can change the "hardware" between plan and apply exactly as a person
with nvidia-smi would. Every mutating call is recorded in ``calls``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlsched.cluster.catalog import gpu_model
from rlsched.cluster.feasibility import pack_layout
from rlsched.errors import RlschedError
from rlsched.runtime.backend import BackendError, GpuInfo, GpuInUseError, MigDevice, NodeInfo
from rlsched.runtime.nvml_backend import marketing_name, nvml_memory_mib
from rlsched.spec.model import DisruptionDecl, LifecycleDecl, MigLayoutDecl, PolicyDecl, PoolDecl, QuotaDecl, Spec

BALANCED = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


class FakeBackend:
    """GPUs in dicts; ``jobs`` per node drive drains; ``fail`` maps (op, host) to an error to raise once.

    A GPU dict's ``processes`` (default 0) simulates compute processes on that GPU: they count
    as running jobs and block MIG changes on it, as on NVML. MIG layouts are checked and placed
    with :func:`~rlsched.cluster.feasibility.pack_layout`, like the real backends.
    """

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
        g["devices"] = self._make(layout, g["model"], f"GPU {host}/{index}")

    def _make(self, layout: Mapping[str, int], model: str, where: str) -> list[tuple[str, str, int]]:
        """(profile, MIG UUID, placement start) per instance; BackendError if the layout is illegal."""
        names: list[str] = []
        for prof, n in sorted(layout.items()):
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise BackendError(f"{where}: MIG device count for {prof!r} must be an integer >= 0, got {n!r}")
            names.extend([prof] * n)
        m = gpu_model(model)
        for name in set(names):
            try:
                m.profile(name)
            except RlschedError as exc:
                raise BackendError(f"{where}: {exc}") from None
        placed = pack_layout(m, names)
        if placed is None:
            raise BackendError(f"{where}: MIG layout {dict(layout)} does not fit one {model}")
        out = []
        for prof_, start in placed:
            self._mig_serial += 1
            out.append((prof_.name, f"MIG-{self._mig_serial}", start))
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
        gpus = tuple(GpuInfo(index=g["index"], uuid=g["uuid"], name=marketing_name(g["model"]), model=g["model"],
                             memory_mib=nvml_memory_mib(g["model"]), mig_current=g["mig"], mig_pending=g["pending"],
                             mig_devices=tuple(MigDevice(p, u, s) for p, u, s in g["devices"]),
                             processes=g.get("processes", 0))
                     for g in n["gpus"])
        return NodeInfo(host, gpus, reachable=True, cordoned=n["cordoned"])

    def inventory(self) -> list[NodeInfo]:
        return [self._info(h) for h in sorted(self.nodes)]

    def node(self, hostname: str) -> NodeInfo:
        if hostname not in self.nodes or not self.nodes[hostname]["reachable"]:
            raise BackendError(f"node {hostname} is unreachable")
        return self._info(hostname)

    def _node(self, hostname: str) -> dict[str, Any]:
        if hostname not in self.nodes:
            raise BackendError(f"unknown node {hostname!r}")
        if not self.nodes[hostname]["reachable"]:
            raise BackendError(f"node {hostname} is unreachable")
        return self.nodes[hostname]

    def cordon(self, hostname: str, on: bool) -> None:
        self._raise("cordon", hostname)
        node = self._node(hostname)
        self.calls.append(("cordon", hostname, on))
        node["cordoned"] = on

    def running_jobs(self, hostname: str) -> int:
        return self.jobs.get(hostname, 0) + sum(g.get("processes", 0) for g in self._node(hostname)["gpus"])

    def _find(self, host: str, uuid: str) -> dict[str, Any]:
        g = next((g for g in self._node(host)["gpus"] if g["uuid"] == uuid), None)
        if g is None:
            raise BackendError(f"node {host} has no GPU with UUID {uuid}")
        return g

    def _busy(self, host: str, g: Mapping[str, Any]) -> bool:
        return bool(self.jobs.get(host) or g.get("processes", 0))

    def set_mig_mode(self, hostname: str, gpu_uuid: str, enabled: bool) -> None:
        self._raise("mode", hostname)
        g = self._find(hostname, gpu_uuid)
        if not gpu_model(g["model"]).mig_capable:
            raise BackendError(f"{hostname} {gpu_uuid}: MIG is not supported on this GPU")
        if g["mig"] == g["pending"] == enabled:
            return
        if not enabled and g["devices"] and self._busy(hostname, g):
            raise GpuInUseError(f"{hostname} {gpu_uuid}: in use: cannot destroy its MIG instances")
        g["pending"] = enabled  # recorded, as nvmlDeviceSetMigMode does, even when the reset is blocked
        if g["mig"] == enabled:
            return  # a pending change cancelled: no reset needed
        if self._busy(hostname, g):
            raise GpuInUseError(f"{hostname} {gpu_uuid}: in use")
        self.calls.append(("mode", hostname, gpu_uuid, enabled))
        g["mig"] = enabled
        g["devices"] = []

    def set_mig_layout(self, hostname: str, gpu_uuid: str, devices: Mapping[str, int]) -> GpuInfo:
        self._raise("layout", hostname)
        g = self._find(hostname, gpu_uuid)
        if not gpu_model(g["model"]).mig_capable:
            raise BackendError(f"{hostname} {gpu_uuid}: MIG is not supported on this GPU")
        if not g["mig"]:
            raise BackendError(f"{hostname} {gpu_uuid}: MIG disabled")
        made = self._make(devices, g["model"], f"{hostname} {gpu_uuid}")
        if self._busy(hostname, g):
            raise GpuInUseError(f"{hostname} {gpu_uuid}: in use")
        self.calls.append(("layout", hostname, gpu_uuid, dict(devices)))
        g["devices"] = made
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
