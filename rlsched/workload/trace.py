"""The in-memory job trace every reader returns and every consumer takes.

A trace is more than its jobs: a simulator report must say how many rows were
dropped and why (CPU-only pods, broken rows, zero durations) and how many
durations are only lower bounds (right-censored), otherwise results from
different traces cannot be compared honestly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from rlsched.cluster.job import Job

_SUBMIT = attrgetter("submit_time")


@dataclass
class Trace:
    """Jobs in submission order plus what the reader dropped or could not observe.

    Attributes:
        jobs: jobs sorted by ``submit_time``; ties keep file order (stable sort), so a
            replay is deterministic.
        source: where the jobs came from (a path, possibly with a window suffix).
        skipped_rows: rows of the source that produced no job.
        skip_reasons: ``skipped_rows`` broken down by reason (e.g. ``"bad row"``,
            ``"cpu-only"``, ``"zero duration"``).
        censored: jobs whose duration is only a lower bound (``duration_censored``).
    """

    jobs: list[Job]
    source: str = ""
    skipped_rows: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)
    censored: int = 0

    def __post_init__(self) -> None:
        # Sorting here (not in each reader) makes "jobs are in submit order" an
        # invariant of the type; Timsort is linear on already-sorted input.
        self.jobs = sorted(self.jobs, key=_SUBMIT)

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def start(self) -> float:
        """First submission time (0.0 for an empty trace)."""
        return self.jobs[0].submit_time if self.jobs else 0.0

    @property
    def last_submit(self) -> float:
        """Last submission time (0.0 for an empty trace)."""
        return self.jobs[-1].submit_time if self.jobs else 0.0

    @property
    def end(self) -> float:
        """Latest ``submit_time + duration``: when the trace's work would be over on an infinite cluster."""
        return max((j.submit_time + j.duration for j in self.jobs), default=0.0)

    @property
    def span(self) -> float:
        """``end - start``: the trace's length in seconds."""
        return self.end - self.start

    def gpu_seconds(self) -> float:
        """GPU-seconds demanded, counting a fractional request as its share of one GPU."""
        return sum(j.gpu_demand * j.duration for j in self.jobs)
