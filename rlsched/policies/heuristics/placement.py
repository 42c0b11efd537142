"""Placement rules: which of the legal places a job goes to.

All candidates come from :mod:`rlsched.cluster.feasibility`; a rule only ranks
them. Pools are tried in cost order: on-prem first (already paid for), then
elastic pools by current price per GPU-hour, so a spot pool is preferred to an
on-demand one when the job may use it.
"""

from __future__ import annotations

from collections.abc import Callable

from rlsched.cluster.feasibility import pool_candidates, profile_for
from rlsched.cluster.model import ClusterState, JobRun, Node, Placement, Pool, PoolKind, Sharing

PlacementRule = Callable[[ClusterState, JobRun], Placement | None]


def pools_by_cost(state: ClusterState) -> list[Pool]:
    """Pools in the order a cost-conscious placement tries them."""

    def key(pool: Pool) -> tuple[int, float, str]:
        if pool.spec.kind is PoolKind.ONPREM:
            return (0, 0.0, pool.name)
        q = state.quotes.get(pool.name)
        return (1, q.price_per_gpu_hour if q else 0.0, pool.name)

    return sorted(state.pools.values(), key=key)


def first_fit(state: ClusterState, run: JobRun) -> Placement | None:
    """The first legal place in the cheapest pool that has one."""
    for pool in pools_by_cost(state):
        found = pool_candidates(pool, run.job, state.time, first=True)
        if found:
            return found[0]
    return None


def leftover(state: ClusterState, placement: Placement) -> float:
    """Capacity left on the touched node after the placement (smaller = tighter)."""
    node = state.nodes[placement.gpus[0][0]]
    if placement.slice_start is not None:
        gi = placement.gpus[0][1]
        gpu = node.gpus[gi]
        free_on_gpu = sum(s.profile.compute_slices for s in gpu.slices if s.holder is None)
        free_elsewhere = sum(
            s.profile.compute_slices for g in node.gpus if g is not gpu for s in g.slices if s.holder is None
        )
        return free_on_gpu * 100 + free_elsewhere / 100
    if node.gpus[0].sharing is Sharing.TIMESLICE:
        return sum(g.replicas - len(g.holders) for g in node.gpus)
    return float(node.free_whole - len([g for g in placement.gpus if g[0] == node.id]))


def best_fit(state: ClusterState, run: JobRun) -> Placement | None:
    """The legal place that leaves the least capacity on its node (and GPU, for MIG).

    Pools are still tried in cost order: best-fit ranks places within the
    cheapest pool that can take the job.
    """
    for pool in pools_by_cost(state):
        found = pool_candidates(pool, run.job, state.time)
        if found:
            return min(found, key=lambda p: leftover(state, p))
    return None


class FragmentationAware:
    """FGD-style placement (Weng et al., ATC'23): grow fragmentation the least.

    A node's fragmentation, for a workload of request shapes with popularity
    ``p_t``, is the expected free GPU capacity that a request of each shape could
    NOT use: free GPUs on a node with fewer than ``n`` free GPUs are useless to an
    ``n``-GPU request; free MIG instances of another profile are useless to a
    fractional request. Each job goes where fragmentation grows least. The shape
    popularity is an exponentially weighted count of recent arrivals, so it
    follows the workload instead of being fixed.
    """

    def __init__(self, decay: float = 0.999) -> None:
        self.decay = decay
        self.popularity: dict[tuple[int, int], float] = {}
        self._seen: set[str] = set()

    def _observe(self, state: ClusterState) -> None:
        for run in state.queue.values():
            jid = run.job.job_id
            if jid in self._seen:
                continue
            self._seen.add(jid)
            for k in self.popularity:
                self.popularity[k] *= self.decay
            key = (run.job.num_gpus, run.job.gpu_milli if run.job.fractional else 1000)
            self.popularity[key] = self.popularity.get(key, 0.0) + 1.0

    def _node_frag(self, node: Node) -> float:
        total = sum(self.popularity.values()) or 1.0
        frag = 0.0
        if node.gpus and node.gpus[0].sharing is Sharing.MIG:
            for (n, milli), w in self.popularity.items():
                prof = profile_for(node.gpus[0].model, n, milli)
                unusable = 0.0
                for g in node.gpus:
                    for s in g.slices:
                        if s.holder is None and (prof is None or s.profile is not prof):
                            unusable += s.profile.fraction
                frag += w / total * unusable
            return frag
        free = node.free_whole
        for (n, _milli), w in self.popularity.items():
            if free < n:
                frag += w / total * free
        return frag

    def __call__(self, state: ClusterState, run: JobRun) -> Placement | None:
        self._observe(state)
        for pool in pools_by_cost(state):
            found = pool_candidates(pool, run.job, state.time)
            if not found:
                continue
            if len(found) == 1:
                return found[0]
            return min(found, key=lambda p: self._delta(state, run, p))
        return None

    def _delta(self, state: ClusterState, run: JobRun, placement: Placement) -> float:
        node = state.nodes[placement.gpus[0][0]]
        before = self._node_frag(node)
        # Tentatively take the resources, measure, give them back.
        touched = []
        if placement.slice_start is not None:
            gpu = node.gpus[placement.gpus[0][1]]
            for s in gpu.slices:
                if s.start == placement.slice_start:
                    s.holder = "?"
                    touched.append(s)
            after = self._node_frag(node)
            for s in touched:
                s.holder = None
        else:
            n_here = sum(1 for nid, _ in placement.gpus if nid == node.id)
            node.free_whole -= n_here
            after = self._node_frag(node)
            node.free_whole += n_here
        return after - before + leftover(state, placement) * 1e-6
