"""Checkpoint arithmetic: what a stopped job keeps, and what a reclaim now would lose.

A job checkpoints every ``interval`` seconds of work (its own ``checkpoint_interval``,
else the world's default). An abrupt stop (a spot reclaim) keeps only the newest
checkpoint; a graceful stop (a scheduler's preemption) writes one first. The engine
applies these rules when it stops a job, and policies and the observation codec
use the same rules to price the risk of a reclaim - one definition, so what a
policy believes a reclaim costs is what the simulator charges.
"""

from __future__ import annotations

import math

from rlsched.cluster.model import DEFAULT_CHECKPOINT_INTERVAL_S, JobRun

__all__ = ["DEFAULT_CHECKPOINT_INTERVAL_S", "checkpoint_age", "exposure", "interval_of", "kept_after_reclaim",
           "progress_now"]


def interval_of(run: JobRun, default_s: float) -> float:
    """Seconds of work between the job's checkpoints (its own value wins)."""
    ci = run.job.checkpoint_interval
    return default_s if ci is None else ci


def kept_after_reclaim(progress: float, interval: float, checkpointed: float) -> float:
    """Work an abrupt stop at ``progress`` keeps: the newest checkpoint, never less than before.

    A checkpoint never shrinks: a job reclaimed while it repays its restart overhead
    (progress below ``checkpointed``) resumes from the checkpoint it already had.
    """
    kept = math.floor(max(progress, 0.0) / interval) * interval if interval > 0 else 0.0
    return max(kept, checkpointed)


def progress_now(run: JobRun, now: float) -> float:
    """Work done so far, the running segment included."""
    if run.placement is not None:
        return run.work_done + run.rate * (now - run.started_at)
    return run.work_done


def exposure(run: JobRun, now: float, default_interval_s: float) -> float:
    """Seconds of work a reclaim right now would throw away (0 for a job not running)."""
    if run.placement is None:
        return 0.0
    p = progress_now(run, now)
    return max(p - kept_after_reclaim(p, interval_of(run, default_interval_s), run.checkpointed), 0.0)


def checkpoint_age(run: JobRun, now: float) -> float:
    """Seconds since the job's newest checkpoint was written (0 when it holds none)."""
    return max(now - run.checkpoint_at, 0.0) if run.checkpoint_at is not None else 0.0
