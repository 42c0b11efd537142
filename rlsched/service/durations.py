"""The live service's duration estimator, taught by the service's own finished jobs.

Duration-aware policies (shortest-first, Tiresias' rules, the deadline guard, learned models) read
``state.estimator.estimate(job)``; in simulation the engine feeds that estimator every completion. The
service does the same: it keeps ONE :class:`~rlsched.cluster.estimate.DurationEstimator` for its
lifetime, every live view it builds carries it, and each job that finishes successfully (done, exit 0)
teaches it the run time of its last attempt (``finished_at - started_at``). A failed, cancelled or lost
job teaches nothing: how long it ran says nothing about how long its work takes.

A restarted service warms the estimator up from the store's history (the most recent successful jobs,
replayed in finishing order so the exponentially weighted means end on the newest), so what it learnt
survives restarts. After that each finish is fed exactly once, when the transaction that recorded it
committed (see :mod:`rlsched.service.supervision`): O(1) per finished job, nothing read per tick.
"""

from __future__ import annotations

from rlsched.cluster.estimate import DurationEstimator
from rlsched.runtime.store import JobRecord, JobState, Store
from rlsched.service.context import LOG
from rlsched.service.view import job_of

#: Successful jobs a (re)started service replays from the store, at most (the newest ones).
WARMUP_JOBS = 2000


def run_time(rec: JobRecord) -> float | None:
    """The run time a finished job teaches: its last attempt's, for a job done with exit 0 (else None)."""
    if rec.state is not JobState.DONE or rec.exit_code != 0:
        return None
    if rec.started_at is None or rec.finished_at is None:
        return None
    return max(0.0, rec.finished_at - rec.started_at)


class LiveDurations:
    """The service's duration estimator and what feeds it (see the module doc).

    Args:
        store: the job store the warm-up reads.
        warmup_jobs: how many of the newest successful jobs :meth:`warm_up` replays, at most.
    """

    def __init__(self, store: Store, warmup_jobs: int = WARMUP_JOBS) -> None:
        self.store = store
        self.warmup_jobs = warmup_jobs
        #: the one estimator every live view carries (``view.state.estimator``)
        self.estimator = DurationEstimator()
        #: finished jobs learnt from, warm-up included
        self.learnt = 0

    def learn(self, rec: JobRecord) -> None:
        """Learn from a committed finished record (nothing unless it is done with exit 0: :func:`run_time`).

        The job is decoded as the live view decodes it (:func:`~rlsched.service.view.job_of`), so it
        carries the user and GPU class a policy's estimate is keyed by (the pools only narrow a job's GPU
        models, which no estimate reads).
        """
        duration = run_time(rec)
        if duration is None:
            return
        self.estimator.observe(job_of(rec), duration)
        self.learnt += 1

    def warm_up(self) -> int:
        """Replay the newest successful jobs of the store's history, oldest finish first; how many taught.

        Called once per service object, before recovery settles anything, so no finish is learnt twice.
        A store that cannot be read leaves the estimator as it is (it learns from the next finishes on):
        estimates are worth having, not worth refusing to start for.
        """
        try:
            recs = self.store.jobs([JobState.DONE], limit=self.warmup_jobs)
        except Exception:
            LOG.exception("could not read finished jobs to warm up the duration estimator")
            return 0
        recs.sort(key=lambda r: (r.finished_at or 0.0, r.seq))
        before = self.learnt
        for rec in recs:
            self.learn(rec)
        return self.learnt - before
