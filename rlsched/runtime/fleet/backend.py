"""``--backend ray:auto`` / ``ray:HOST:PORT``: the GPUs of every node of a Ray cluster, through its agents.

:class:`RayBackend` is a :class:`~rlsched.runtime.backend.GpuBackend` like the NVML and simulated ones -
``plan``, ``apply``, ``export`` and ``serve`` use it unchanged - but each call is routed to the node agent
that manages the node it names (:mod:`~rlsched.runtime.fleet.agent`). An inventory asks every agent at
once; a node whose agent does not answer within the call timeout, or whose Ray node left the cluster, is
reported ``reachable=False`` (``?`` in a plan, never planned away, no new work) for as long as this
process remembers it. A node whose agent cannot open its GPUs (no NVML there) is unknown too, and the
reason is in :meth:`RayBackend.problems`. So is a node that answers again while the service's executor
still has a process there to fence (a job settled as lost with that node): nothing new starts beside it.

The service gets its job executor from :meth:`RayBackend.job_executor`, which also takes the cluster's
service lease (:mod:`~rlsched.runtime.fleet.lease`): one service drives a cluster's agents at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlsched.runtime.backend import BackendError, GpuInfo, NodeInfo
from rlsched.runtime.fleet.directory import AgentDirectory, AgentRef, AgentUnavailable


class RayBackend:
    """The GPUs of a Ray cluster's nodes (see the module doc).

    Args:
        address: ``auto`` or ``HOST:PORT`` (the part after ``ray:``).

    Raises:
        RayConnectError: the address is malformed or unreachable, or Ray is missing.
    """

    def __init__(self, address: str, *, call_timeout_s: float | None = None) -> None:
        kwargs = {} if call_timeout_s is None else {"call_timeout_s": call_timeout_s}
        self.directory = AgentDirectory(address, **kwargs)
        self.name = f"ray:{address}"
        self._lock = threading.Lock()
        #: every node name an agent ever reported, with its last inventory (unreachable ones stay listed)
        self._known: dict[str, NodeInfo] = {}
        #: the nodes whose agents answered the last inventory
        self._answered: set[str] = set()
        #: the service executor's nodes with a stray still to fence (:meth:`job_executor`): reported unknown
        self._fencing: Callable[[], set[str]] = set

    # ------------------------------------------------------------------ inventory
    def inventory(self) -> list[NodeInfo]:
        """Every node of every agent, asked at once; nodes that stopped answering as ``reachable=False``, and so
        is a node that answers again while the service's executor still has a stray of a lost job to fence
        there: no new work may start beside a process nobody runs any more (the fence follows at once)."""
        agents = self.directory.refresh()
        answers = self.directory.fan_out(agents, "inventory")
        seen: dict[str, NodeInfo] = {}
        for ref in agents:
            got = answers.get(ref.ray_node)
            if isinstance(got, list):
                self.directory.note_hosts(ref.ray_node, [n.hostname for n in got])
                for n in got:
                    seen[n.hostname] = n
            elif isinstance(got, Exception) and not isinstance(got, AgentUnavailable):
                self.directory.problems[ref.ray_node] = f"Ray node {ref.machine} ({ref.ray_node[:8]}): {got}"
        fencing = self._fencing()  # outside this lock: the executor's pump takes its own lock, then this one
        with self._lock:
            for ref in agents:  # hosts of an agent that failed stay known, as unreachable
                for host in ref.hosts:
                    if host not in seen and host not in self._known:
                        self._known[host] = NodeInfo(hostname=host, reachable=False)
            self._known.update(seen)
            self._answered = set(seen)
            usable = set(seen) - fencing
            return [n if n.hostname in usable else NodeInfo(hostname=n.hostname, reachable=False,
                                                            cordoned=n.cordoned, labels=n.labels)
                    for n in sorted(self._known.values(), key=lambda n: n.hostname)]

    def device_nodes(self) -> dict[str, str]:
        """GPU and MIG UUID -> the node it is on, from the last inventory (a gang's devices split by node)."""
        with self._lock:
            return {uuid: n.hostname for n in self._known.values() for g in n.gpus
                    for uuid in (g.uuid, *(d.uuid for d in g.mig_devices))}

    def problems(self) -> list[str]:
        """One line per Ray node without a working agent (not installed, no NVML, crashed)."""
        return sorted(self.directory.problems.values())

    def _agent(self, hostname: str) -> AgentRef:
        try:
            return self.directory.require(hostname)
        except AgentUnavailable:
            known = hostname in self._known
            raise BackendError(f"node {hostname} is unreachable" if known else
                               f"unknown node {hostname!r}: no agent of the Ray cluster manages it") from None

    def _call(self, hostname: str, method: str, *args: Any) -> Any:
        return self.directory.call(self._agent(hostname), method, *args)

    def node(self, hostname: str) -> NodeInfo:
        info: NodeInfo = self._call(hostname, "node", hostname)
        return info

    def cordon(self, hostname: str, on: bool) -> None:
        self._call(hostname, "cordon", hostname, on)

    def running_jobs(self, hostname: str) -> int:
        return int(self._call(hostname, "running_jobs", hostname))

    def set_mig_mode(self, hostname: str, gpu_uuid: str, enabled: bool) -> None:
        self._call(hostname, "set_mig_mode", hostname, gpu_uuid, enabled)

    def set_mig_layout(self, hostname: str, gpu_uuid: str, devices: Mapping[str, int]) -> GpuInfo:
        info: GpuInfo = self._call(hostname, "set_mig_layout", hostname, gpu_uuid, dict(devices))
        return info

    # ------------------------------------------------------------------ optional backend calls
    def telemetry(self) -> list[dict[str, Any]]:
        """Every reachable agent's GPU telemetry, gathered at once."""
        out: list[dict[str, Any]] = []
        for got in self.directory.fan_out(self.directory.refresh(), "telemetry").values():
            if isinstance(got, list):
                out.extend(got)
        return out

    def health_events(self, timeout_ms: int = 0) -> list[tuple[str, str]]:
        """Every reachable agent's GPU health events since the last call."""
        out: list[tuple[str, str]] = []
        for got in self.directory.fan_out(self.directory.refresh(), "health_events", 0).values():
            if isinstance(got, list):
                out.extend((str(u), str(r)) for u, r in got)
        return out

    # ------------------------------------------------------------------ the service's executor
    def job_executor(self, log_dir: str | Path) -> Any:
        """The service's job executor over these agents (takes the cluster's service lease).

        Raises:
            BackendError: another service holds this cluster's lease.
        """
        from rlsched.runtime.fleet.executor import RayExecutor

        ex = RayExecutor(self, log_dir)
        self._fencing = ex.fencing_nodes
        return ex

    def answered(self, hostname: str) -> bool:
        """Whether ``hostname``'s agent answered the last inventory (no call: what that read found)."""
        with self._lock:
            return hostname in self._answered
