"""Cost baselines for hybrid (on-prem + on-demand + spot) clusters.

The baselines the learned spot policy must beat on cost, each an ordinary
:class:`~rlsched.policies.heuristics.queue.QueueHeuristic` selectable by ``--policy``:

* ``ondemand-static``: on-demand only, provisioned for the peak (every on-demand
  pool held at its maximum for the whole run). The "never think about it" bill.
* ``ondemand-autoscale``: on-demand only, bought for the waiting queue and stopped
  when idle (the engine's idle stop). The reference that cost ratios are taken
  against: what an operator pays without spot.
* ``spot-greedy``: preemptible jobs on spot whenever spot can be had, deadlines
  ignored. Shows what spot saves and what reclaims cost when nobody watches the clock.

``spot-fallback`` lives in :mod:`rlsched.policies.heuristics.classic` and ``uniform-progress``
in :mod:`rlsched.policies.heuristics.uniform_progress`. What happened to every job of a run
(restarts, lost GPU-hours, deadline met) is :func:`rlsched.sim.job_report.write_job_report`'s CSV.

All three run FIFO with backfill and first-fit placement, so that cost differences
come from *which capacity* they buy, not from queue order or packing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from rlsched.cluster.decisions import Decision, Scale, WakeAt
from rlsched.cluster.feasibility import fits_pool_spec, pool_allows, pool_candidates
from rlsched.cluster.model import ClusterState, JobRun, NodeStatus, Placement, Pool, PoolKind
from rlsched.policies.heuristics.autoscale import QueueAutoscaler, headroom
from rlsched.policies.heuristics.placement import pools_by_cost
from rlsched.policies.heuristics.queue import QueueHeuristic
from rlsched.policies.registry import register

__all__ = [
    "OnDemandAutoscale",
    "OnDemandOnlyAutoscaler",
    "OnDemandStatic",
    "SpotGreedy",
    "SpotGreedyAutoscaler",
    "place_in_tiers",
    "spot_obtainable",
]

_NOT_SPOT = (PoolKind.ONPREM, PoolKind.ONDEMAND)


# --------------------------------------------------------------------------- shared helpers


def place_in_tiers(state: ClusterState, run: JobRun, tiers: Sequence[Sequence[PoolKind]]) -> Placement | None:
    """First-fit over pools grouped in tiers of capacity kinds, cheapest pool first within a tier.

    Tiers make the capacity choice explicit (e.g. ``[[ONPREM], [SPOT], [ONDEMAND]]``),
    instead of relying on the price order of :func:`pools_by_cost`, which would put a
    spot pool before on-prem whenever a market quotes it at 0.

    Args:
        state: the cluster (read only).
        run: the queued job to place.
        tiers: capacity kinds to try, tier by tier.

    Returns:
        The first legal placement found, or None.
    """
    pools = pools_by_cost(state)
    for kinds in tiers:
        for pool in pools:
            if pool.spec.kind not in kinds or not pool_allows(run.job, pool.spec):
                continue
            found = pool_candidates(pool, run.job, state.time, first=True)
            if found:
                return found[0]
    return None


def _provisioning(pool: Pool) -> bool:
    return any(n.status is NodeStatus.PROVISIONING for n in pool.nodes.values())


def obtainable(state: ClusterState, run: JobRun, kind: PoolKind) -> bool:
    """True if capacity of ``kind`` for ``run`` is being provisioned or may still be bought.

    Used to decide between waiting for a kind of capacity and falling back to
    another: waiting only makes sense if the capacity can actually come.
    """
    for pool in state.pools.values():
        if pool.spec.kind is not kind or not fits_pool_spec(run.job, pool.spec):
            continue
        if headroom(state, pool) > 0 or _provisioning(pool):
            return True
    return False


def spot_obtainable(state: ClusterState, run: JobRun) -> bool:
    """True if ``run`` may use spot and spot for it is coming or can be bought now."""
    return run.job.preemptible and obtainable(state, run, PoolKind.SPOT)


class OnDemandOnlyAutoscaler(QueueAutoscaler):
    """:class:`QueueAutoscaler` that never buys spot (only on-demand pools)."""

    def choose_pool(self, state: ClusterState, run: JobRun, pools: list[Pool]) -> Pool | None:
        return super().choose_pool(state, run, [p for p in pools if p.spec.kind is not PoolKind.SPOT])

    def forecast_pool(self, state: ClusterState, pools: list[Pool]) -> Pool | None:
        return super().forecast_pool(state, [p for p in pools if p.spec.kind is not PoolKind.SPOT])


class SpotGreedyAutoscaler(QueueAutoscaler):
    """Buy spot for every preemptible job while the market sells it; on-demand otherwise.

    A preemptible job for which spot is still provisioning (but the pool cannot grow
    further) gets nothing new: it waits for that spot, as its placement rule does.
    """

    def choose_pool(self, state: ClusterState, run: JobRun, pools: list[Pool]) -> Pool | None:
        spot = [p for p in pools if p.spec.kind is PoolKind.SPOT and headroom(state, p) > 0]
        if run.job.preemptible and spot:
            return super().choose_pool(state, run, spot)
        if spot_obtainable(state, run):
            return None
        return super().choose_pool(state, run, [p for p in pools if p.spec.kind is not PoolKind.SPOT])


# --------------------------------------------------------------------------- baselines


@register("ondemand-static", "on-demand only, every on-demand pool held at its maximum (peak provisioning)")
class OnDemandStatic(QueueHeuristic):
    """On-demand capacity provisioned for the peak, never spot.

    At its first decision (the first arrival) every on-demand pool is scaled to its
    ``max_nodes`` and kept there for the whole run: the cost is ``max nodes x GPUs
    x price x makespan`` whatever the load, which is what a fixed reservation costs.

    The engine stops elastic nodes idle for ``idle_stop_s`` and a policy cannot veto
    that, so min=max semantics are kept by re-buying: the policy asks to be woken at
    the exact time of the next idle stop (:class:`WakeAt`) and scales back to the
    maximum in the same instant. The bill stays continuous; the capacity has a gap of
    one provisioning delay (none when the delay is 0). A pool whose ``min_nodes``
    equals its maximum is never stopped, so nothing is re-bought there.

    Placement: FIFO with backfill, first fit on on-prem then on-demand.
    """

    name = "ondemand-static"

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("autoscaler", OnDemandOnlyAutoscaler())
        super().__init__(**kw)
        self._wake_at = -math.inf

    def reset(self, state: ClusterState) -> None:
        super().reset(state)
        self._wake_at = -math.inf

    def choose(self, state: ClusterState, run: JobRun) -> Placement | None:
        return place_in_tiers(state, run, [[PoolKind.ONPREM], [PoolKind.ONDEMAND]])

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        next_stop = math.inf
        for pool in state.pools.values():
            spec = pool.spec
            if spec.kind is not PoolKind.ONDEMAND:
                continue
            missing = spec.max_nodes - len(pool.nodes)
            if missing > 0:
                yield Scale(pool.name, missing)
            if spec.idle_stop_s >= 0 and len(pool.nodes) > spec.min_nodes:
                stop_after = max(spec.idle_stop_s, 1.0)  # as the engine's idle check
                for node in pool.nodes.values():
                    if node.ready and not node.jobs:
                        next_stop = min(next_stop, node.idle_since + stop_after)
        if next_stop < math.inf and next_stop > state.time and next_stop != self._wake_at:
            self._wake_at = next_stop
            yield WakeAt(next_stop)
        yield from super().decide(state)


@register("ondemand-autoscale", "on-demand only, scaled on queue length, idle nodes stopped (the no-spot reference)")
class OnDemandAutoscale(QueueHeuristic):
    """On-demand only, bought for the waiting queue, stopped by the engine when idle.

    The queue autoscaler (:class:`QueueAutoscaler`) restricted to on-demand pools; the
    engine's idle stop (``idle_stop_s``) releases capacity. This is the cost reference
    of the cost report: what the same cluster costs without spot.

    Placement: FIFO with backfill, first fit on on-prem then on-demand.
    """

    name = "ondemand-autoscale"

    def __init__(self, max_step: int = 8, **kw: Any) -> None:
        kw.setdefault("autoscaler", OnDemandOnlyAutoscaler(max_step=max_step))
        super().__init__(**kw)

    def choose(self, state: ClusterState, run: JobRun) -> Placement | None:
        return place_in_tiers(state, run, [[PoolKind.ONPREM], [PoolKind.ONDEMAND]])


@register("spot-greedy", "preemptible jobs on spot whenever spot can be had, deadlines ignored")
class SpotGreedy(QueueHeuristic):
    """Spot whenever it can be had; the clock is never looked at.

    A preemptible job goes to on-prem (already paid for), else ready spot; if spot
    for it is provisioning or may still be bought, it waits for that spot even when
    an on-demand node is free, because that is what "spot whenever available"
    means. Only when the market sells no more spot (availability or pool maximum)
    does it fall back to on-demand, so a workload always completes. After a reclaim
    the job is requeued like any other and goes back to spot if it can: deadlines
    play no part, which is exactly what ``uniform-progress`` improves on.
    Non-preemptible jobs go to on-prem, then on-demand.

    Order: FIFO with backfill.
    """

    name = "spot-greedy"

    def __init__(self, max_step: int = 8, **kw: Any) -> None:
        kw.setdefault("autoscaler", SpotGreedyAutoscaler(max_step=max_step))
        super().__init__(**kw)

    def choose(self, state: ClusterState, run: JobRun) -> Placement | None:
        if not run.job.preemptible:
            return place_in_tiers(state, run, [[PoolKind.ONPREM], [PoolKind.ONDEMAND]])
        placement = place_in_tiers(state, run, [[PoolKind.ONPREM], [PoolKind.SPOT]])
        if placement is not None or spot_obtainable(state, run):
            return placement
        return place_in_tiers(state, run, [[PoolKind.ONDEMAND]])
