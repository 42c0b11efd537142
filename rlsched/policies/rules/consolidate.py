"""Node consolidation: move the last jobs off a lightly used elastic node so it can be released.

Elastic capacity is paid per node while it is held, but an elastic node is only
returned once it is empty (the engine's idle stop, or a scale-down, which takes only
empty nodes). With many short single-GPU jobs - the Alibaba openb shape - nodes rarely
empty: one long job keeps an 8-GPU node held while seven of its GPUs idle, and
placement alone cannot help once the jobs are running (where the held GPU-hours go:
BENCHMARKS.md, "Node consolidation").

**The rule.** At each decision point, for each elastic pool of whole GPUs that holds at
least one node's worth of free GPUs and whose queue has nothing it could place now
(free GPUs a waiting job could take are not surplus), the least busy ready node is a
*source* if:

* every job on it is preemptible and runs on that node only (gangs stay put);
* every deadline job on it can afford a restart (by the deadline guard's estimates:
  its slack exceeds twice the restart overhead);
* its longest job is believed to need at least ``min_hold_s`` more (otherwise the node
  empties soon on its own - moving would pay restarts for little);
* its jobs fit, largest first, best fit, into the free GPUs of *other* ready nodes of
  the same pool that are at least as busy (so jobs never move to a node that would be
  the next source).

Its jobs are then suspended gracefully (a checkpoint first: each loses only the
restart overhead) and placed on those nodes, and the emptied node is released at once
(unless a node of the pool is still provisioning: a scale-down takes provisioning
nodes first, and cancelling capacity that was just bought is not the point; the idle
stop then returns it; nor below the pool's minimum). One node per pool per decision
point, least busy first and youngest first among equals: under a reclaim model whose
hazard falls with age, old spot nodes are the ones worth keeping.

**Where it does not run.** Spot pools whose market reclaims more than
``max_reclaim_rate_per_h`` (default 0.05 per node-hour, a mean node lifetime under
20 h): every released node is replaced by a fresh one when demand returns, and on such
a market fresh nodes are reclaimed often, so the work lost to reclaims and the mean JCT
rise more than the cost falls (BENCHMARKS.md, "Why not on every spot market"). Nor in MIG and
time-sliced pools (a slice or a replica is not a node's worth of anything), in on-prem
pools (nothing to release), or for jobs without ``preemptible``.

Like the deadline guard it runs before the policy at every decision point, in
training (the environment) and serving alike, when an experiment enables it
(``consolidate:``); a model trained with it carries its parameters
(``consolidate.json``).
"""

from __future__ import annotations

from collections.abc import Iterator

from rlsched.cluster.checkpoint import progress_now
from rlsched.cluster.decisions import Decision, Place, Preempt, Scale
from rlsched.cluster.estimate import believed_work
from rlsched.cluster.feasibility import node_candidates, pool_allows
from rlsched.cluster.model import ClusterState, JobRun, Node, Pool, PoolKind, Sharing
from rlsched.policies.rules.deadline_guard import DeadlineGuard

__all__ = ["Consolidator"]


class Consolidator:
    """Empties and releases lightly used elastic nodes by moving their jobs onto busier ones.

    Args:
        min_hold_s: move a node's jobs only if the longest is believed to need this much more.
        max_reclaim_rate_per_h: leave spot pools whose market reclaims more often than this alone.
        restart_overhead_s: seconds of work a move repeats (the engine's default belief).
    """

    #: its moves pay only when the emptied node is released (see :class:`~rlsched.policies.rules.Rule`)
    releases_nodes = True

    def __init__(self, min_hold_s: float = 900.0, max_reclaim_rate_per_h: float = 0.05,
                 restart_overhead_s: float = 60.0) -> None:
        if min_hold_s < 0 or max_reclaim_rate_per_h < 0 or restart_overhead_s < 0:
            raise ValueError("min_hold_s, max_reclaim_rate_per_h and restart_overhead_s must be >= 0")
        self.min_hold_s = min_hold_s
        self.max_reclaim_rate_per_h = max_reclaim_rate_per_h
        self.restart_overhead_s = restart_overhead_s
        # the deadline guard's rule for "can this job afford a restart" (never acts here)
        self._urgency = DeadlineGuard(restart_overhead_s=restart_overhead_s)
        #: jobs moved so far (for reports)
        self.moves = 0

    def reset(self, state: ClusterState) -> None:
        self.moves = 0

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        """Move the jobs of at most one node per pool; the caller applies each decision as it is yielded."""
        for pool in list(state.pools.values()):
            ready = self._surplus_ready(state, pool)
            if ready is not None:
                yield from self._consolidate(state, pool, ready)

    def _surplus_ready(self, state: ClusterState, pool: Pool) -> list[Node] | None:
        """The pool's ready nodes if it may be consolidated now (None: it may not)."""
        spec = pool.spec
        if not spec.kind.elastic or spec.sharing is not Sharing.EXCLUSIVE or len(pool.nodes) <= spec.min_nodes:
            return None  # (at its minimum, an emptied node could not be released)
        if spec.kind is PoolKind.SPOT:
            q = state.quotes.get(pool.name)
            if q is not None and q.reclaim_rate_per_hour > self.max_reclaim_rate_per_h:
                return None
        ready = [n for n in pool.nodes.values() if n.ready]
        free = sum(n.free_whole for n in ready)
        if len(ready) < 2 or free < spec.gpus_per_node:
            return None
        # free GPUs a waiting job could take now are not surplus
        if any(pool_allows(r.job, spec) and r.job.num_gpus <= free for r in state.queue.values()):
            return None
        return ready

    def _consolidate(self, state: ClusterState, pool: Pool, ready: list[Node]) -> Iterator[Decision]:
        size = pool.spec.gpus_per_node
        sources = sorted((n for n in ready if n.jobs), key=lambda n: (size - n.free_whole, -n.requested_at))
        for src in sources:
            plan = self._plan(state, src, ready)
            if plan is None:
                continue
            for run, target in plan:
                jid = run.job.job_id
                yield Preempt(jid, checkpoint=True, reason=f"consolidation: {src.id} to be released")
                queued = state.queue.get(jid)
                if queued is None:
                    continue  # the caller refused the preemption
                found = node_candidates(target, queued.job, state.time)
                if found:
                    self.moves += 1
                    yield Place(jid, found[0])
            if pool.provisioning_gpus() == 0:  # (above its minimum: _surplus_ready checked)
                yield Scale(pool.name, -1)
            return

    def _plan(self, state: ClusterState, src: Node, ready: list[Node]) -> list[tuple[JobRun, Node]] | None:
        """Where each job on ``src`` would go (None: the node is not a source)."""
        # sorted: a node's jobs are a set, whose order would follow the interpreter's string hashing
        runs = sorted((state.running[j] for j in src.jobs if j in state.running), key=lambda r: r.job.job_id)
        if not runs or len(runs) != len(src.jobs):
            return None
        longest = 0.0
        for run in runs:
            pl = run.placement
            if not run.job.preemptible or pl is None or any(node_id != src.id for node_id, _ in pl.gpus):
                return None
            if run.job.deadline is not None:
                u = self._urgency.urgency(state, run)
                if u is not None and u.slack < 2.0 * self.restart_overhead_s:
                    return None
            progress = progress_now(run, state.time)
            longest = max(longest, believed_work(state.estimator.estimate(run.job), progress) - progress)
        if longest < self.min_hold_s:
            return None
        busy = len(src.gpus) - src.free_whole
        free = {n.id: n.free_whole for n in ready
                if n is not src and len(n.gpus) - n.free_whole >= busy and n.free_whole > 0}
        plan: list[tuple[JobRun, Node]] = []
        for run in sorted(runs, key=lambda r: -r.job.num_gpus):
            n = run.job.num_gpus
            fits = [nid for nid, f in free.items() if f >= n and node_candidates(state.nodes[nid], run.job, state.time)]
            if not fits:
                return None
            best = min(fits, key=lambda nid: (free[nid], nid))
            free[best] -= n
            plan.append((run, state.nodes[best]))
        return plan
