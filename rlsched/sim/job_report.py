"""The per-job CSV of a finished replay (``rlsched simulate --jobs-csv``): one row per job.

Times are on the trace clock (seconds); counts and lost GPU-hours sum to the run report's
totals, so the file explains the headline numbers job by job.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from pathlib import Path

from rlsched.cluster.model import JobRun, RunState
from rlsched.sim.engine import Engine

#: Columns of :func:`write_job_report`, in order.
JOB_REPORT_COLUMNS = (
    "job_id", "submit", "start", "finish", "jct", "wait", "restarts", "preemptions", "lost_gpu_hours",
    "on_spot", "deadline", "met",
)


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def job_rows(runs: Iterable[JobRun]) -> Iterator[dict[str, str]]:
    """One row per job: times on the trace clock (seconds), counts, lost GPU-hours, deadline verdict.

    ``start`` is the first start (the end of the first queueing spell), ``wait`` the
    total time queued over all spells (requeues after preemption included), ``jct``
    finish minus submit. ``on_spot`` says whether the job ran (last) on spot.
    ``met`` is empty for jobs without a deadline, else ``true`` when the job finished
    by its deadline and ``false`` otherwise (late, unfinished or never schedulable),
    the same rule as the engine's ``deadline_misses``. Unfinished jobs have empty
    ``finish`` and ``jct``.
    """
    for r in sorted(runs, key=lambda r: (r.job.submit_time, r.job.job_id)):
        job = r.job
        done = r.state is RunState.DONE and r.finish_time is not None
        met = ""
        if job.deadline is not None and r.state is not RunState.SKIPPED:
            ok = done and r.finish_time is not None and r.finish_time <= job.deadline + 1e-9
            met = "true" if ok else "false"
        yield {
            "job_id": job.job_id,
            "submit": _fmt(job.submit_time),
            "start": _fmt(r.first_start),
            "finish": _fmt(r.finish_time if done else None),
            "jct": _fmt(r.finish_time - job.submit_time if done and r.finish_time is not None else None),
            "wait": _fmt(r.queued_s),
            "restarts": str(r.restarts),
            "preemptions": str(r.preemptions),
            "lost_gpu_hours": f"{r.lost_gpu_seconds / 3600.0:.6f}",
            "on_spot": "true" if r.on_spot else "false",
            "deadline": _fmt(job.deadline),
            "met": met,
        }


def write_job_report(engine: Engine, path: str | Path) -> int:
    """Write the per-job CSV of a finished run (call after :meth:`Engine.run`).

    The totals of ``restarts`` and ``lost_gpu_hours`` over the rows equal the run
    report's ``restarts`` and ``lost_gpu_hours`` (both sum the same ``JobRun`` fields),
    so the per-job file explains the headline numbers job by job.

    Args:
        engine: the engine after its run.
        path: where to write the CSV (parent folders are created).

    Returns:
        The number of job rows written.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(JOB_REPORT_COLUMNS))
        w.writeheader()
        for row in job_rows(engine.runs.values()):
            w.writerow(row)
            n += 1
    return n

