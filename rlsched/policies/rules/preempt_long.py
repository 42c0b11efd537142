"""Long-job preemption: suspend a job believed to need far longer than a blocked short one.

Ordering alone cannot help a short job that arrives when every GPU is held by jobs
that will run for hours: it waits for one of them to finish, whatever the queue order.
Suspension helps only if it survives estimation error, since duration estimates are often
wrong by a factor of a few: this rule holds one belief for every job, queued or running,
and suspends only across a wide gap (measurements: BENCHMARKS.md, "Job ordering headroom
and long-job preemption").

**The rule.** At each decision point, the ``scan`` queued jobs with the least believed
remaining GPU-time (the duration estimate, doubled until it exceeds the progress made:
:func:`~rlsched.cluster.estimate.believed_work`, the belief every rule shares) that fit
a node but cannot start anywhere now are candidates. For each, a running job is a
victim if

* it is ``preemptible``, has no deadline (deadlines belong to the deadline guard), runs
  on whole GPUs of one node of an exclusive pool the candidate may use;
* its believed remaining GPU-time is at least ``factor`` times the candidate's, and
  longer by at least ``min_gain_gpu_s`` or by what its restart costs, whichever is more
  (``restart_overhead_s`` of repeated work on each of its GPUs: the gap must dwarf it;
  with the defaults ``min_gain_gpu_s`` is always the larger on nodes of up to 60 GPUs, so
  the restart term matters where a user's jobs take long to restore).

On the node where the fewest GPUs must be suspended (longest-remaining victims first
among equals), the victims are suspended gracefully - a checkpoint first, so each loses
only its restart overhead - and the candidate is placed there. The victims requeue and
are served by the policy like any other job.

**Why the wide gap.** A victim suspended for a job ``factor`` times shorter cannot
preempt it back, and it cannot be chosen again until some job ``factor`` times shorter
than *its* remaining time arrives - chains are short. A small factor thrashes on
estimated durations; the default 10 is the middle of the range of factors that gain alike
on the training windows, where larger ones only pay fewer restarts (BENCHMARKS.md, the
same section).

It changes nothing for jobs that are not ``preemptible`` (the canonical trace's default),
nothing while capacity is free, and nothing for fractional or MIG requests or gang jobs
larger than a node. Like the other rules it runs in front of the policy in training and
serving alike when an experiment enables it (``preempt_long:``); a model trained with it
carries its parameters (``preempt_long.json``). The shipped ``models/scorer`` is not trained
with it: Philly's canonical table declares no job preemptible, and a model trained with
the jobs declared so leans on the flag (BENCHMARKS.md, the same section).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from rlsched.cluster.checkpoint import progress_now
from rlsched.cluster.decisions import Decision, Place, Preempt
from rlsched.cluster.estimate import believed_work
from rlsched.cluster.feasibility import node_candidates, pool_allows, pool_candidates
from rlsched.cluster.model import ClusterState, JobRun, Sharing
from rlsched.policies.rules.victims import fewest_gpus, held_gpus

__all__ = ["LongJobPreemption"]


class LongJobPreemption:
    """Suspends much longer jobs so that a blocked short job starts now.

    Args:
        factor: a victim's believed remaining GPU-time must be at least this many times the candidate's.
        min_gain_gpu_s: ... and longer than the candidate's by at least this many GPU-seconds.
        scan: candidates considered per decision point (the shortest blocked jobs).
        restart_overhead_s: seconds of work a restart repeats (the engine's default belief); a victim must
            also be longer than the candidate by that much on each of its GPUs.
    """

    #: its decisions pay without any scale-down (see :class:`~rlsched.policies.rules.Rule`)
    releases_nodes = False

    def __init__(self, factor: float = 10.0, min_gain_gpu_s: float = 3600.0, scan: int = 4,
                 restart_overhead_s: float = 60.0) -> None:
        if factor < 1 or min_gain_gpu_s < 0 or scan < 1 or restart_overhead_s < 0:
            raise ValueError("factor must be >= 1, min_gain_gpu_s and restart_overhead_s >= 0, scan >= 1")
        self.factor = factor
        self.min_gain_gpu_s = min_gain_gpu_s
        self.scan = scan
        self.restart_overhead_s = restart_overhead_s
        #: jobs suspended so far (for reports)
        self.preemptions = 0

    def reset(self, state: ClusterState) -> None:
        self.preemptions = 0

    def remaining_gpu_s(self, state: ClusterState, run: JobRun) -> float:
        """Believed remaining GPU-seconds of a queued or running job."""
        p = progress_now(run, state.time)
        return (believed_work(state.estimator.estimate(run.job), p) - p) * run.job.gpu_demand

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        """Suspend victims and place the candidate, for up to ``scan`` blocked short jobs."""
        if not state.queue or not state.running:
            return
        suspendable = self._suspendable(state)
        if not suspendable:
            return
        longest = max(theirs for _, _, theirs in suspendable)
        if longest < self.min_gain_gpu_s:
            return  # no running job is long enough to be worth a restart for anyone
        size = max((p.spec.gpus_per_node for p in state.pools.values()
                    if p.spec.sharing is Sharing.EXCLUSIVE), default=0)
        # Any queued job may be a candidate (only victims must be preemptible); a few more than
        # ``scan`` are ranked, since some of the shortest may fit somewhere already.
        short = heapq.nsmallest(
            self.scan * 4,
            ((self.remaining_gpu_s(state, r), r.job.submit_time, r) for r in state.queue.values()
             if not r.job.fractional and 0 < r.job.num_gpus <= size),
            key=lambda c: (c[0], c[1]),
        )
        fits: dict[object, bool] = {}  # per request shape, until capacity changes
        tried = 0
        for mine, _, run in short:
            if tried >= self.scan:
                return
            if run.job.job_id not in state.queue:
                continue
            shape = run.shape
            if shape not in fits:
                fits[shape] = self._fits_now(state, run)
            if fits[shape]:
                continue
            tried += 1
            if self._threshold(mine) > longest:
                return  # candidates come shortest first: no later one can find a victim either
            room = self._room(state, run, mine, suspendable)
            if room is None:
                continue
            node_id, victims = room
            for v in victims:
                self.preemptions += 1
                yield Preempt(v.job.job_id, checkpoint=True,
                              reason=f"long-job preemption: room for {run.job.job_id}, believed far shorter")
            found = node_candidates(state.nodes[node_id], run.job, state.time)
            if found:
                yield Place(run.job.job_id, found[0])
            gone = {v.job.job_id for v in victims}
            suspendable = [s for s in suspendable if s[0].job.job_id not in gone]
            fits.clear()  # suspensions freed GPUs, the placement took some

    def victims(self, state: ClusterState, run: JobRun) -> tuple[str, list[JobRun]] | None:
        """The node where ``run`` should start and the running jobs to suspend there (None: none qualify)."""
        return self._room(state, run, self.remaining_gpu_s(state, run), self._suspendable(state))

    def _threshold(self, mine: float, victim_gpus: float = 0.0) -> float:
        """The believed remaining GPU-seconds a victim holding ``victim_gpus`` must have at least, for a
        candidate with ``mine`` (with ``victim_gpus`` 0: the least any victim must have)."""
        return max(self.factor * mine, mine + max(self.min_gain_gpu_s, self.restart_overhead_s * victim_gpus))

    def _suspendable(self, state: ClusterState) -> list[tuple[JobRun, str, float]]:
        """Running jobs this rule may suspend: ``(run, its node, believed remaining GPU-seconds)``.

        Preemptible, no deadline, whole GPUs of one node of an exclusive pool. Computed once
        per decision point: every candidate filters the same list.
        """
        out = []
        for other in state.running.values():
            ojob, pl = other.job, other.placement
            if not ojob.preemptible or ojob.deadline is not None or pl is None or pl.slice_start is not None:
                continue
            if ojob.fractional or state.pools[pl.pool].spec.sharing is not Sharing.EXCLUSIVE:
                continue
            nodes = {node_id for node_id, _ in pl.gpus}
            if len(nodes) == 1:
                out.append((other, next(iter(nodes)), self.remaining_gpu_s(state, other)))
        return out

    @staticmethod
    def _fits_now(state: ClusterState, run: JobRun) -> bool:
        return any(pool_candidates(pool, run.job, state.time, first=True) for pool in state.pools.values())

    def _room(self, state: ClusterState, run: JobRun, mine: float,
              suspendable: list[tuple[JobRun, str, float]]) -> tuple[str, list[JobRun]] | None:
        """Among nodes of pools ``run`` may use, the one where the fewest GPUs of jobs long enough to be
        victims of a candidate with ``mine`` (:meth:`_threshold`) must be suspended (then fewest jobs,
        then the longest)."""
        job = run.job
        rooms: dict[str, list[tuple[JobRun, float]]] = {}
        for other, node_id, theirs in suspendable:
            if theirs < self._threshold(mine, other.job.gpu_demand):
                continue
            assert other.placement is not None
            spec = state.pools[other.placement.pool].spec
            if pool_allows(job, spec) and job.num_gpus <= spec.gpus_per_node:
                rooms.setdefault(node_id, []).append((other, theirs))
        best: tuple[str, list[JobRun]] | None = None
        best_key: tuple[float, ...] | None = None
        for node_id, eligible in sorted(rooms.items()):
            chosen = fewest_gpus(eligible, job.num_gpus - state.nodes[node_id].free_whole)
            if not chosen:
                continue
            key = (float(sum(held_gpus(v) for v in chosen)), float(len(chosen)), -min(s for _, s in chosen))
            if best_key is None or key < best_key:
                best, best_key = (node_id, [r for r, _ in chosen]), key
        return best
