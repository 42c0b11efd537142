"""Tiresias, discretised two-dimensional least-attained-service (Gu et al., NSDI'19).

The algorithm, as the paper describes it and the authors' public simulator
(github.com/SymbioticLab/Tiresias, ``simulator/run_sim.py``, ``dlas_sim_jobs`` with
``gputime=True``) implements it:

* **Attained service** is GPU-time: GPUs x seconds a job has run (across all its runs).
  Tiresias needs no duration estimate.
* **Discretised queues.** ``thresholds`` ``T1 < T2 < ...`` (GPU-seconds) split jobs into
  ``K = len(thresholds) + 1`` queues: a job is in queue ``k`` when ``k`` thresholds are
  <= its attained service. Every new job starts in queue 0 (the highest priority) and
  is demoted as it crosses thresholds while it runs.
* **Order.** Lower queues first; within a queue, running jobs keep their GPUs ahead of
  waiting ones (no preemption inside a queue) and waiting jobs are served FIFO, by
  submission - or, for a job promoted back to queue 0, by the time of its promotion
  (it joins the tail of queue 0, as in the simulator). Jobs that do not fit are skipped
  (a later job that fits starts), as in the simulator.
* **Preemption.** A waiting job preempts running jobs of *strictly lower* priority
  (higher queues) when that makes room for it: any preemptible job on whole GPUs,
  multi-node gangs included, the lowest-priority ones first. The room is a node for a
  job that fits a node and the pool's gang rule for a larger job
  (:class:`~rlsched.cluster.model.GangMode`: whole free nodes plus one node for the
  remainder by default). Preempted jobs checkpoint and requeue with their attained
  service; each restart repeats the world's restart overhead
  (``SimConfig.restart_overhead_s``). Jobs not declared ``preemptible``, MIG and
  time-sliced placements are never preempted (the project's rule for every preempting
  policy; Tiresias' simulator preempts everything).
* **Starvation promotion (PromoteKnob).** A waiting job that has run before and sits
  below queue 0 is promoted back to queue 0 once the time it has waited since it first
  ran (or since its last promotion) reaches ``promote_knob`` x the time it has run
  since then; its attained service counts from zero again for the queue it is in
  (``last_pending_time >= executed_time * solve_starvation`` in the simulator).
  ``promote_knob = 0`` turns promotion off.

Defaults are the authors' simulator's (``simulator/jobs.py``: three queues,
``queue_limit = [3250, 7200, ...]`` GPU-seconds; the ``dlas-gpu`` run uses
``solve_starvation = 0``, promotion off). The paper's own values for its testbed
runs are not verified here. ``benchmarks/tiresias_sensitivity.py`` measures how much
they matter on Philly windows (BENCHMARKS.md).

Cost per decision point: the levels of running jobs and of jobs that have run
before (O(running + preempted)), a lazy walk of the queue in priority order that
stops once nothing more can start and no lower-priority victim is left, and one
victim search per request shape (a shape that found no room cannot find one later in
the same pass: the room a later, lower-priority job could make only shrinks). There is
no cap on how many jobs may preempt per decision point.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from collections.abc import Iterable, Iterator, Sequence

from rlsched.cluster.decisions import Decision, Place, Preempt, WakeAt
from rlsched.cluster.feasibility import fits_pool_spec, gang_shape, has_free_capacity
from rlsched.cluster.model import ClusterState, GangMode, JobRun, NodeStatus, Placement, Pool, RunState, Sharing
from rlsched.policies.heuristics.queue import QueueHeuristic, mig_reconfigurations
from rlsched.policies.registry import register

#: queue thresholds in GPU-seconds: the Tiresias simulator's ``queue_limit`` for three queues.
DEFAULT_THRESHOLDS: tuple[float, ...] = (3250.0, 7200.0)
#: PromoteKnob: 0 = no starvation promotion (the simulator's ``dlas-gpu`` default).
DEFAULT_PROMOTE_KNOB = 0.0
#: attained service within this many GPU-seconds of a threshold counts as past it (float rounding
#: of the wake-up time must not leave a job one ulp short of its demotion).
_EPS = 1e-6

# A victim's rank: larger = lower priority = preempted first.
_Rank = tuple[int, float, str]


@register("tiresias", "Tiresias 2D-LAS: least attained GPU-time first in discretised queues, starvation promotion, "
                      "preemption of preemptible jobs (gangs too)")
class Tiresias(QueueHeuristic):
    """Discretised 2D-LAS with starvation promotion and gang-aware preemption (see the module doc).

    Args:
        thresholds: queue boundaries in GPU-seconds of attained service (any order;
            empty = one queue, i.e. FIFO with backfill and no preemption).
        promote_knob: PromoteKnob; a job waiting >= knob x its run time since its last
            promotion goes back to queue 0 (0 = never).
        preempt: preempt lower-priority jobs for a waiting one (False: order only).

    Per-run memory is incremental: the jobs seen running at the last decision point,
    their queues, a heap of their next threshold crossings, the queued jobs that have run
    before (per queue, in FIFO order) and a heap of their promotion times. Each decision
    point reconciles it with the state by two set differences over the running jobs.
    """

    name = "tiresias"

    def __init__(self, thresholds: Sequence[float] | float = DEFAULT_THRESHOLDS,
                 promote_knob: float = DEFAULT_PROMOTE_KNOB, preempt: bool = True, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        raw = (thresholds,) if isinstance(thresholds, (int, float)) else tuple(thresholds)
        try:
            ths = tuple(sorted(float(t) for t in raw))
            knob = float(promote_knob)
        except (TypeError, ValueError):
            raise ValueError(f"thresholds must be numbers and promote_knob a number, got {thresholds!r}, "
                             f"{promote_knob!r}") from None
        if any(not math.isfinite(t) or t <= 0 for t in ths) or len(set(ths)) != len(ths):
            raise ValueError(f"thresholds must be distinct positive GPU-seconds, got {list(raw)}")
        if not math.isfinite(knob) or knob < 0:
            raise ValueError(f"promote_knob must be >= 0 (0 = no promotion), got {promote_knob}")
        self.thresholds = ths
        self.promote_knob = knob
        self.preempt = bool(preempt)
        self._reset_memory()

    def _reset_memory(self) -> None:
        levels = len(self.thresholds) + 1
        self._base: dict[str, float] = {}  # attained GPU-s at the last promotion (its queue counts from there)
        self._pend_mark: dict[str, float] = {}  # total queued s at the last promotion (its waiting counts from there)
        self._entry: dict[str, float] = {}  # place in its queue: submission, or time of its last promotion
        self._ver: dict[str, int] = {}  # bumped at every start, stop and promotion (stale heap entries)
        self._level: dict[str, int] = {}  # queue of a tracked job (running or returned)
        self._running: dict[str, JobRun] = {}  # running at the last decision point
        self._placed: dict[str, Placement | None] = {}  # their placements then
        self._victimish: set[str] = set()  # of those, preemptible on whole GPUs of an exclusive pool
        self._rank_of: dict[str, _Rank] = {}  # their ranks (see _rank)
        self._count = [0] * levels  # victimish jobs per queue
        self._on_node: dict[str, dict[str, int]] = {}  # node -> {victimish job: its GPUs there}
        self._cross: list[tuple[float, str, int]] = []  # next threshold crossing of victimish jobs
        self._returned: list[list[tuple[float, str]]] = [[] for _ in range(levels)]  # queued, have run: (entry, id)
        self._returned_run: dict[str, JobRun] = {}
        self._promo: list[tuple[float, str, int]] = []  # when returned jobs below queue 0 get promoted
        self._wake_at = -math.inf
        self._stray = False  # a job ran and stopped between two decision points unseen (see _walk)
        self._whole_only = False  # every pool exclusive (set by reset)
        self._by_node: dict[str, list[tuple[str, int]]] = {}  # this pass: node -> candidates, lowest priority first
        self._ranked: list[str] | None = None  # this pass: every candidate, lowest priority first

    def reset(self, state: ClusterState) -> None:
        super().reset(state)
        self._reset_memory()
        self._whole_only = all(p.spec.sharing is Sharing.EXCLUSIVE for p in state.pools.values())

    def _can_place(self, state: ClusterState) -> bool:
        """Whether any GPU, instance or replica is free (a free-GPU count per node when every pool is exclusive)."""
        if self._whole_only:
            return any(n.free_whole > 0 and n.status is NodeStatus.READY for n in state.nodes.values())
        return has_free_capacity(state)

    # ------------------------------------------------------------------ levels
    def attained(self, state: ClusterState, run: JobRun) -> float:
        """GPU-seconds ``run`` has received so far (its current run included)."""
        if run.placement is not None:
            return run.attained + (state.time - run.started_at) * run.job.gpu_demand
        return run.attained

    def level(self, state: ClusterState, run: JobRun) -> int:
        """The queue ``run`` is in now: thresholds at or below its attained service since its last promotion."""
        return bisect_right(self.thresholds, self.attained(state, run) - self._base.get(run.job.job_id, 0.0) + _EPS)

    def _bump(self, jid: str) -> int:
        v = self._ver.get(jid, 0) + 1
        self._ver[jid] = v
        return v

    def _track_running(self, state: ClusterState, run: JobRun) -> None:
        jid = run.job.job_id
        self._running[jid] = run
        self._placed[jid] = run.placement
        lvl = self._level[jid] = self.level(state, run)
        ver = self._bump(jid)
        pl = run.placement
        if not run.job.preemptible or pl is None or pl.slice_start is not None:
            return
        if state.pools[pl.pool].spec.sharing is not Sharing.EXCLUSIVE:
            return
        self._victimish.add(jid)
        self._rank_of[jid] = (lvl, run.job.submit_time, jid)
        self._count[lvl] += 1
        for node_id, _ in pl.gpus:
            held = self._on_node.setdefault(node_id, {})
            held[jid] = held.get(jid, 0) + 1
        if lvl < len(self.thresholds):
            a = self.attained(state, run) - self._base.get(jid, 0.0)
            t = state.time + (self.thresholds[lvl] - a) / max(run.job.gpu_demand, 1e-9)
            heapq.heappush(self._cross, (t, jid, ver))

    def _untrack_running(self, jid: str) -> JobRun:
        run = self._running.pop(jid)
        pl = self._placed.pop(jid)  # where it was tracked (it may have moved since)
        if jid in self._victimish:
            self._victimish.discard(jid)
            del self._rank_of[jid]
            self._count[self._level[jid]] -= 1
            for node_id, held in list(self._on_node.items()) if pl is None else (
                    (n, self._on_node[n]) for n in dict.fromkeys(n for n, _ in pl.gpus)):
                held.pop(jid, None)
                if not held:
                    del self._on_node[node_id]
        return run

    def _waited_since_run(self, state: ClusterState, run: JobRun) -> float:
        """Seconds ``run`` (queued) has waited since it first ran or was last promoted."""
        total = run.queued_s + (state.time - run.enqueued_at)
        mark = self._pend_mark.get(run.job.job_id)
        if mark is None:
            first = run.first_start if run.first_start is not None else state.time
            mark = first - run.job.submit_time  # the wait before its first run does not count
        return total - mark

    def _add_returned(self, state: ClusterState, run: JobRun) -> None:
        jid = run.job.job_id
        lvl = self._level[jid] = self.level(state, run)
        ver = self._bump(jid)
        insort(self._returned[lvl], (self._entry.get(jid, run.job.submit_time), jid))
        self._returned_run[jid] = run
        if self.promote_knob > 0 and lvl > 0:
            executed = (run.attained - self._base.get(jid, 0.0)) / max(run.job.gpu_demand, 1e-9)
            due = state.time + self.promote_knob * executed - self._waited_since_run(state, run)
            heapq.heappush(self._promo, (due, jid, ver))

    def _remove_returned(self, jid: str) -> None:
        run = self._returned_run.pop(jid, None)
        if run is not None:
            self._returned[self._level[jid]].remove((self._entry.get(jid, run.job.submit_time), jid))

    def _forget(self, jid: str) -> None:
        for d in (self._base, self._pend_mark, self._entry, self._ver, self._level):
            d.pop(jid, None)

    def _sync(self, state: ClusterState, moves: bool = True) -> None:
        """Reconcile the memory with the state: starts, stops, demotions and due promotions.

        ``moves``: also look for jobs stopped and started again since they were tracked (only
        another rule can do that; within one of this policy's passes a suspended job is not
        walked again, so the end-of-pass reconciliation skips the look).
        """
        running = state.running
        if self._running.keys() != running.keys():
            for jid in sorted(self._running.keys() - running.keys()):  # sorted: set order follows string hashing
                run = self._untrack_running(jid)
                if run.state is RunState.QUEUED:
                    self._add_returned(state, run)
                else:
                    self._forget(jid)
            for jid in sorted(running.keys() - self._running.keys()):
                self._remove_returned(jid)
                self._track_running(state, running[jid])
        if moves:
            placed = self._placed
            moved = [jid for jid, run in running.items() if placed[jid] is not run.placement]
            for jid in sorted(moved):  # stopped and started again since it was tracked
                self._track_running(state, self._untrack_running(jid))
        now = state.time
        cross = self._cross
        while cross and cross[0][0] <= now:
            _, jid, ver = heapq.heappop(cross)
            if self._ver.get(jid) == ver and jid in self._running:
                self._track_running(state, self._untrack_running(jid))  # its new queue and next crossing
        promo = self._promo
        while promo and promo[0][0] <= now:
            _, jid, ver = heapq.heappop(promo)
            if self._ver.get(jid) == ver and jid in self._returned_run:
                run = self._returned_run[jid]
                self._remove_returned(jid)
                self._base[jid] = run.attained
                self._pend_mark[jid] = run.queued_s + (now - run.enqueued_at)
                self._entry[jid] = now
                self._add_returned(state, run)  # queue 0, at its tail

    def _cannot_fit(self, state: ClusterState) -> set[tuple[object, ...]]:
        """Queued request shapes too large for the free GPUs right now (a necessary-condition test).

        A shape that fits one node needs a node with as many free GPUs; a larger one at least
        ``n // G`` free whole nodes (whole-nodes gangs) and ``n`` free GPUs in one pool. Only
        for clusters of exclusive pools (otherwise: the empty set). These shapes count as
        already failed, so a pass stops walking the queue once every other shape has failed.
        """
        if not self._whole_only:
            return set()
        caps = []
        for pool in state.pools.values():
            size = pool.spec.gpus_per_node
            most = whole = total = 0
            for nd in pool.nodes.values():
                if nd.status is NodeStatus.READY:
                    f = nd.free_whole
                    total += f
                    most = max(most, f)
                    whole += f == size
            caps.append((size, most, whole, total, pool.spec.gang is GangMode.WHOLE_NODES))
        out = set()
        for shape in state.queue_shapes:
            n = shape[0]
            assert isinstance(n, int)
            if not any((n <= most) if n <= size else (total >= n and (not whole_rule or whole >= n // size))
                       for size, most, whole, total, whole_rule in caps):
                out.add(shape)
        return out

    def _next_wake(self, state: ClusterState) -> float:
        """The next demotion of a running candidate victim or promotion of a waiting job (inf: none)."""
        nxt = math.inf
        for heap, alive in ((self._cross, self._running), (self._promo, self._returned_run)):
            while heap and (self._ver.get(heap[0][1]) != heap[0][2] or heap[0][1] not in alive):
                heapq.heappop(heap)
            if heap:
                nxt = min(nxt, heap[0][0])
        return nxt

    # ------------------------------------------------------------------ order
    def order(self, state: ClusterState) -> Iterable[JobRun]:
        """Queued jobs in Tiresias' order: by queue, FIFO within a queue (lazily)."""
        self._sync(state)
        return (run for _, run in self._walk(state))

    def _walk(self, state: ClusterState) -> Iterator[tuple[int, JobRun]]:
        """``(queue, job)`` for every queued job, queue 0 first, FIFO within a queue.

        Queue 0 merges the jobs that never ran (the state's queue, in submission order)
        with returned jobs still in queue 0. A job that ran and stopped between two
        decision points without being seen running is registered here and served from the
        next decision point on (a wake-up is asked for).
        """
        queued = list(state.queue.values())  # a copy: placements dequeue jobs while this is read
        returned = self._returned_run
        stray: list[JobRun] = []

        def fresh() -> Iterator[tuple[float, JobRun]]:
            for r in queued:
                if r.first_start is None:
                    yield r.job.submit_time, r
                elif r.job.job_id not in returned:
                    stray.append(r)

        top = [(entry, returned[jid]) for entry, jid in self._returned[0]]
        if top:
            for _, run in heapq.merge(fresh(), top, key=lambda p: p[0]):
                yield 0, run
        else:
            for r in queued:
                if r.first_start is None:
                    yield 0, r
                elif r.job.job_id not in returned:
                    stray.append(r)
        for r in stray:
            self._add_returned(state, r)
            self._stray = True
        for lvl in range(1, len(self._returned)):
            for _, jid in list(self._returned[lvl]):
                back = returned.get(jid)
                if back is not None and self._level.get(jid) == lvl:
                    yield lvl, back

    # ------------------------------------------------------------------ decisions
    def decide(self, state: ClusterState) -> Iterator[Decision]:
        if not state.queue:
            yield from super().decide(state)  # nothing waits: the base class's forecast scaling only
            return
        now = state.time
        self._sync(state)
        self._stray = False
        left = list(self._count)  # candidate victims per queue, less those suspended in this pass
        max_level = max((lvl for lvl in range(len(left)) if left[lvl] > 0), default=-1) if self.preempt else -1
        gone: set[str] = set()
        scale_now = self._elastic and now >= self._next_scale
        cap = max(self.scale_scan if scale_now else 0, 8 if self._mig else 0)
        failed: set[tuple[object, ...]] = self._cannot_fit(state)
        no_room: set[tuple[object, ...]] = set()
        blocked: list[JobRun] = []
        n_shapes = len(state.queue_shapes)
        can_place = self._can_place(state)
        self._by_node = {}
        self._ranked = None
        acted = False  # placed or suspended anything: the running set changed
        for lvl, run in self._walk(state):
            job = run.job
            if job.job_id not in state.queue:
                continue
            shape = run.shape
            if can_place and shape not in failed and len(failed) < n_shapes:
                placement = self.choose(state, run)
                if placement is not None:
                    acted = True
                    yield Place(job.job_id, placement)
                    continue
                failed.add(shape)
            if lvl < max_level and shape not in no_room:
                chosen = self._room_for(state, run, lvl, gone)
                if chosen is None:
                    no_room.add(shape)
                else:
                    acted = True
                    for v in chosen:
                        gone.add(v.job.job_id)
                        left[self._level[v.job.job_id]] -= 1
                        yield Preempt(v.job.job_id, reason=f"tiresias: preempted for {job.job_id}", checkpoint=True)
                    while max_level >= 0 and left[max_level] == 0:
                        max_level -= 1
                    placement = self.choose(state, run)
                    if placement is not None:
                        yield Place(job.job_id, placement)
                        if self._can_place(state):  # a victim left GPUs over: shapes may fit again
                            can_place = True
                            failed = self._cannot_fit(state)
                            n_shapes = len(state.queue_shapes)  # the victims' shapes are queued now
                        continue
            if len(blocked) < cap:
                blocked.append(run)
            done_placing = not can_place or len(failed) >= n_shapes
            done_preempting = lvl >= max_level or len(no_room) >= n_shapes
            if done_placing and done_preempting and len(blocked) >= cap:
                break
        if blocked:
            if self.mig_reconfigure:
                yield from mig_reconfigurations(state, blocked)
            if scale_now:
                self._next_scale = now + self.scale_interval_s
                yield from self.autoscaler.decide(state, blocked)
        if self._elastic and not scale_now and state.queue and not state.running and not any(
            n.status is NodeStatus.PROVISIONING for n in state.nodes.values()
        ):
            yield WakeAt(self._next_scale)
        if acted:
            self._sync(state, moves=False)  # what this pass started and stopped: demotions, promotions to wake for
        wake = now + 1.0 if self._stray else self._next_wake(state)
        if now < wake < math.inf and not (now < self._wake_at <= wake):
            self._wake_at = wake
            yield WakeAt(wake)

    # ------------------------------------------------------------------ preemption
    def _rank(self, jid: str) -> _Rank:
        """Larger = lower priority = preempted first: higher queue, then later submission (then job id)."""
        return self._rank_of[jid]

    def _eligible_on(self, node_id: str, level: int, gone: set[str]) -> list[tuple[str, int]]:
        """``(job, GPUs on the node)`` of the node's candidates below ``level``, lowest priority first."""
        ranked = self._by_node.get(node_id)
        if ranked is None:
            held = self._on_node.get(node_id)
            if not held:
                return []
            rank = self._rank_of
            ranked = self._by_node[node_id] = sorted(held.items(), key=lambda p: rank[p[0]], reverse=True)
        lv = self._level
        return [(j, n) for j, n in ranked if lv[j] > level and j not in gone]

    def _key(self, chosen: list[str]) -> tuple[float, ...]:
        top = min(self._rank(j) for j in chosen)
        return (-top[0], -top[1], float(sum(_held(self._running[j]) for j in chosen)), float(len(chosen)))

    @staticmethod
    def _open_free(state: ClusterState, node_id: str) -> int:
        """Free GPUs of a ready node that accept work now (-1: the node is not ready)."""
        node = state.nodes[node_id]
        if not node.ready:
            return -1
        if not node.free_whole:
            return 0
        now = state.time
        return sum(1 for g in node.gpus if not g.holders and g.healthy and g.busy_until <= now)

    def _room_for(self, state: ClusterState, run: JobRun, level: int, gone: set[str]) -> list[JobRun] | None:
        """Victims (all of queue > ``level``) whose GPUs let ``run`` start now; None if no room can be made.

        A room is one node (:meth:`_single_room`, over every pool whose nodes can hold the
        job) or, in a pool whose nodes cannot, the pool's gang rule (:meth:`_gang_room`).
        Among rooms, the one whose most important victim is least important wins, then the
        one suspending the fewest GPUs, then the first found.
        """
        job = run.job
        best: tuple[tuple[float, ...], list[str]] | None = None
        single_done = False
        for pool in state.pools.values():
            spec = pool.spec
            if spec.sharing is not Sharing.EXCLUSIVE or not fits_pool_spec(job, spec):
                continue
            if job.num_gpus <= spec.gpus_per_node:
                if single_done:
                    continue
                single_done = True
                found = self._single_room(state, run, level, gone)
            else:
                found = self._gang_room(state, pool, run, level, gone)
            if found:
                key = self._key(found)
                if best is None or key < best[0]:
                    best = (key, found)
        return None if best is None else [self._running[j] for j in best[1]]

    def _single_room(self, state: ClusterState, run: JobRun, level: int, gone: set[str]) -> list[str] | None:
        """Victims on one node for a job that fits a node: the room whose most important victim is least important.

        Walks the candidates lowest priority first, counting the GPUs each would free on
        each node of a pool the job may use; the first node where free plus freed GPUs
        cover the request is that room. Its victims are the one that completed it plus,
        lowest priority first, as many of the node's earlier ones as still needed.
        """
        job = run.job
        need = job.num_gpus
        pools = {name for name, p in state.pools.items() if p.spec.sharing is Sharing.EXCLUSIVE
                 and need <= p.spec.gpus_per_node and fits_pool_spec(job, p.spec)}
        if not pools:
            return None
        if self._ranked is None:
            self._ranked = sorted(self._victimish, key=self._rank_of.__getitem__, reverse=True)
        free: dict[str, int] = {}
        freed: dict[str, list[tuple[str, int]]] = {}
        lv = self._level
        for jid in self._ranked:
            if lv[jid] <= level:
                break  # the rest are as important as the job or more
            if jid in gone:
                continue
            pl = self._running[jid].placement
            if pl is None:
                continue
            per_node: dict[str, int] = {}
            for node_id, _ in pl.gpus:
                per_node[node_id] = per_node.get(node_id, 0) + 1
            for node_id, n in per_node.items():
                node = state.nodes[node_id]
                if node.pool not in pools:
                    continue
                f = free.get(node_id)
                if f is None:
                    f = self._open_free(state, node_id)
                    if f >= 0 and ((node.cpus and job.cpus > node.free_cpus)
                                   or (node.mem_mib and job.mem_mib > node.free_mem)):
                        f = -1  # lacks the CPU or memory the job asks for (victims' are not counted)
                    free[node_id] = f
                if f < 0:
                    continue
                here = freed.setdefault(node_id, [])
                here.append((jid, n))
                if f + sum(k for _, k in here) >= need:
                    chosen, got = [jid], f + n
                    for other, k in here[:-1]:
                        if got >= need:
                            break
                        chosen.append(other)
                        got += k
                    return chosen
        return None

    def _node_room(self, state: ClusterState, node_id: str, need: int, level: int, run: JobRun, gone: set[str],
                   already: frozenset[str] = frozenset()) -> list[str] | None:
        """Victims on one node that free ``need`` GPUs there, none if it has them (``already`` counts as freed).

        None when no set of candidates below ``level`` frees enough, or when the node lacks
        the CPU or memory the job asks for right now (victims' host resources are not
        counted: no workload here declares them for preemptible jobs).
        """
        free = self._open_free(state, node_id)
        if free < 0:
            return None
        node = state.nodes[node_id]
        job = run.job
        if (node.cpus and job.cpus > node.free_cpus) or (node.mem_mib and job.mem_mib > node.free_mem):
            return None
        held = self._on_node.get(node_id, {})
        free += sum(n for j, n in held.items() if j in already)
        chosen: list[str] = []
        for j, n in self._eligible_on(node_id, level, gone):
            if free >= need:
                break
            if j in already:
                continue
            chosen.append(j)
            free += n
        return chosen if free >= need else None

    def _gang_room(self, state: ClusterState, pool: Pool, run: JobRun, level: int, gone: set[str]) -> list[str] | None:
        """Victims in ``pool`` that make room for a job larger than a node, by the pool's gang rule."""
        job = run.job
        spec = pool.spec
        if (spec.cpus_per_node and job.cpus) or (spec.mem_mib_per_node and job.mem_mib):
            return None
        if spec.gang is GangMode.PACKED:
            free = 0
            cands: dict[str, _Rank] = {}
            for nid in pool.nodes:
                f = self._open_free(state, nid)
                if f >= 0:
                    free += f
                    cands.update((j, self._rank(j)) for j, _ in self._eligible_on(nid, level, gone))
            chosen: list[str] = []
            for j in sorted(cands, key=lambda j: cands[j], reverse=True):
                if free >= job.num_gpus:
                    break
                chosen.append(j)
                free += _held(self._running[j])
            return chosen if free >= job.num_gpus and chosen else None
        full, rest = gang_shape(spec, job.num_gpus)
        size = spec.gpus_per_node
        # Nodes that can be emptied: every GPU open or held by a candidate below ``level``.
        emptiable: list[tuple[tuple[float, ...], str, list[str]]] = []
        for idx, (nid, nd) in enumerate(pool.nodes.items()):
            free = self._open_free(state, nid)
            if free < 0:
                continue
            eligible = self._eligible_on(nid, level, gone)
            if sum(n for _, n in eligible) != size - free or len(nd.jobs) != len(eligible):
                continue
            victims = [j for j, _ in eligible]
            top = min((self._rank(j) for j in victims), default=(len(self._count), 0.0, ""))
            emptiable.append(((-top[0], -top[1], float(size - free), float(idx)), nid, victims))
        if len(emptiable) < full:
            return None
        emptiable.sort(key=lambda t: t[0])
        picked = emptiable[:full]
        chosen_set: set[str] = {j for _, _, vs in picked for j in vs}
        if rest:
            whole = {nid for _, nid, _ in picked}
            best: tuple[tuple[float, ...], list[str]] | None = None
            for nid in pool.nodes:
                if nid in whole:
                    continue
                extra = self._node_room(state, nid, rest, level, run, gone, frozenset(chosen_set))
                if extra is None:
                    continue
                key = self._key(extra) if extra else (-math.inf,)  # a node that needs no extra victim first
                if best is None or key < best[0]:
                    best = (key, extra)
            if best is None:
                return None
            chosen_set.update(best[1])
        return sorted(chosen_set) if chosen_set else None


def _held(run: JobRun) -> int:
    """Whole GPUs a running job holds."""
    return len(run.placement.gpus) if run.placement is not None else 0


__all__ = ["DEFAULT_PROMOTE_KNOB", "DEFAULT_THRESHOLDS", "Tiresias"]
