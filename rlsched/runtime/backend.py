"""The GPU backend protocol: inventory and control of real or simulated GPUs.

``plan`` refreshes from a backend, ``apply`` drives it, and the runtime
(scheduler service) reads it. Two implementations share this protocol and
nothing else: :class:`~rlsched.runtime.sim_backend.SimulatedBackend` (a fleet in a
JSON file, updated by apply, so plan -> apply -> plan is a real round trip) and
:class:`~rlsched.runtime.nvml_backend.NvmlBackend` (the local machine through
nvidia-ml-py, imported lazily).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rlsched.errors import RlschedError


class BackendError(RlschedError):
    """A backend operation failed (the message says on which node/GPU and why)."""


class GpuInUseError(BackendError):
    """The GPU has running clients (NVML_ERROR_IN_USE): drain it first."""


class ResetRequiredError(BackendError):
    """A MIG mode change is pending until the GPU is reset (or the node rebooted)."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (GPU instance + compute instance) as NVML reports it."""

    profile: str  # e.g. "3g.40gb"
    uuid: str  # "MIG-..."
    start: int = 0  # placement start (memory slice)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Inventory of one GPU: declared attributes (MIG) plus identity.

    ``mig_current`` / ``mig_pending`` are NVML's (current, pending) MIG mode; a
    pending mode different from the current one means a reset is needed.
    """

    index: int
    uuid: str
    name: str  # NVML marketing name, e.g. "NVIDIA H100 80GB HBM3"
    model: str  # canonical catalogue name, e.g. "H100-80GB" (empty if unknown)
    memory_mib: int
    mig_current: bool = False
    mig_pending: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    healthy: bool = True
    processes: int = 0  # running compute processes (disruption estimates; never diffed)

    def layout_counts(self) -> dict[str, int]:
        """MIG layout as mig-parted counts (placement ignored)."""
        out: dict[str, int] = {}
        for d in self.mig_devices:
            out[d.profile] = out.get(d.profile, 0) + 1
        return out


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """Inventory of one node; ``reachable=False`` nodes are shown as unknown and never planned away."""

    hostname: str
    gpus: tuple[GpuInfo, ...] = ()
    reachable: bool = True
    cordoned: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """Hash of the declared attributes of every GPU (MIG mode, layout, MIG UUIDs).

        A saved plan records it per node; apply re-checks it right before touching
        the node and refuses if the node changed since the plan.
        """
        import hashlib

        h = hashlib.sha256()
        h.update(self.hostname.encode())
        for g in sorted(self.gpus, key=lambda g: g.uuid):
            h.update(f"|{g.uuid}|{g.mig_current}|{g.mig_pending}|".encode())
            for d in sorted(g.mig_devices, key=lambda d: (d.start, d.profile, d.uuid)):
                h.update(f"{d.profile}@{d.start}={d.uuid};".encode())
        return h.hexdigest()[:16]


class GpuBackend(Protocol):
    """Inventory and control of GPUs; every method names the node it touches.

    Optional methods (not Protocol members: a backend without them is still a
    ``GpuBackend``; the scheduler service looks them up with ``getattr`` and skips
    what is missing, and treats an exception from either as a loop error):

    * ``telemetry() -> list[dict[str, Any]]``: one dict per GPU with the keys of
      :data:`rlsched.runtime.nvml_backend.TELEMETRY_KEYS` (a reading the device
      does not support is None; ``error`` where reading the GPU failed). The
      service reads it at most every ``TELEMETRY_S`` seconds for its metrics.
    * ``health_events(timeout_ms: int = 0) -> list[tuple[str, str]]``: ``(GPU UUID,
      reason)`` of every health event (Xid, double-bit ECC growth) since the last
      call, each GPU unhealthy from then on; the service calls it (no timeout) with
      every inventory refresh, stops the jobs on those GPUs and gives them no new
      work.

    Both are implemented by :class:`~rlsched.runtime.sim_backend.SimulatedBackend`
    and :class:`~rlsched.runtime.nvml_backend.NvmlBackend`.
    """

    name: str

    def inventory(self) -> list[NodeInfo]:
        """Refresh: every node the backend knows, with its GPUs."""
        ...

    def node(self, hostname: str) -> NodeInfo:
        """Refresh one node (raises BackendError if unknown)."""
        ...

    def cordon(self, hostname: str, on: bool) -> None:
        """Stop (or resume) placing new work on a node."""
        ...

    def running_jobs(self, hostname: str) -> int:
        """Jobs on the node now (drain estimates); 0 where unknown."""
        ...

    def set_mig_mode(self, hostname: str, gpu_uuid: str, enabled: bool) -> None:
        """Enable/disable MIG; raises GpuInUseError or ResetRequiredError as NVML would."""
        ...

    def set_mig_layout(self, hostname: str, gpu_uuid: str, devices: Mapping[str, int]) -> GpuInfo:
        """Destroy every MIG instance on the GPU and create ``devices`` (all-or-nothing)."""
        ...
