"""The heuristic schedulers the learned policy must beat.

Each is a :class:`~rlsched.policies.heuristics.queue.QueueHeuristic` with its own queue
order, placement rule and scaling rule, registered under its ``--policy`` name.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from rlsched.cluster.decisions import Decision, Place, Preempt
from rlsched.cluster.feasibility import pool_allows
from rlsched.cluster.model import ClusterState, JobRun, Placement, PoolKind, Sharing
from rlsched.policies.heuristics.autoscale import SpotFirstAutoscaler
from rlsched.policies.heuristics.placement import FragmentationAware, best_fit, first_fit, pools_by_cost
from rlsched.policies.heuristics.queue import QueueHeuristic
from rlsched.policies.registry import register


@register("weighted-priority", "the seed's rule: score = 0.6 x priority + 0.4 x wait (normalised), highest first")
class WeightedPriority(QueueHeuristic):
    """Serve the highest ``w_priority * p + w_wait * w`` first, backfilling what fits.

    Priority and wait have different units, so both are normalised over the
    current queue before weighting: priority by min-max (all equal -> 0), wait by
    the longest wait in the queue (so the oldest job scores 1). Ties go to the
    earlier submission. The seed's published pseudocode sorted ascending, which
    would serve the lowest score first; this serves the highest first.

    With ``preempt=True`` a blocked job may evict running *preemptible* jobs of
    strictly lower priority (graceful, checkpointed).
    """

    name = "weighted-priority"

    def __init__(self, w_priority: float = 0.6, w_wait: float = 0.4, preempt: bool = False, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        if w_priority < 0 or w_wait < 0:
            raise ValueError("weights must be >= 0")
        self.w_priority = w_priority
        self.w_wait = w_wait
        self.preempt = preempt
        self.blocked_needed = 4 if preempt else 0

    def order(self, state: ClusterState) -> Iterable[JobRun]:
        levels = state.queue_by_priority
        if len(levels) <= 1 or self.w_priority == 0:
            return list(state.queue.values())  # equal priorities: highest wait = submission order
        now = state.time
        pmin, pmax = min(levels), max(levels)
        wmax = now - min(next(iter(d.values())).job.submit_time for d in levels.values())
        wp = self.w_priority / (pmax - pmin)
        ww = self.w_wait / wmax if wmax > 0 else 0.0

        def key(r: JobRun) -> float:  # negated score: heapq.merge yields ascending keys
            return -(wp * (r.job.priority - pmin) + ww * (now - r.job.submit_time))

        # Each level is in submission order, i.e. descending score, so a lazy k-way
        # merge yields the global order without sorting the queue.
        return heapq.merge(*(list(d.values()) for d in levels.values()), key=key)

    def extra_decisions(self, state: ClusterState, blocked: list[JobRun]) -> Iterator[Decision]:
        if not self.preempt:
            return
        for run in blocked[:4]:
            victims = [
                r for r in state.running.values()
                if r.job.preemptible and r.job.priority < run.job.priority and r.placement is not None
            ]
            if not victims:
                continue
            yield from _evict_for(state, run, victims, key=lambda r: (r.job.priority, -r.started_at))


@register("fifo", "first come, first served, strictly in order (no backfill)")
class Fifo(QueueHeuristic):
    """Arrival order; the head of the queue blocks everyone behind it."""

    name = "fifo"
    backfill = False


@register("sjf", "shortest (estimated) job first, backfilling; oracle=true uses true durations")
class ShortestJobFirst(QueueHeuristic):
    """Shortest estimated remaining run time first.

    The estimate comes from :class:`~rlsched.cluster.estimate.DurationEstimator`
    (learnt from completed jobs of the same user and size); ``oracle=True`` uses
    true durations and is an upper-bound reference, not a deployable policy.
    """

    name = "sjf"

    def __init__(self, oracle: bool = False, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.oracle = oracle
        if oracle:
            self.name = "sjf-oracle"

    def order(self, state: ClusterState) -> Iterable[JobRun]:
        est = state.estimator.estimate
        if self.oracle:
            return sorted(state.queue.values(), key=lambda r: (r.remaining * r.job.gpu_demand, r.job.submit_time))
        return sorted(
            state.queue.values(),
            key=lambda r: (max(est(r.job) - r.work_done, 1.0) * r.job.gpu_demand, r.job.submit_time),
        )


@register("best-fit", "backfilling FIFO; each job goes where it leaves the least capacity on its node/GPU")
class BestFit(QueueHeuristic):
    """FIFO order with backfill and best-fit packing (least capacity left over)."""

    name = "best-fit"

    def __init__(self, **kw: object) -> None:
        kw.setdefault("placement", best_fit)
        super().__init__(**kw)  # type: ignore[arg-type]


@register("fgd", "FGD-style fragmentation-aware placement: grow expected unusable free capacity the least")
class FragmentationGradient(QueueHeuristic):
    """FIFO order with backfill and FGD-style placement (see :class:`FragmentationAware`)."""

    name = "fgd"

    def __init__(self, **kw: object) -> None:
        kw.setdefault("placement", FragmentationAware())
        super().__init__(**kw)  # type: ignore[arg-type]

    def reset(self, state: ClusterState) -> None:
        super().reset(state)
        self.placement = FragmentationAware()


@register("fair-share", "round-robin across users: the user with the least GPUs in use goes next")
class FairShare(QueueHeuristic):
    """Max-min fair share across users (tenants), the multi-tenant time-slice strategy.

    Users take turns: the next job served is the oldest queued job of the user
    currently holding the fewest GPUs (counting what this pass already placed).
    Jobs without a user share one anonymous tenant.
    """

    name = "fair-share"

    def order(self, state: ClusterState) -> Iterable[JobRun]:
        usage: dict[str, float] = {}
        for r in state.running.values():
            usage[r.job.user] = usage.get(r.job.user, 0.0) + r.job.gpu_demand
        per_user: dict[str, list[JobRun]] = {}
        for r in sorted(state.queue.values(), key=lambda r: r.job.submit_time):
            per_user.setdefault(r.job.user, []).append(r)
        heap = [(usage.get(u, 0.0), jobs[0].job.submit_time, u) for u, jobs in per_user.items()]
        heapq.heapify(heap)
        pos = dict.fromkeys(per_user, 0)
        while heap:
            used, _, user = heapq.heappop(heap)
            run = per_user[user][pos[user]]
            pos[user] += 1
            yield run
            if run.job.job_id not in state.queue:  # placed: the user now holds more
                used += run.job.gpu_demand
            if pos[user] < len(per_user[user]):
                heapq.heappush(heap, (used, per_user[user][pos[user]].job.submit_time, user))


@register("spot-fallback", "spot first, on-demand fallback; deadline-aware; scales elastic pools by queue length")
class SpotFallback(QueueHeuristic):
    """Cheapest capacity that keeps deadlines.

    Order: jobs with deadlines by least slack first, then FIFO. Placement: on-prem
    (already paid for), then spot for preemptible jobs whose deadline is not at
    risk, then on-demand. Scaling: buy spot for such jobs while the market has
    spot to sell, otherwise on-demand (:class:`SpotFirstAutoscaler`).
    """

    name = "spot-fallback"

    def __init__(self, risk_factor: float = 0.5, max_step: int = 8, **kw: object) -> None:
        kw.setdefault("autoscaler", SpotFirstAutoscaler(max_step=max_step, risk_factor=risk_factor))
        super().__init__(**kw)  # type: ignore[arg-type]
        assert isinstance(self.autoscaler, SpotFirstAutoscaler)
        self.scaler: SpotFirstAutoscaler = self.autoscaler

    def order(self, state: ClusterState) -> Iterable[JobRun]:
        now = state.time
        est = state.estimator.estimate

        def key(r: JobRun) -> tuple[int, float, float]:
            if r.job.deadline is None:
                return (1, 0.0, r.job.submit_time)
            return (0, r.job.deadline - now - est(r.job), r.job.submit_time)

        return sorted(state.queue.values(), key=key)

    def choose(self, state: ClusterState, run: JobRun) -> Placement | None:
        from rlsched.cluster.feasibility import pool_candidates

        pools = pools_by_cost(state)
        risky = run.job.deadline is not None and self.scaler.at_risk(state, run, 0.0)
        tiers = [
            [p for p in pools if p.spec.kind is PoolKind.ONPREM],
            [p for p in pools if p.spec.kind is PoolKind.SPOT and not risky],
            [p for p in pools if p.spec.kind is PoolKind.ONDEMAND],
        ]
        for tier in tiers:
            for pool in tier:
                if not pool_allows(run.job, pool.spec):
                    continue
                found = pool_candidates(pool, run.job, state.time, first=True)
                if found:
                    return found[0]
        return None


def _evict_for(state: ClusterState, run: JobRun, victims: list[JobRun], key: object) -> Iterator[Decision]:
    """Preempt victims on one node so that ``run`` fits there, then place it."""
    n = run.job.num_gpus
    by_node: dict[str, list[JobRun]] = {}
    for v in victims:
        assert v.placement is not None
        if len(v.placement.nodes) == 1 and pool_allows(run.job, state.pools[v.placement.pool].spec):
            by_node.setdefault(v.placement.nodes[0], []).append(v)
    for node_id, vs in by_node.items():
        node = state.nodes[node_id]
        if node.gpus and node.gpus[0].sharing is not Sharing.EXCLUSIVE:
            continue
        vs.sort(key=key)  # type: ignore[arg-type]
        free = node.free_whole
        chosen = []
        for v in vs:
            if free >= n:
                break
            chosen.append(v)
            free += v.job.num_gpus
        if free < n or not chosen:
            continue
        for v in chosen:
            yield Preempt(v.job.job_id, reason=f"preempted for {run.job.job_id}", checkpoint=True)
        placement = first_fit(state, run)
        if placement is not None:
            yield Place(run.job.job_id, placement)
        return


__all__ = [
    "BestFit", "FairShare", "Fifo", "FragmentationGradient", "ShortestJobFirst", "SpotFallback",
    "WeightedPriority",
]
