"""The heuristic that takes the actions a served model was never trained with.

A model's codec masks every action kind outside its
:class:`~rlsched.envs.trained_actions.TrainedActions` (an on-prem-trained model may
not scale a spot pool or re-split a MIG GPU). Masking alone would leave that capacity
idle: the elastic pools would never be bought, jobs that fit only there would wait
forever. :class:`Complement` closes the gap the way a user of the heuristics expects
it closed: weighted-priority, restricted to what the model does not own -

* it places jobs only in pools the model may not place in (cheapest first, as the
  heuristics do), after the model has placed what it wanted at this decision point;
* it buys nodes (the heuristics' queue autoscaler) only in pools the model may not
  scale up; scale-down is left to the engine's idle stop, as for every heuristic;
* it re-splits idle MIG GPUs for blocked jobs only in pools the model may not
  reconfigure.

Decisions about anything the model owns are dropped, so the two never fight over a
pool. Pools past the codec's ``max_pools`` are outside the model's view, so everything
there is the complement's.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlsched.cluster.decisions import Decision, Place, Reconfigure, Scale, WakeAt
from rlsched.cluster.feasibility import pool_candidates
from rlsched.cluster.model import ClusterState, JobRun, Placement, Sharing
from rlsched.envs.trained_actions import TrainedActions
from rlsched.policies.heuristics import WeightedPriority
from rlsched.policies.heuristics.placement import pools_by_cost


class Complement:
    """Weighted-priority limited to the pools and action kinds a model lacks (see the module doc).

    Args:
        trained: the model's trained action kinds.
        max_pools: the model codec's pool slots (pools past them are the complement's).
        ruled: action kinds the model's rules own (``reconfigure`` under ``mig_resplit``): the
            rules take them, so the complement leaves them alone too.
    """

    name = "complement:weighted-priority"

    def __init__(self, trained: TrainedActions, max_pools: int, ruled: frozenset[str] = frozenset()) -> None:
        self.trained = trained
        self.max_pools = max_pools
        self.ruled = ruled
        #: the heuristic (its settings may be changed, e.g. ``mig_reconfigure`` off in the live service)
        self.heuristic = WeightedPriority(placement=self._place)
        self.place_pools: frozenset[str] = frozenset()
        self.reconfigure_pools: frozenset[str] = frozenset()
        self.scale_up_pools: frozenset[str] = frozenset()

    @property
    def active(self) -> bool:
        """False when the model owns every action the fleet offers (or the rest is switched off)."""
        return bool(self.place_pools or self.scale_up_pools
                    or (self.reconfigure_pools and self.heuristic.mig_reconfigure))

    def _not_owned(self, state: ClusterState, action: str) -> frozenset[str]:
        return frozenset(p.name for i, p in enumerate(state.pools.values())
                         if i >= self.max_pools or not self.trained.allows(action, p.spec.kind))

    def reset(self, state: ClusterState) -> None:
        """Work out, for this fleet, which pools each action kind is the complement's on."""
        pools = state.pools
        self.place_pools = self._not_owned(state, "place")
        self.reconfigure_pools = frozenset() if "reconfigure" in self.ruled else frozenset(
            n for n in self._not_owned(state, "reconfigure") if pools[n].spec.sharing is Sharing.MIG)
        self.scale_up_pools = frozenset(n for n in self._not_owned(state, "scale_up")
                                        if pools[n].spec.kind.elastic)
        self.heuristic.reset(state)

    def _place(self, state: ClusterState, run: JobRun) -> Placement | None:
        """First fit over the complement's pools, cheapest first."""
        for pool in pools_by_cost(state):
            if pool.name in self.place_pools:
                found = pool_candidates(pool, run.job, state.time, first=True)
                if found:
                    return found[0]
        return None

    def owns(self, state: ClusterState, decision: Decision) -> bool:
        """True if ``decision`` is about something the model may not do itself."""
        if isinstance(decision, Place):
            return decision.placement.pool in self.place_pools
        if isinstance(decision, Reconfigure):
            node = state.nodes.get(decision.node_id)
            return node is not None and node.pool in self.reconfigure_pools
        if isinstance(decision, Scale):
            return decision.delta > 0 and decision.pool in self.scale_up_pools
        return isinstance(decision, WakeAt)  # a wake-up for its own next scan; never a preemption

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        """The heuristic's decisions about what the model does not own (none when inactive: no queue scan)."""
        if not self.active:
            return
        for d in self.heuristic.decide(state):
            if self.owns(state, d):
                yield d
