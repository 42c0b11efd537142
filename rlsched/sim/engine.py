"""The discrete-event engine: time, events, and the effect of decisions.

The engine owns simulated time. It replays job arrivals, completions, elastic
node provisioning, spot reclaims (sampled lifetimes or availability drops), MIG
reconfigurations and idle-node stops, and charges every held node its market
price. Between event batches it hands the :class:`ClusterState` to a scheduler;
each decision the scheduler yields is checked by
:func:`rlsched.cluster.feasibility.check_decision` and applied before the next is
asked for, so a generator-style scheduler always sees the effect of its previous
decision. Refused decisions are counted. The engine publishes what it reads from
the market (prices, spot availability) in ``ClusterState.quotes`` before anything
is decided, and legality reads it from there, as it does in the live runtime.

It is pure and deterministic under ``SimConfig.seed``: the same jobs, pools,
market and seed give the same events. Heuristics run on it directly; the
Gymnasium environment (:mod:`rlsched.envs`) is a thin shell over
:meth:`Engine.advance` and :meth:`Engine.apply`.
"""

from __future__ import annotations

import heapq
import math
import time as _time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlsched.cluster.checkpoint import DEFAULT_CHECKPOINT_INTERVAL_S, interval_of, kept_after_reclaim
from rlsched.cluster.decisions import Decision, Place, Preempt, Reconfigure, Scale, WakeAt
from rlsched.cluster.feasibility import (
    check_decision,
    fits_pool_spec,
    pack_layout,
    scale_down_room,
    scale_up_room,
    stoppable_nodes,
    unschedulable_reason,
)
from rlsched.cluster.job import Job, JobKind
from rlsched.cluster.loop_detector import LoopBreaker
from rlsched.cluster.model import (
    ClusterState,
    JobRun,
    MarketQuote,
    Node,
    NodeStatus,
    PoolKind,
    PoolSpec,
    RunState,
    Sharing,
    Slice,
)
from rlsched.market.base import Market

if TYPE_CHECKING:
    from rlsched.cluster.scheduler import Scheduler
    from rlsched.workload.forecast import DemandForecaster
from rlsched.sim.metrics import HORIZON_REASON, Report, Timeline, mean_p95

# Event kinds (small ints keep heap tuples cheap).
_COMPLETE, _NODE_READY, _RECLAIM, _RECONFIG_DONE, _AVAIL, _IDLE_CHECK, _WAKE = range(7)
_AVAIL_HORIZON_S = 7 * 86400.0
#: With nothing running and nothing left to arrive, a queue that has not moved for
#: this long never will (only market ticks remain): its jobs are stranded.
_STALL_S = 30 * 86400.0


@dataclass(frozen=True)
class SimConfig:
    """Knobs of the simulated world (not of any policy).

    Attributes:
        seed: seeds spot lifetimes and anything else random.
        checkpoint_interval_s: default seconds of work between checkpoints; an
            abrupt preemption loses the work since the last one (0 = no checkpoints).
        restart_overhead_s: work repeated after every restart (reload, warm-up).
        mig_reconfig_s: time a GPU is unusable while its MIG layout changes.
        oracle_durations: schedulers see true durations (labelled upper bound only).
        timeline_points: about how many samples the plot timeline keeps.
        horizon_s: stop simulating this long after the first arrival (None = run to the
            end); jobs still queued or running then are reported as unfinished. A guard
            for policies that may never drain the queue (an untrained network).
    """

    seed: int = 0
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    restart_overhead_s: float = 60.0
    mig_reconfig_s: float = 60.0
    oracle_durations: bool = False
    timeline_points: int = 2000
    horizon_s: float | None = None


class _FixedPriceMarket:
    """Market used when none is given: fixed pool prices, nothing reclaimed."""

    def price(self, pool: PoolSpec, t: float) -> float:
        return pool.cost_per_gpu_hour or 0.0

    def ondemand_price(self, pool: PoolSpec, t: float) -> float:
        return pool.cost_per_gpu_hour or 0.0

    def cost(self, pool: PoolSpec, t0: float, t1: float) -> float:
        return (pool.cost_per_gpu_hour or 0.0) * (t1 - t0) / 3600.0

    def spot_available(self, pool: PoolSpec, t: float) -> int | None:
        return None

    def availability_changes(self, pool: PoolSpec, t0: float, t1: float) -> list[float]:
        return []

    def sample_lifetime(self, pool: PoolSpec, rng: np.random.Generator) -> float | None:
        return None

    def reclaim_rate_per_hour(self, pool: PoolSpec) -> float:
        return 0.0


class Engine:
    """A discrete-event simulation of GPU pools replaying ``jobs``.

    Args:
        pools: the pools (on-prem, on-demand, spot) of the cluster.
        jobs: the workload; any order (sorted by submission here).
        market: prices, spot availability and reclaims; None = fixed prices.
        config: world knobs (seed, checkpoints, MIG reconfiguration time...).
    """

    def __init__(
        self,
        pools: Sequence[PoolSpec],
        jobs: Sequence[Job],
        market: Market | None = None,
        config: SimConfig | None = None,
        forecaster: DemandForecaster | None = None,
        forecast_horizon_s: float = 3600.0,
    ) -> None:
        if not pools:
            raise ValueError("a simulation needs at least one pool")
        self.pool_specs = list(pools)
        self.jobs = sorted(jobs, key=lambda j: j.submit_time)
        self.market: Market = market if market is not None else _FixedPriceMarket()
        self.config = config or SimConfig()
        #: optional demand forecaster (fitted beforehand on OTHER data): it observes each
        #: arrival and its prediction is published in ``state.demand_forecast`` at every
        #: decision point, where policies and the observation codec read it.
        self.forecaster = forecaster
        self.forecast_horizon_s = forecast_horizon_s
        self.reset()

    # ------------------------------------------------------------------ set-up
    def reset(self) -> None:
        """Start the replay from the beginning (same seed, same events)."""
        cfg = self.config
        self.rng = np.random.default_rng(cfg.seed)
        self.state = ClusterState(self.pool_specs)
        self.state.next_event_due = self.next_event_time
        self.state.estimator.oracle = cfg.oracle_durations
        self.state.checkpoint_interval_s = cfg.checkpoint_interval_s
        self.t0 = self.jobs[0].submit_time if self.jobs else 0.0
        self.now = self.t0
        self.state.time = self.now
        self._heap: list[tuple[float, int, int, object, int]] = []
        self._seq = 0
        self._next_arrival = 0
        self.runs: dict[str, JobRun] = {}
        self.finished: list[JobRun] = []
        self.unschedulable: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.refused = 0
        self.refusals: dict[str, int] = {}
        #: the loop breaker of the last :meth:`run` (its hand-overs are reported)
        self.loop_breaker: LoopBreaker | None = None
        self.events = 0
        self.capacity = 0
        self._held_gpus: dict[str, int] = {}
        self._held_base: dict[str, float] = {}
        # last cumulative-cost query per pool: cost_so_far and _hold ask for the same
        # (pool, now) many times between two events
        self._cum_memo: dict[str, tuple[float, float]] = {}
        # cumulative cost per GPU at each held node's request time (its bill is C(now) - this)
        self._node_base: dict[str, float] = {}
        self.cost_ondemand = 0.0
        self.cost_spot = 0.0
        self.cost_onprem = 0.0
        self._util_area = 0.0
        self._cap_area = 0.0
        self._last_t = self.now
        self._last_completion = self.now
        self._last_progress = self.now
        self._last_avail: dict[str, int | None] = {}
        self.preemptions = 0
        self._span_hint = (self.jobs[-1].submit_time - self.t0) if self.jobs else 0.0
        self.timeline = Timeline(nodes={p.name: [] for p in self.pool_specs})
        self._sample_every = max(self._span_hint, 3600.0) / max(self.config.timeline_points, 1)
        self._next_sample = self.now
        for spec in self.pool_specs:
            for _ in range(spec.start_nodes):
                node = self.state.add_node(spec.name, self.now, self.now)
                self._hold(node, +1)
                self._on_node_ready(node)
            if spec.kind is PoolKind.SPOT:
                self._schedule_availability(spec, self.now)
        self._refresh_quotes()

    # ------------------------------------------------------------------ helpers
    def _push(self, t: float, kind: int, obj: object, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj, version))

    def _mt(self, t: float) -> float:
        """Market time of simulated time ``t``."""
        return t - self.t0

    def _refresh_quotes(self) -> None:
        for spec in self.pool_specs:
            self._refresh_quote(spec)

    def _refresh_quote(self, spec: PoolSpec) -> None:
        """Publish the market's prices and spot availability for ``spec`` now in ``state.quotes``."""
        mt = self._mt(self.now)
        self.state.quotes[spec.name] = MarketQuote(
            price_per_gpu_hour=self.market.price(spec, mt),
            ondemand_per_gpu_hour=self.market.ondemand_price(spec, mt),
            spot_available_nodes=self.market.spot_available(spec, mt) if spec.kind is PoolKind.SPOT else None,
            reclaim_rate_per_hour=self.market.reclaim_rate_per_hour(spec),
        )

    @property
    def done(self) -> bool:
        """All jobs arrived and none is queued or running."""
        st = self.state
        return self._next_arrival >= len(self.jobs) and not st.queue and not st.running

    def next_event_time(self) -> float | None:
        """Time of the next arrival or event, or None if nothing is left."""
        t = self.jobs[self._next_arrival].submit_time if self._next_arrival < len(self.jobs) else math.inf
        if self._heap and self._heap[0][0] < t:
            t = self._heap[0][0]
        return None if t == math.inf else t

    # ------------------------------------------------------------------ time
    def _advance_clock(self, t: float) -> None:
        dt = t - self._last_t
        if dt > 0:
            self._util_area += self.state.allocated * dt
            self._cap_area += self.capacity * dt
            self._last_t = t
        self.now = t
        self.state.time = t
        if t >= self._next_sample:
            self._sample()
            self._next_sample = t + self._sample_every

    def _sample(self) -> None:
        tl = self.timeline
        tl.time_s.append(self.now - self.t0)
        tl.utilization.append(self.state.allocated / self.capacity if self.capacity else 0.0)
        tl.queue_length.append(len(self.state.queue))
        tl.cost_usd.append(self.cost_so_far())
        for name, pool in self.state.pools.items():
            tl.nodes[name].append(len(pool.nodes))

    def _cum_cost(self, spec: PoolSpec, t: float) -> float:
        """USD for one GPU of ``spec`` from market time 0 to simulated time ``t``."""
        hit = self._cum_memo.get(spec.name)
        if hit is not None and hit[0] == t:
            return hit[1]
        usd = self.market.cost(spec, 0.0, self._mt(t))
        self._cum_memo[spec.name] = (t, usd)
        return usd

    def _hold(self, node: Node, sign: int) -> None:
        """Track held GPUs per pool so the running cost is O(pools), not O(nodes).

        Cost is additive in time, so the nodes still held cost
        ``G x C(now) - sum(g x C(requested_at))`` with ``C`` the pool's cumulative price.
        """
        spec = self.state.pools[node.pool].spec
        g = len(node.gpus)
        if sign > 0:
            base = self._node_base[node.id] = self._cum_cost(spec, node.requested_at)
        else:
            base = self._node_base.pop(node.id)
        self._held_gpus[spec.name] = self._held_gpus.get(spec.name, 0) + sign * g
        self._held_base[spec.name] = self._held_base.get(spec.name, 0.0) + sign * g * base

    def cost_so_far(self) -> float:
        """USD spent until now, including nodes still held."""
        held = 0.0
        for pool in self.state.pools.values():
            g = self._held_gpus.get(pool.name, 0)
            if g:
                held += g * self._cum_cost(pool.spec, self.now) - self._held_base[pool.name]
        return self.cost_ondemand + self.cost_spot + self.cost_onprem + held

    def advance(self) -> bool:
        """Process the next batch of simultaneous events.

        Returns:
            True if the state changed in a way a scheduler should see (a decision
            point); False when nothing is left to process.
        """
        while True:
            if self.done:
                return False
            t = self.next_event_time()
            horizon = self.config.horizon_s
            if t is not None and horizon is not None and t > self.t0 + horizon:
                self._advance_clock(self.t0 + horizon)
                self._stop_at_horizon()
                return False
            if t is None or (
                not self.state.running
                and self._next_arrival >= len(self.jobs)
                and t - self._last_progress > _STALL_S
            ):
                self._strand_queue()
                return False
            self._advance_clock(t)
            dirty = False
            jobs = self.jobs
            while self._next_arrival < len(jobs) and jobs[self._next_arrival].submit_time <= t:
                self._arrive(jobs[self._next_arrival])
                self._next_arrival += 1
                dirty = True
            heap = self._heap
            while heap and heap[0][0] <= t:
                _, _, kind, obj, version = heapq.heappop(heap)
                self.events += 1
                dirty |= self._handle(kind, obj, version)
            if dirty:
                self._refresh_quotes()
                if self.forecaster is not None:
                    self.state.demand_forecast = self.forecaster.predict(self.now, self.forecast_horizon_s)
                    self.state.demand_forecast_horizon_s = self.forecast_horizon_s
                return True

    def _handle(self, kind: int, obj: object, version: int) -> bool:
        if kind == _COMPLETE:
            run = obj
            assert isinstance(run, JobRun)
            if run.version != version or run.state is not RunState.RUNNING:
                return False
            self._complete(run)
            return True
        if kind == _NODE_READY:
            assert isinstance(obj, Node)
            if obj.id not in self.state.nodes or obj.status is not NodeStatus.PROVISIONING:
                return False
            self._on_node_ready(obj)
            return True
        if kind == _RECLAIM:
            assert isinstance(obj, Node)
            if obj.id not in self.state.nodes or obj.reclaim_at != self.now:
                return False
            self._reclaim(obj, "spot reclaim")
            return True
        if kind == _RECONFIG_DONE:
            return True
        if kind == _AVAIL:
            assert isinstance(obj, PoolSpec)
            if version == 1:  # refill: fetch the next horizon of availability changes
                self._schedule_availability(obj, self.now)
            return self._availability(obj)
        if kind == _IDLE_CHECK:
            assert isinstance(obj, Node)
            return self._idle_check(obj)
        if kind == _WAKE:
            return True
        raise AssertionError(f"unknown event kind {kind}")

    # ------------------------------------------------------------------ jobs
    def _arrive(self, job: Job) -> None:
        self._last_progress = self.now
        run = JobRun(job=job, enqueued_at=self.now)
        if job.job_id in self.runs:
            raise ValueError(f"duplicate job id {job.job_id!r}")
        self.runs[job.job_id] = run
        if job.num_gpus <= 0:
            run.state = RunState.SKIPPED
            run.reason = "cpu-only (asks for no GPU)"
            self.skipped[run.reason] = self.skipped.get(run.reason, 0) + 1
            return
        self.state.note_arrival(job, self.now)
        if self.forecaster is not None:
            self.forecaster.observe(job)
        if not any(fits_pool_spec(job, p) for p in self.pool_specs):
            run.state = RunState.UNSCHEDULABLE
            run.reason = unschedulable_reason(job, self.pool_specs)
            self.unschedulable[run.reason] = self.unschedulable.get(run.reason, 0) + 1
            return
        self.state.enqueue(run)

    def _rate(self, run: JobRun) -> float:
        pl = run.placement
        assert pl is not None
        if pl.slice_start is not None:
            return 1.0
        worst = 1
        nodes = self.state.nodes
        for node_id, gi in pl.gpus:
            n = len(nodes[node_id].gpus[gi].holders)
            if n > worst:
                worst = n
        return 1.0 / worst

    def _progress(self, run: JobRun) -> float:
        return run.work_done + run.rate * (self.now - run.started_at)

    def _reschedule(self, run: JobRun) -> None:
        """(Re)compute ``run``'s rate and completion event after its sharing changed."""
        run.work_done = self._progress(run)
        run.started_at = self.now
        run.rate = self._rate(run)
        run.version += 1
        self._push(self.now + max(run.job.duration - run.work_done, 0.0) / run.rate, _COMPLETE, run, run.version)

    def _timesliced_neighbours(self, run: JobRun) -> set[str]:
        pl = run.placement
        if pl is None or pl.slice_start is not None:
            return set()
        out: set[str] = set()
        for node_id, gi in pl.gpus:
            gpu = self.state.nodes[node_id].gpus[gi]
            if gpu.sharing is Sharing.TIMESLICE:
                out.update(gpu.holders)
        out.discard(run.job.job_id)
        return out

    def _start(self, run: JobRun, placement_profile: str | None) -> None:
        st = self.state
        assert run.placement is not None
        st.dequeue(run.job.job_id)
        st.running[run.job.job_id] = run
        run.state = RunState.RUNNING
        self._last_progress = self.now
        run.queued_s += self.now - run.enqueued_at
        if run.first_start is None:
            run.first_start = self.now
        else:
            run.restarts += 1
        run.started_at = self.now
        run.on_spot = st.pools[run.placement.pool].spec.kind is PoolKind.SPOT
        run.rate = self._rate(run)
        run.version += 1
        self._push(self.now + max(run.job.duration - run.work_done, 0.0) / run.rate, _COMPLETE, run, run.version)
        for other in self._timesliced_neighbours(run):
            self._reschedule(st.running[other])

    def _release(self, run: JobRun) -> None:
        st = self.state
        neighbours = self._timesliced_neighbours(run)
        nodes = run.placement.nodes if run.placement else ()
        st.release(run, self.now)
        for node_id in nodes:
            node = st.nodes[node_id]
            if not node.jobs:
                self._schedule_idle_check(node)
        for other in neighbours:
            self._reschedule(st.running[other])

    def _complete(self, run: JobRun) -> None:
        st = self.state
        run.attained += (self.now - run.started_at) * run.job.gpu_demand
        run.work_done = run.job.duration
        self._release(run)
        del st.running[run.job.job_id]
        run.state = RunState.DONE
        run.finish_time = self.now
        self._last_completion = self.now
        self.finished.append(run)
        if run.job.kind is JobKind.BATCH:
            st.estimator.observe(run.job, run.job.duration)

    def _stop(self, run: JobRun, *, graceful: bool, reason: str, preemption: bool = True) -> None:
        """Preempt a running job and requeue it; abrupt stops lose un-checkpointed work.

        ``preemption=False`` for the stop at the horizon: it ends the run, no scheduler or market
        preempted the job, so it is not counted as a preemption.
        """
        st = self.state
        job = run.job
        work = self._progress(run)
        # A checkpoint never shrinks: a job stopped again while repaying its restart
        # overhead (work < checkpointed) still resumes from its last checkpoint.
        if graceful:
            kept = max(work, run.checkpointed)
        else:
            kept = kept_after_reclaim(work, interval_of(run, self.config.checkpoint_interval_s), run.checkpointed)
        if kept > run.checkpointed:
            # written when the work reached ``kept``: now for a graceful stop, earlier for a reclaim
            run.checkpoint_at = self.now - (work - kept) / run.rate if run.rate > 0 else self.now
        lost = max(work - kept, 0.0)
        run.lost_gpu_seconds += lost * job.gpu_demand
        run.attained += (self.now - run.started_at) * job.gpu_demand
        run.checkpointed = kept
        run.work_done = kept - self.config.restart_overhead_s
        if preemption:
            run.preemptions += 1
            self.preemptions += 1
        run.version += 1
        self._release(run)
        del st.running[job.job_id]
        run.state = RunState.QUEUED
        run.enqueued_at = self.now
        run.reason = reason
        st.enqueue(run)

    def _stop_at_horizon(self) -> None:
        """The horizon is reached: whatever is queued or running is reported unfinished."""
        reason = HORIZON_REASON
        st = self.state
        for run in list(st.running.values()):
            self._stop(run, graceful=True, reason=reason, preemption=False)
        n = len(st.queue)
        for run in list(st.queue.values()):
            st.dequeue(run.job.job_id)
            run.state = RunState.UNSCHEDULABLE
            run.reason = reason
        for job in self.jobs[self._next_arrival:]:  # never arrived: counted, never dropped
            self.runs[job.job_id] = JobRun(job=job, state=RunState.UNSCHEDULABLE, reason=reason)
            n += 1
        if n:
            self.unschedulable[reason] = self.unschedulable.get(reason, 0) + n
        self._next_arrival = len(self.jobs)

    def _strand_queue(self) -> None:
        """Nothing can ever happen again: what is still queued can never run."""
        reason = "never placed: no capacity and the policy requested none"
        for run in list(self.state.queue.values()):
            self.state.dequeue(run.job.job_id)
            run.state = RunState.UNSCHEDULABLE
            run.reason = reason
            self.unschedulable[reason] = self.unschedulable.get(reason, 0) + 1

    # ------------------------------------------------------------------ nodes
    def _on_node_ready(self, node: Node) -> None:
        node.status = NodeStatus.READY
        node.idle_since = self.now
        self.capacity += len(node.gpus)
        spec = self.state.pools[node.pool].spec
        if spec.kind is PoolKind.SPOT:
            life = self.market.sample_lifetime(spec, self.rng)
            if life is not None:
                node.reclaim_at = self.now + life
                self._push(node.reclaim_at, _RECLAIM, node)
        self._schedule_idle_check(node)

    def _schedule_idle_check(self, node: Node) -> None:
        spec = self.state.pools[node.pool].spec
        if spec.kind.elastic and spec.idle_stop_s >= 0:
            # At least one second later, so a scheduler always sees a node before it can be stopped idle.
            self._push(self.now + max(spec.idle_stop_s, 1.0), _IDLE_CHECK, node)

    def _idle_check(self, node: Node) -> bool:
        st = self.state
        if node.id not in st.nodes or not node.ready or node.jobs:
            return False
        pool = st.pools[node.pool]
        if node.idle_since + max(pool.spec.idle_stop_s, 1.0) > self.now + 1e-9:
            return False
        if len(pool.nodes) <= pool.spec.min_nodes:
            return False
        self._remove_node(node)
        return False

    def _charge(self, node: Node, base: float) -> None:
        """Bill ``node`` from its request until now; ``base`` is the cumulative cost at its request."""
        spec = self.state.pools[node.pool].spec
        usd = len(node.gpus) * (self._cum_cost(spec, self.now) - base)
        if spec.kind is PoolKind.SPOT:
            self.cost_spot += usd
        elif spec.kind is PoolKind.ONDEMAND:
            self.cost_ondemand += usd
        else:
            self.cost_onprem += usd

    def _remove_node(self, node: Node) -> None:
        base = self._node_base[node.id]
        self._hold(node, -1)
        if node.ready:
            self.capacity -= len(node.gpus)
        self._charge(node, base)
        self.state.remove_node(node)

    def _reclaim(self, node: Node, reason: str) -> None:
        st = self.state
        for job_id in sorted(node.jobs):
            run = st.running.get(job_id)
            if run is not None:
                self._stop(run, graceful=False, reason=reason)
        self._remove_node(node)
        # A pool with a minimum size asks the market for replacements, as a managed
        # instance group does; availability may refuse them for now. This happens
        # between decision points, so the pool's quote is brought up to date first.
        pool = st.pools[node.pool]
        missing = pool.spec.min_nodes - len(pool.nodes)
        if missing > 0:
            self._refresh_quote(pool.spec)
            replace = Scale(pool.name, missing)
            if check_decision(st, replace) is None:
                self._scale(replace)

    def _schedule_availability(self, spec: PoolSpec, t: float) -> None:
        changes = self.market.availability_changes(spec, self._mt(t), self._mt(t) + _AVAIL_HORIZON_S)
        for c in changes:
            self._push(c + self.t0, _AVAIL, spec, 0)
        self._push(t + _AVAIL_HORIZON_S, _AVAIL, spec, 1)

    def _availability(self, spec: PoolSpec) -> bool:
        """Apply a change of spot availability; any change is a decision point.

        A drop below what the pool holds reclaims the excess (provisioning nodes
        first, then the newest ready ones); a rise lets a waiting policy buy again.
        """
        pool = self.state.pools[spec.name]
        avail = self.market.spot_available(spec, self._mt(self.now))
        changed = self._last_avail.get(spec.name) != avail
        self._last_avail[spec.name] = avail
        if avail is None or len(pool.nodes) <= avail:
            return changed
        excess = len(pool.nodes) - avail
        victims = sorted(pool.nodes.values(), key=lambda n: (n.status is NodeStatus.READY, -n.requested_at))
        for node in victims[:excess]:
            self._reclaim(node, "spot capacity withdrawn")
        return True

    # ------------------------------------------------------------------ decisions
    def apply(self, decision: Decision) -> str | None:
        """Apply one decision if feasible; returns None on success or the refusal reason."""
        reason = self._apply(decision)
        if reason is not None:
            self.refused += 1
            key = type(decision).__name__
            self.refusals[key] = self.refusals.get(key, 0) + 1
        return reason

    def _apply(self, d: Decision) -> str | None:
        st = self.state
        why = check_decision(st, d)
        if why is not None:
            return why
        if isinstance(d, Place):
            run = st.queue[d.job_id]
            profile = None
            if d.placement.slice_start is not None:
                node_id, gi = d.placement.gpus[0]
                for s in st.nodes[node_id].gpus[gi].slices:
                    if s.start == d.placement.slice_start:
                        profile = s.profile.name
            st.allocate(run, d.placement, profile)
            self._start(run, profile)
        elif isinstance(d, Preempt):
            self._stop(st.running[d.job_id], graceful=d.checkpoint, reason=d.reason)
        elif isinstance(d, Scale):
            self._scale(d)
        elif isinstance(d, Reconfigure):
            gpu = st.nodes[d.node_id].gpus[d.gpu_index]
            packed = pack_layout(gpu.model, d.layout)
            assert packed is not None
            gpu.slices = [Slice(gpu, prof, start) for prof, start in packed]
            gpu.busy_until = self.now + self.config.mig_reconfig_s
            self._push(gpu.busy_until, _RECONFIG_DONE, gpu)
        elif isinstance(d, WakeAt):
            self._push(d.time, _WAKE, None)
        return None

    def _scale(self, d: Scale) -> None:
        """Carry out a scale decision :func:`check_decision` accepted, by as many nodes as the pool allows."""
        st = self.state
        pool = st.pools[d.pool]
        spec = pool.spec
        if d.delta > 0:
            for _ in range(min(d.delta, scale_up_room(st, pool))):
                node = st.add_node(d.pool, self.now, self.now + spec.provision_delay_s)
                self._hold(node, +1)
                if spec.provision_delay_s <= 0:
                    self._on_node_ready(node)
                    self._push(self.now, _WAKE, None)  # new capacity now: a decision point
                else:
                    self._push(node.ready_at, _NODE_READY, node)
            return
        for node in stoppable_nodes(pool)[: min(-d.delta, scale_down_room(pool))]:
            self._remove_node(node)

    # ------------------------------------------------------------------ running
    def run(
        self,
        scheduler: Scheduler,
        progress: Callable[[int, int, float], None] | None = None,
        loop_breaker: LoopBreaker | None = None,
    ) -> Report:
        """Replay the whole workload under ``scheduler`` and report.

        Each decision point goes through a :class:`~rlsched.cluster.loop_detector.LoopBreaker`:
        a scheduler caught in a decision loop without progress (scale up/down alternation,
        MIG re-split churn, many decisions with nothing placed while a job fits) has the rest
        of that decision point decided by the fallback heuristic, counted in
        ``Report.loop_handovers``. Schedulers with ``loop_exempt = True`` (the heuristics:
        baselines, and the fallback itself) are replayed as written unless ``loop_breaker``
        is given.

        Args:
            scheduler: anything with ``decide(state) -> Iterable[Decision]``.
            progress: called now and then as ``progress(jobs_finished, jobs_total,
                simulated_seconds)``; jobs finished count completed, unschedulable and
                skipped jobs alike (each job ends as exactly one of them).
            loop_breaker: the loop detector and its fallback (default: weighted-priority,
                for every scheduler that is not ``loop_exempt``).
        """
        wall0 = _time.perf_counter()
        reset = getattr(scheduler, "reset", None)
        if callable(reset):
            reset(self.state)
        breaker = loop_breaker
        if breaker is None and not getattr(scheduler, "loop_exempt", False):
            breaker = LoopBreaker()
        if breaker is not None:
            breaker.reset(self.state)
        self.loop_breaker = breaker
        total = len(self.jobs)
        tick = max(total // 200, 1)
        last_tick = -1
        while self.advance():
            if breaker is not None:
                breaker.drive(scheduler, self.state, self.apply)
            else:
                for decision in scheduler.decide(self.state):
                    self.apply(decision)
            if progress is not None:
                ended = self.jobs_ended
                if ended // tick != last_tick:
                    last_tick = ended // tick
                    progress(ended, total, self.now - self.t0)
        if progress is not None:
            progress(self.jobs_ended, total, self.now - self.t0)
        return self.report(getattr(scheduler, "name", type(scheduler).__name__), _time.perf_counter() - wall0)

    @property
    def jobs_ended(self) -> int:
        """Jobs that will not run again: completed, unschedulable (with a reason) or skipped."""
        return len(self.finished) + sum(self.unschedulable.values()) + sum(self.skipped.values())

    def report(self, policy: str, wall_s: float) -> Report:
        """Metrics of the run so far (call after :meth:`run`)."""
        end = max(self._last_completion, self.now)
        self._advance_clock(end)
        self._sample()
        held = 0.0
        for pool in self.state.pools.values():
            for node in pool.nodes.values():
                usd = len(node.gpus) * self.market.cost(pool.spec, self._mt(node.requested_at), self._mt(end))
                if pool.spec.kind is PoolKind.SPOT:
                    self.cost_spot += usd
                elif pool.spec.kind is PoolKind.ONDEMAND:
                    self.cost_ondemand += usd
                else:
                    self.cost_onprem += usd
                held += usd
                self._hold(node, -1)
                node.requested_at = end  # charged up to here; a later report does not double count
                self._hold(node, +1)
        batch = [r for r in self.finished if r.job.kind is JobKind.BATCH]
        jct = [r.finish_time - r.job.submit_time for r in batch if r.finish_time is not None]
        waits = [r.queued_s for r in batch]
        mj, pj = mean_p95(jct)
        mw, pw = mean_p95(waits)
        misses = 0
        for r in self.runs.values():
            dl = r.job.deadline
            if dl is None:
                continue
            if r.state is RunState.DONE:
                if r.finish_time is not None and r.finish_time > dl + 1e-9:
                    misses += 1
            elif r.state in (RunState.QUEUED, RunState.RUNNING, RunState.UNSCHEDULABLE):
                misses += 1
        lost = sum(r.lost_gpu_seconds for r in self.runs.values()) / 3600.0
        return Report(
            policy=policy,
            mean_jct_s=mj, p95_jct_s=pj, mean_wait_s=mw, p95_wait_s=pw,
            makespan_s=end - self.t0,
            gpu_utilization=self._util_area / self._cap_area if self._cap_area > 0 else 0.0,
            cost_usd=self.cost_ondemand + self.cost_spot + self.cost_onprem,
            cost_ondemand_usd=self.cost_ondemand,
            cost_spot_usd=self.cost_spot,
            preemptions=self.preemptions,
            restarts=sum(r.restarts for r in self.runs.values()),
            lost_gpu_hours=lost,
            deadline_misses=misses,
            jobs_completed=len(self.finished),
            jobs_unschedulable=sum(self.unschedulable.values()),
            jobs_skipped=sum(self.skipped.values()),
            refused_decisions=self.refused,
            loop_handovers=self.loop_breaker.total if self.loop_breaker is not None else 0,
            wall_s=wall_s,
            sim_events=self.events,
            unschedulable_reasons=dict(self.unschedulable),
            skipped_reasons=dict(self.skipped),
            timeline=self.timeline,
        )

