"""Jobs: what a trace row, a CLI submission or an inference service asks for.

A job asks for either ``num_gpus`` whole GPUs, or a fraction of ONE GPU
(``num_gpus == 1`` and ``gpu_milli < 1000``), which a MIG pool serves with the
smallest fitting profile and a time-sliced pool with one replica. ``num_gpus == 0``
jobs are CPU-only; the simulator skips and counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class JobKind(str, Enum):
    """Batch jobs finish; services (inference) hold their slice for their lifetime."""

    BATCH = "batch"
    SERVICE = "service"


@dataclass(frozen=True, slots=True)
class Job:
    """An immutable job request.

    Attributes:
        job_id: unique id within a trace.
        submit_time: seconds on the trace clock.
        duration: seconds of uninterrupted run time on what it asked for.
        num_gpus: whole GPUs (0 = CPU-only).
        gpu_milli: share of one GPU x1000 (only meaningful when ``num_gpus == 1``).
        gpu_models: allowed canonical GPU model names; empty = any.
        priority: higher is more important.
        user: tenant, for quotas and fairness.
        preemptible: tolerates preemption (may run on spot capacity).
        deadline: absolute completion deadline on the trace clock, or None.
        cpus: CPU cores requested (0 = not given).
        mem_mib: host memory requested (0 = not given).
        kind: batch or long-running service.
        checkpoint_interval: seconds between checkpoints; None = the pool default.
        duration_censored: the trace only gives a lower bound for the duration.
    """

    job_id: str
    submit_time: float
    duration: float
    num_gpus: int = 1
    gpu_milli: int = 1000
    gpu_models: frozenset[str] = field(default_factory=frozenset)
    priority: int = 0
    user: str = ""
    preemptible: bool = False
    deadline: float | None = None
    cpus: float = 0.0
    mem_mib: int = 0
    kind: JobKind = JobKind.BATCH
    checkpoint_interval: float | None = None
    duration_censored: bool = False

    @property
    def fractional(self) -> bool:
        """True for a request of part of one GPU."""
        return self.num_gpus == 1 and self.gpu_milli < 1000

    @property
    def gpu_demand(self) -> float:
        """GPUs asked for, counting a fraction as its share."""
        return self.gpu_milli / 1000.0 if self.fractional else float(self.num_gpus)

    @property
    def shape(self) -> tuple[int, int, frozenset[str]]:
        """Request shape: jobs with the same shape fit in exactly the same places."""
        return (self.num_gpus, self.gpu_milli if self.num_gpus == 1 else 1000, self.gpu_models)
