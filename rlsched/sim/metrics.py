"""What one simulation run reports, and the time series behind its plots."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: Keys of the per-policy JSON result, in the order ``rlsched simulate --json`` writes them.
RESULT_KEYS = (
    "policy", "mean_jct_s", "p95_jct_s", "mean_wait_s", "p95_wait_s", "makespan_s", "gpu_utilization",
    "cost_usd", "cost_ondemand_usd", "cost_spot_usd", "preemptions", "restarts", "lost_gpu_hours",
    "deadline_misses", "jobs_completed", "jobs_unschedulable", "jobs_unfinished", "jobs_skipped", "refused_decisions",
    "loop_handovers", "wall_s",
)

#: The reason recorded for jobs still queued, running or not yet arrived when the horizon cut the run
#: short: counted in ``jobs_unschedulable`` (for compatibility) and on their own as ``jobs_unfinished``.
HORIZON_REASON = "unfinished at the simulation horizon"


@dataclass
class Timeline:
    """Sampled state over simulated time: utilisation, queue, cost, nodes per pool."""

    time_s: list[float] = field(default_factory=list)
    utilization: list[float] = field(default_factory=list)
    queue_length: list[int] = field(default_factory=list)
    cost_usd: list[float] = field(default_factory=list)
    nodes: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class Report:
    """Metrics of one run; JCT and waits are over completed batch jobs."""

    policy: str
    mean_jct_s: float
    p95_jct_s: float
    mean_wait_s: float
    p95_wait_s: float
    makespan_s: float
    gpu_utilization: float
    cost_usd: float
    cost_ondemand_usd: float
    cost_spot_usd: float
    preemptions: int
    restarts: int
    lost_gpu_hours: float
    deadline_misses: int
    jobs_completed: int
    jobs_unschedulable: int
    jobs_skipped: int
    refused_decisions: int
    wall_s: float
    #: decision points handed to the fallback heuristic because the scheduler was looping
    #: without progress (:mod:`rlsched.cluster.loop_detector`)
    loop_handovers: int = 0
    sim_events: int = 0
    unschedulable_reasons: dict[str, int] = field(default_factory=dict)
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    timeline: Timeline = field(default_factory=Timeline)

    @property
    def jobs_unfinished(self) -> int:
        """Jobs the horizon cut off (still queued, running or not yet arrived): they could have run."""
        return self.unschedulable_reasons.get(HORIZON_REASON, 0)

    @property
    def jobs_never_schedulable(self) -> int:
        """Jobs no pool could ever hold: ``jobs_unschedulable`` without those the horizon cut off."""
        return self.jobs_unschedulable - self.jobs_unfinished

    def result(self) -> dict[str, Any]:
        """The JSON object of ``rlsched simulate --json`` for this run."""
        d = asdict(self)
        d["jobs_unfinished"] = self.jobs_unfinished
        return {k: d[k] for k in RESULT_KEYS}


def mean_p95(values: list[float]) -> tuple[float, float]:
    """Mean and 95th percentile (0, 0 for no values)."""
    if not values:
        return 0.0, 0.0
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(np.percentile(arr, 95))
