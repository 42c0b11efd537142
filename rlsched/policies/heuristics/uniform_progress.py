"""Uniform Progress (Wu et al., "Can't Be Late", NSDI'24) as an rlsched scheduler.

The paper's idea, for one job with compute time ``W``, submitted at ``s`` with
deadline ``D``: draw the straight progress line ``p*(t) = W (t - s) / (D - s)`` from
(submission, nothing done) to (deadline, all done). A job at or above the line can
afford spot's risk; a job below it has fallen behind and buys on-demand; once the
slack left cannot absorb one more restart it stays on on-demand for good (the
paper's safety net against the end-of-deadline cliff that greedy falls off).
Uniform Progress is parameter-free: it needs no model of spot availability. This
module implements it from that description (the mechanism is marked "from the paper,
unverified" in ``shared/docs/PRIOR_ART.md``); how each quantity maps to rlsched:

* **W** is the duration *estimate* of ``state.estimator`` (learnt from completed
  jobs; the true duration only under ``SimConfig(oracle_durations=True)``, as the
  paper assumes a known compute time). A job that has already done more than its
  estimate gets the estimate doubled until it exceeds the progress made (it is
  assumed at most half done), instead of looking finished forever.
* **Progress** is the work the engine counts as done: for a running job
  ``work_done + rate x time since its segment started``; for a queued job
  ``work_done``, which after a preemption is the last checkpoint minus the restart
  overhead still to repay. Lost (un-checkpointed) work is not progress, as in the
  paper, where a preemption sets progress back.
* **Restart cost**, the slack one more restart eats: ``restart_overhead_s`` + the
  provisioning delay of the on-demand pool that would take the job + the work a
  reclaim right now would throw away (the running job's un-checkpointed work; 0 for
  a queued job). The policy does not see :class:`~rlsched.sim.engine.SimConfig`,
  so ``restart_overhead_s`` and ``checkpoint_interval_s`` are its beliefs (the
  defaults are the engine's); a job's own ``checkpoint_interval`` wins.
* **Exhausted slack**: ``slack = D - t - remaining < restart cost``. The job is then
  committed to on-demand until it finishes.

Decisions per job with a deadline (preemptible; others can only use on-prem/on-demand):

* on/above the line, slack not exhausted -> on-prem, else spot. If spot is not
  ready but may be bought or is provisioning, the job waits for it (the autoscaler
  buys spot). If the market sells no spot, the job *waits* while it is ahead - the
  paper's "idle when ahead and spot is unavailable", which costs nothing - and the
  policy wakes itself when the line is about to overtake it.
* behind the line or committed -> on-prem, else on-demand (bought if needed); spot
  only if no on-demand capacity exists or can be bought.
* **Migration**: at each decision point a job *running on spot* that is behind or
  committed is moved: a graceful :class:`Preempt` (checkpoint, no work lost, one
  restart overhead paid) and an immediate placement on on-prem or on-demand capacity
  that is free at that moment (``migrate=False`` turns this off). Capacity that is
  merely being bought is not enough: another job may take it, and the moved job
  would fall back to spot and pay a restart for nothing. The paper switches the
  job's instance type at its decision points; rlsched's decision points are the
  engine's events plus the policy's own wake-ups (line crossings and the time at
  which a running job's slack stops covering a restart). A job on on-demand is
  never moved back to spot: the paper's policy may, but in rlsched every move costs
  a restart overhead and a provisioning delay, and the job is then behind or close
  to the line anyway.

Jobs without a deadline behave like ``spot-fallback``: on-prem, ready spot, ready
on-demand, and the autoscaler buys spot while the market sells it.

Queue order: jobs due for on-demand first (least slack first), then jobs without a
deadline (FIFO), then ahead-of-line deadline jobs (least slack first). This order
also keeps the skeleton's "a shape that failed once is not retried in this pass"
shortcut sound: a job of a later group never has more options than an earlier one
of the same shape, except that a no-deadline job may use ready spot that an
on-demand job skipped, which costs at most a pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rlsched.cluster.checkpoint import DEFAULT_CHECKPOINT_INTERVAL_S, interval_of, kept_after_reclaim, progress_now
from rlsched.cluster.decisions import Decision, Place, Preempt, WakeAt
from rlsched.cluster.estimate import believed_work
from rlsched.cluster.feasibility import fits_pool_spec
from rlsched.cluster.model import ClusterState, JobRun, Placement, Pool, PoolKind
from rlsched.policies.heuristics.autoscale import QueueAutoscaler, headroom
from rlsched.policies.heuristics.queue import QueueHeuristic
from rlsched.policies.heuristics.spot import obtainable, place_in_tiers, spot_obtainable
from rlsched.policies.registry import register

__all__ = ["ProgressView", "UniformProgress", "UniformProgressAutoscaler", "progress_view"]

#: Progress within this many seconds below the line still counts as on the line.
LINE_TOLERANCE_S = 1e-6
#: A self-requested wake-up lands this long after the crossing it waits for, so
#: that the crossing has happened (strict inequalities) when the policy looks.
_WAKE_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class ProgressView:
    """Where a job stands against its Uniform Progress line at one instant.

    Attributes:
        work: total work W assumed (seconds at full speed).
        line: the line's value p*(t) = W (t - s) / (D - s), clipped to [0, W].
        progress: work done so far (seconds).
        remaining: W - progress, at least 0.
        slack: D - t - remaining: time to spare if the job ran uninterrupted from now.
        restart_cost: slack one more restart would eat.
        behind: progress is below the line (by more than :data:`LINE_TOLERANCE_S`).
        exhausted: slack < restart_cost: the job can no longer risk spot.
    """

    work: float
    line: float
    progress: float
    remaining: float
    slack: float
    restart_cost: float
    behind: bool
    exhausted: bool

    @property
    def kind(self) -> PoolKind:
        """The capacity kind Uniform Progress picks: on-demand if behind or exhausted, else spot."""
        return PoolKind.ONDEMAND if self.behind or self.exhausted else PoolKind.SPOT


def progress_view(*, t: float, submit: float, deadline: float, work: float, progress: float,
                  restart_cost: float) -> ProgressView:
    """The Uniform Progress verdict for one job (pure; see the module doc for the terms).

    Args:
        t: now.
        submit: submission time s (the line starts at (s, 0)).
        deadline: deadline D (the line ends at (D, W)).
        work: total work W.
        progress: work done so far.
        restart_cost: slack one more restart would eat.

    Returns:
        The job's :class:`ProgressView`. A deadline at or before the submission has
        a vertical line: the job is behind unless it is done.
    """
    span = deadline - submit
    frac = 1.0 if span <= 0 else min(max((t - submit) / span, 0.0), 1.0)
    line = work * frac
    remaining = max(work - progress, 0.0)
    slack = deadline - t - remaining
    return ProgressView(
        work=work, line=line, progress=progress, remaining=remaining, slack=slack, restart_cost=restart_cost,
        behind=progress < line - LINE_TOLERANCE_S, exhausted=slack < restart_cost,
    )


class UniformProgressAutoscaler(QueueAutoscaler):
    """Buys the capacity kind the policy picked for each blocked job (see :class:`UniformProgress`)."""

    def __init__(self, policy: UniformProgress, max_step: int = 8) -> None:
        super().__init__(max_step)
        self.policy = policy

    def choose_pool(self, state: ClusterState, run: JobRun, pools: list[Pool]) -> Pool | None:
        spot = [p for p in pools if p.spec.kind is PoolKind.SPOT and headroom(state, p) > 0]
        other = [p for p in pools if p.spec.kind is not PoolKind.SPOT and headroom(state, p) > 0]
        if self.policy.kind_for(state, run) is PoolKind.SPOT:
            if spot and run.job.preemptible:
                return super().choose_pool(state, run, spot)
            if spot_obtainable(state, run) or run.job.deadline is not None:
                return None  # spot is coming, or the job is ahead and may wait for it
            return super().choose_pool(state, run, other) if other else None
        if other:
            return super().choose_pool(state, run, other)
        if obtainable(state, run, PoolKind.ONDEMAND):
            return None  # on-demand is provisioning: wait for it
        return super().choose_pool(state, run, spot) if spot and run.job.preemptible else None


@register("uniform-progress",
          "Can't Be Late (NSDI'24): spot while on/above the straight progress line to the deadline, else on-demand")
class UniformProgress(QueueHeuristic):
    """Uniform Progress: keep each deadline job on the straight line to its deadline.

    See the module docstring for the rule, how W, progress and the restart cost are
    taken from the simulation, and what is migrated.

    Args:
        restart_overhead_s: seconds of work a restart repeats (the policy's belief;
            the engine's ``SimConfig.restart_overhead_s`` default).
        checkpoint_interval_s: seconds between checkpoints for jobs without their own
            ``checkpoint_interval`` (the engine's default).
        migrate: move running spot jobs that fell behind to on-demand.
        max_step: nodes bought per pool per autoscaler scan.
    """

    name = "uniform-progress"

    def __init__(self, restart_overhead_s: float = 60.0, checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S,
                 migrate: bool = True, max_step: int = 8, **kw: Any) -> None:
        if restart_overhead_s < 0 or checkpoint_interval_s < 0:
            raise ValueError("restart_overhead_s and checkpoint_interval_s must be >= 0")
        kw.setdefault("autoscaler", UniformProgressAutoscaler(self, max_step=max_step))
        super().__init__(**kw)
        self.restart_overhead_s = restart_overhead_s
        self.checkpoint_interval_s = checkpoint_interval_s
        self.migrate = migrate
        #: jobs whose slack ran out: on-demand until they finish.
        self.committed: set[str] = set()
        self._kinds: dict[str, PoolKind] = {}
        self._kinds_at = -math.inf
        self._wake_pending = -math.inf
        #: the kind each queued deadline job had at the previous decision (to see it flip).
        self._was: dict[str, PoolKind] = {}

    def reset(self, state: ClusterState) -> None:
        super().reset(state)
        self.committed = set()
        self._kinds = {}
        self._kinds_at = -math.inf
        self._wake_pending = -math.inf
        self._was = {}

    # ------------------------------------------------------------------ the rule
    def progress(self, state: ClusterState, run: JobRun) -> float:
        """Work done so far (a running job's current segment included)."""
        return progress_now(run, state.time)

    def work(self, state: ClusterState, run: JobRun, progress: float) -> float:
        """Total work W: the estimate, doubled until it exceeds the progress made."""
        return believed_work(state.estimator.estimate(run.job), progress)

    def exposure(self, run: JobRun, progress: float) -> float:
        """Work a reclaim now would throw away (0 unless running on spot)."""
        if run.placement is None or not run.on_spot:
            return 0.0
        kept = kept_after_reclaim(progress, interval_of(run, self.checkpoint_interval_s), run.checkpointed)
        return max(progress - kept, 0.0)

    def ondemand_delay(self, state: ClusterState, run: JobRun) -> float:
        """Provisioning delay of the quickest on-demand pool that fits the job (0 if none)."""
        delays = [p.spec.provision_delay_s for p in state.pools.values()
                  if p.spec.kind is PoolKind.ONDEMAND and fits_pool_spec(run.job, p.spec)]
        return min(delays) if delays else 0.0

    def view(self, state: ClusterState, run: JobRun) -> ProgressView | None:
        """The job's :class:`ProgressView` now, or None for a job without a deadline."""
        dl = run.job.deadline
        if dl is None:
            return None
        p = self.progress(state, run)
        cost = self.restart_overhead_s + self.ondemand_delay(state, run) + self.exposure(run, p)
        return progress_view(t=state.time, submit=run.job.submit_time, deadline=dl, work=self.work(state, run, p),
                             progress=p, restart_cost=cost)

    def kind_for(self, state: ClusterState, run: JobRun) -> PoolKind:
        """The capacity kind the job should run on now (spot or on-demand); commits are sticky."""
        if self._kinds_at != state.time:
            self._kinds.clear()
            self._kinds_at = state.time
        jid = run.job.job_id
        kind = self._kinds.get(jid)
        if kind is not None:
            return kind
        if not run.job.preemptible or jid in self.committed:
            kind = PoolKind.ONDEMAND
        else:
            v = self.view(state, run)
            if v is None:
                kind = PoolKind.SPOT
            else:
                if v.exhausted:
                    self.committed.add(jid)
                kind = v.kind
        self._kinds[jid] = kind
        return kind

    # ------------------------------------------------------------------ skeleton hooks
    def order(self, state: ClusterState) -> Iterable[JobRun]:
        def key(r: JobRun) -> tuple[int, float, float]:
            v = self.view(state, r)
            if self.kind_for(state, r) is PoolKind.ONDEMAND:
                return (0, v.slack if v is not None else math.inf, r.job.submit_time)
            if v is None:
                return (1, 0.0, r.job.submit_time)
            return (2, v.slack, r.job.submit_time)

        return sorted(state.queue.values(), key=key)

    def choose(self, state: ClusterState, run: JobRun) -> Placement | None:
        if self.kind_for(state, run) is PoolKind.ONDEMAND:
            placement = place_in_tiers(state, run, [[PoolKind.ONPREM], [PoolKind.ONDEMAND]])
            if placement is not None or obtainable(state, run, PoolKind.ONDEMAND):
                return placement
            return place_in_tiers(state, run, [[PoolKind.SPOT]])  # no on-demand at all: spot beats nothing
        placement = place_in_tiers(state, run, [[PoolKind.ONPREM], [PoolKind.SPOT]])
        if placement is not None or spot_obtainable(state, run) or run.job.deadline is not None:
            return placement  # ahead of the line: wait for spot rather than pay on-demand
        return place_in_tiers(state, run, [[PoolKind.ONDEMAND]])

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        if self.migrate and state.running:
            moved = False
            for run in list(state.running.values()):
                if not run.on_spot or run.job.deadline is None:
                    continue
                if self.kind_for(state, run) is not PoolKind.ONDEMAND:
                    continue
                # Move only onto capacity free *now*, and place the job there at once: preempting
                # to wait for on-demand that another job may take would only pay restarts.
                target = place_in_tiers(state, run, [[PoolKind.ONPREM], [PoolKind.ONDEMAND]])
                if target is None:
                    continue
                yield Preempt(run.job.job_id, reason="uniform-progress: behind its line, moving to on-demand",
                              checkpoint=True)
                yield Place(run.job.job_id, target)
                moved = True
            if moved:
                self._kinds_at = -math.inf  # progress of the moved jobs changed
                self._next_scale = -math.inf  # buy their on-demand now, not at the next scan
        # A queued job that just fell behind (or ran out of slack) gets its on-demand
        # bought now rather than at the autoscaler's next periodic scan.
        for run in state.queue.values():
            if run.job.deadline is None or not run.job.preemptible:
                continue
            kind = self.kind_for(state, run)
            if kind is PoolKind.ONDEMAND and self._was.get(run.job.job_id) is not PoolKind.ONDEMAND:
                self._next_scale = -math.inf
            self._was[run.job.job_id] = kind
        yield from super().decide(state)
        wake = self._next_wake(state)
        if wake < math.inf and not (state.time < self._wake_pending <= wake):
            self._wake_pending = wake
            yield WakeAt(wake)

    def _next_wake(self, state: ClusterState) -> float:
        """Earliest time a queued job crosses its line or a spot job's slack stops covering a restart."""
        now = state.time
        best = math.inf
        for run in state.queue.values():
            if run.job.deadline is None or run.job.job_id in self.committed or not run.job.preemptible:
                continue
            v = self.view(state, run)
            if v is None or v.kind is PoolKind.ONDEMAND:
                continue
            dl = run.job.deadline
            span = dl - run.job.submit_time
            if v.work > 0 and span > 0:  # the line reaches the (frozen) progress here
                best = min(best, run.job.submit_time + max(v.progress, 0.0) / v.work * span)
            best = min(best, now + v.slack - v.restart_cost)  # slack shrinks at rate 1 while queued
        for run in state.running.values():
            if not run.on_spot or run.job.deadline is None or run.job.job_id in self.committed:
                continue
            v = self.view(state, run)
            if v is None or v.kind is PoolKind.ONDEMAND:
                continue
            # While running, slack is constant and the exposure grows at the job's rate.
            best = min(best, now + (v.slack - v.restart_cost) / max(run.rate, 1e-9))
        wake = best + _WAKE_AFTER_S
        return wake if now < wake < math.inf else math.inf
