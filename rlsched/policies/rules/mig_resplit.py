"""MIG re-splitting as a rule: idle MIG GPUs are re-split for the queued jobs no instance serves.

A learned policy sees a MIG re-split rarely - a few dozen per thousand placements - and
each decides a fractional workload: a clone that gets the few wrong puts fractional jobs
on whole GPUs or leaves them waiting (BENCHMARKS.md, "Nominated job slots and the
best-follow teacher"). The heuristics all re-split the same way
(:func:`~rlsched.policies.heuristics.queue.mig_reconfigurations`), so the decision is a
rule, not a choice a network must learn: a model trained behind this rule has its
re-split actions masked (the rule *owns* them, :attr:`MigResplit.owns`) and only places.

**The rule.** At each decision point, queued jobs that no pool without MIG can start now
are taken in queue order. For each MIG pool the job may use, its profile is the smallest
that serves it (:func:`~rlsched.cluster.feasibility.profile_for`). Free instances of that
profile, including those of GPUs being re-split right now, are counted out one per job; a
job left without one has one idle, open GPU of the pool re-split to the named layout with
the most instances of its profile (the heuristics' choice of layout). The rule acts before
the policy places anything, so it counts the instances the queue ahead of a job will take,
as a heuristic's pass would have found them taken. At most ``max_per_pass`` GPUs per
decision point, and only idle GPUs (a re-split destroys every instance), so running work is
never disrupted.

Counting in-flight instances is what the heuristics do implicitly (their next pass comes
with the next event, usually the re-split finishing); a rule asked at every decision
point without it would re-split one more GPU each time for the same blocked job.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlsched.cluster.decisions import Decision, Reconfigure
from rlsched.cluster.feasibility import (
    layout_for_profile,
    pool_allows,
    pool_candidates,
    profile_for,
    reconfigure_check,
)
from rlsched.cluster.model import ClusterState, JobRun, Pool, Sharing

__all__ = ["MigResplit"]


def _supply(pool: Pool) -> dict[str, int]:
    """Free instances per profile on the pool's ready, healthy MIG GPUs, counting re-splits in flight."""
    out: dict[str, int] = {}
    for node in pool.nodes.values():
        if not node.ready:
            continue
        for g in node.gpus:
            if not g.healthy or not g.mig:
                continue
            for s in g.slices:
                if s.holder is None:
                    out[s.profile.name] = out.get(s.profile.name, 0) + 1
    return out


def _has_idle_gpu(pool: Pool, now: float) -> bool:
    """Does ``pool`` have a ready node with an idle GPU that is not being re-split?"""
    return any(node.ready and any(g.idle() and g.busy_until <= now for g in node.gpus) for node in pool.nodes.values())


def _idle_gpu(state: ClusterState, pool: Pool, layout: tuple[str, ...]) -> tuple[str, int] | None:
    """An idle, open GPU of ``pool`` that may be re-split to ``layout`` now (least loaded node first)."""
    best: tuple[int, str, int] | None = None
    for node in pool.nodes.values():
        if not node.ready:
            continue
        for g in node.gpus:
            if not g.idle() or g.busy_until > state.time:
                continue
            rank = (len(node.jobs), node.id, g.index)
            if (best is None or rank < best) and reconfigure_check(state, node.id, g.index, layout) is None:
                best = rank
    return None if best is None else (best[1], best[2])


class MigResplit:
    """Re-splits idle MIG GPUs for blocked jobs (see the module doc).

    Args:
        max_per_pass: GPUs re-split per decision point at most.
        scan: queued jobs looked at per decision point at most (queue order).
    """

    #: its decisions pay without any scale-down (see :class:`~rlsched.policies.rules.Rule`)
    releases_nodes = False
    #: the action kinds this rule takes over from a policy trained behind it (masked in its codec)
    owns: frozenset[str] = frozenset({"reconfigure"})

    def __init__(self, max_per_pass: int = 4, scan: int = 256) -> None:
        if max_per_pass < 1 or scan < 1:
            raise ValueError("max_per_pass and scan must be >= 1")
        self.max_per_pass = max_per_pass
        self.scan = scan
        #: GPUs re-split so far (for reports)
        self.resplits = 0

    def reset(self, state: ClusterState) -> None:
        self.resplits = 0

    def _mig_bound(self, state: ClusterState) -> Iterator[JobRun]:
        """The first ``scan`` queued jobs that no pool without MIG can start now, in queue order."""
        now = state.time
        plain = [p for p in state.pools.values() if p.spec.sharing is not Sharing.MIG]
        elsewhere: dict[tuple[object, ...], bool] = {}  # by request shape: equal shapes fit alike
        for i, run in enumerate(state.queue.values()):
            if i >= self.scan:
                return
            ok = elsewhere.get(run.shape)
            if ok is None:
                ok = elsewhere[run.shape] = any(pool_allows(run.job, p.spec)
                                                and pool_candidates(p, run.job, now, first=True) for p in plain)
            if not ok:
                yield run

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        # only pools with an idle GPU can be re-split: on a busy fleet that ends the pass before the queue scan
        mig_pools = [p for p in state.pools.values() if p.spec.sharing is Sharing.MIG and _has_idle_gpu(p, state.time)]
        if not mig_pools or not state.queue:
            return
        supply: dict[str, dict[str, int]] = {}  # pool -> profile -> instances not yet counted out
        done = 0
        for run in self._mig_bound(state):
            for pool in mig_pools:
                prof = profile_for(pool.spec.model, run.job.num_gpus, run.job.gpu_milli)
                if prof is None or not pool_allows(run.job, pool.spec):
                    continue
                free = supply.get(pool.name)
                if free is None:
                    free = supply[pool.name] = _supply(pool)
                if free.get(prof.name, 0) > 0:
                    free[prof.name] -= 1  # an instance, free or on its way, is this job's
                    break
                layout = layout_for_profile(pool.spec.model, prof.name)
                target = None if layout is None else _idle_gpu(state, pool, layout)
                if layout is None or target is None:
                    continue
                yield Reconfigure(target[0], target[1], layout)
                self.resplits += 1
                done += 1
                # counted again as the caller left it (applied: the new instances are on their way and
                # the GPU's old ones gone); one of the new ones is this job's
                free = supply[pool.name] = _supply(pool)
                free[prof.name] = free.get(prof.name, 0) - 1
                break
            if done >= self.max_per_pass:
                return
