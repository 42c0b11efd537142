"""The skeleton every queue heuristic shares, and dynamic MIG re-splitting for blocked jobs.

Heuristics share one skeleton (:class:`QueueHeuristic`): order the queue, place
each job with a placement rule, and (on clusters with elastic pools) ask an
autoscaler for capacity for what could not be placed. They differ in the order
(FIFO, SJF, weighted priority, LAS, fair share), the placement rule (first-fit,
best-fit, fragmentation-aware) and the scaling rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rlsched.cluster.decisions import Decision, Place, Reconfigure, WakeAt
from rlsched.cluster.feasibility import (
    has_free_capacity,
    layout_for_profile,
    pool_allows,
    profile_for,
    reconfigure_check,
)
from rlsched.cluster.model import ClusterState, JobRun, NodeStatus, Placement, Pool, Sharing
from rlsched.policies.heuristics.autoscale import QueueAutoscaler
from rlsched.policies.heuristics.placement import PlacementRule, first_fit


class QueueHeuristic:
    """Order the queue, place what fits, ask for capacity for the rest.

    Subclasses override :meth:`order` (and optionally :meth:`extra_decisions`).
    ``backfill=False`` stops at the first job that does not fit (strict order, as
    plain FIFO); with ``backfill=True`` later jobs that fit go ahead.

    Within one pass capacity only shrinks, so a request shape that failed once is
    not tried again in the same pass - this keeps a pass over a long queue cheap.
    """

    name: str = "queue"
    backfill: bool = True
    #: blocked jobs (in order) the autoscaler sizes capacity for, per pass.
    scale_scan: int = 256
    #: blocked jobs the :meth:`extra_decisions` hook needs (e.g. preemption).
    blocked_needed: int = 0
    #: seconds between two autoscaler scans of the queue.
    scale_interval_s: float = 30.0
    #: reconfigure idle MIG GPUs for blocked jobs whose profile has no free instance (dynamic MIG).
    mig_reconfigure: bool = True
    #: replayed exactly as written: the engine's loop breaker (rlsched.cluster.loop_detector) does not
    #: watch it - a heuristic is a baseline and the fallback itself (FIFO's dynamic MIG re-splits one
    #: GPU hundreds of times while its head job waits; that is FIFO's result, not a hand-over's).
    loop_exempt: bool = True

    def __init__(self, *, placement: PlacementRule = first_fit, autoscaler: QueueAutoscaler | None = None,
                 backfill: bool | None = None) -> None:
        self.placement = placement
        self.autoscaler = autoscaler or QueueAutoscaler()
        if backfill is not None:
            self.backfill = backfill
        self._elastic = False
        self._mig = False
        self._next_scale = -float("inf")

    def reset(self, state: ClusterState) -> None:
        self._elastic = any(p.spec.kind.elastic for p in state.pools.values())
        self._mig = self.mig_reconfigure and any(p.spec.sharing is Sharing.MIG for p in state.pools.values())
        self._next_scale = -float("inf")
        self.autoscaler.reset(state)

    def order(self, state: ClusterState) -> Iterable[JobRun]:
        """Queued jobs in the order this policy serves them (default: submission order)."""
        return list(state.queue.values())

    def choose(self, state: ClusterState, run: JobRun) -> Placement | None:
        """Where ``run`` goes now, or None if it does not fit anywhere."""
        return self.placement(state, run)

    def extra_decisions(self, state: ClusterState, blocked: list[JobRun]) -> Iterator[Decision]:
        """Hook for preemption and the like, after the placement pass."""
        return iter(())

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        if not state.queue:
            if self._elastic and state.demand_forecast and state.time >= self._next_scale:
                # Nothing waits, but a forecast may call for capacity ahead of the arrivals.
                self._next_scale = state.time + self.scale_interval_s
                yield from self.autoscaler.decide(state, [])
            return
        # Blocked jobs are collected for the autoscaler and for preemption hooks, up to a cap.
        # The autoscaler looks at the queue every ``scale_interval_s`` (like a cluster autoscaler's
        # scan period), not at every event: sizing capacity needs a view, not a reflex.
        scale_now = self._elastic and state.time >= self._next_scale
        cap = max(self.scale_scan if scale_now else 0, self.blocked_needed, 8 if self._mig else 0)
        failed: set[tuple[object, ...]] = set()
        blocked: list[JobRun] = []
        n_shapes = len(state.queue_shapes)
        can_place = has_free_capacity(state)
        # Lazily: an order may be a generator that reads the state after each placement.
        for run in self.order(state):
            job = run.job
            if job.job_id not in state.queue:
                continue
            if not can_place or len(failed) >= n_shapes:
                # Nothing else can start in this pass; only collect what is blocked.
                if len(blocked) >= cap:
                    break
                blocked.append(run)
                continue
            shape = run.shape
            if shape in failed:
                if len(blocked) < cap:
                    blocked.append(run)
                continue
            placement = self.choose(state, run)
            if placement is None:
                failed.add(shape)
                if len(blocked) < cap:
                    blocked.append(run)
                if not self.backfill:
                    can_place = False
                continue
            yield Place(job.job_id, placement)
        if blocked:
            if self.mig_reconfigure:
                yield from mig_reconfigurations(state, blocked)
            yield from self.extra_decisions(state, blocked)
            if scale_now:
                self._next_scale = state.time + self.scale_interval_s
                yield from self.autoscaler.decide(state, blocked)
        elif scale_now and state.demand_forecast:
            # Nothing is blocked, but a forecast may call for capacity ahead of the arrivals.
            self._next_scale = state.time + self.scale_interval_s
            yield from self.autoscaler.decide(state, blocked)
        if self._elastic and not scale_now and state.queue and not state.running and not any(
            n.status is NodeStatus.PROVISIONING for n in state.nodes.values()
        ):
            # Jobs wait, the scan was skipped and nothing else will wake us: look again soon.
            yield WakeAt(self._next_scale)


def mig_reconfigurations(state: ClusterState, blocked: list[JobRun]) -> Iterator[Decision]:
    """Dynamic MIG: re-split idle GPUs for blocked jobs whose profile no free instance offers.

    For each blocked fractional (or whole-GPU) request on a MIG pool, if no free
    instance of its profile exists, one idle MIG GPU of that pool is reconfigured
    to the named layout with the most instances of the profile. At most one GPU per
    (pool, profile) per pass, and only idle GPUs (a layout change destroys every
    instance), so running work is never disrupted.
    """
    done: set[tuple[str, str]] = set()
    mig_pools = [p for p in state.pools.values() if p.spec.sharing is Sharing.MIG]
    if not mig_pools:
        return
    for run in blocked:
        for pool in mig_pools:
            if not pool_allows(run.job, pool.spec):
                continue
            prof = profile_for(pool.spec.model, run.job.num_gpus, run.job.gpu_milli)
            if prof is None or (pool.name, prof.name) in done:
                continue
            done.add((pool.name, prof.name))
            if _has_free_instance(pool, prof.name, state.time):
                continue
            layout = layout_for_profile(pool.spec.model, prof.name)
            if layout is None:
                continue
            for node in pool.nodes.values():
                if not node.ready:
                    continue
                target = next((g for g in node.gpus if g.idle() and g.busy_until <= state.time
                               and reconfigure_check(state, node.id, g.index, layout) is None), None)
                if target is not None:
                    yield Reconfigure(node.id, target.index, layout)
                    break
            else:
                continue
            break


def _has_free_instance(pool: Pool, profile: str, now: float) -> bool:
    for node in pool.nodes.values():
        if not node.ready:
            continue
        for g in node.gpus:
            if g.busy_until > now or not g.healthy:
                continue
            for s in g.slices:
                if s.holder is None and s.profile.name == profile:
                    return True
    return False
