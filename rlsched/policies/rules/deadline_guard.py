"""A deadline guard: serve a job on safe capacity before its deadline becomes unreachable.

A cost-minded policy (the learned spot policy above all) saves money by letting jobs
wait for spot. Most of the time that is right; it goes wrong for a job whose slack runs
out while it waits, because on-demand capacity bought at that moment arrives one
provisioning delay later. The guard is the serving-time shield against exactly that:
at each decision point, before the policy acts, every queued deadline job whose
*latest safe start* has come is placed on on-prem or ready on-demand capacity, and
on-demand is bought for those that fit nowhere.

**When a job is urgent.** With ``remaining`` the work left (the duration estimate,
doubled until it exceeds the progress made, as Uniform Progress does) and ``d`` the
provisioning delay of the quickest on-demand pool that fits it, a queued job is urgent
once::

    deadline - now <= min(remaining, allowance) + d + restart_overhead + margin

where ``allowance = deadline - submit``. The ``margin`` (default: a quarter of the
allowance, at least ``min_margin_s``) absorbs estimation error; it is a fraction of the
allowance because the estimate's error grows with the job. A job believed to need more
than its whole allowance is therefore urgent on arrival. Capping its remaining work at
the allowance changes only the order in which urgent jobs are served (least slack
first): the estimator learns per (user, request shape), so an estimate longer than the
deadline allowance is more likely wrong than the user's deadline, and without the cap
such a job would jump the line by exactly as much as its estimate is wrong.

**What it does.** Urgent jobs are served least slack first: on-prem first, then
on-demand capacity that is ready now (first fit, cheapest pool first, as the hybrid
baselines place); a job that fits neither gets on-demand nodes bought for it (GPUs
already provisioning in that pool count against the need). Spot is the last resort
(``spot_last_resort``): taken only when no on-demand capacity can come at all (every
on-demand pool at its maximum, nothing provisioning) - a ready spot node, else one
bought for the job - because a reclaim near the deadline is what the guard exists to
prevent, but waiting for capacity that cannot come is a certain miss. Urgent jobs are
not preempted or migrated once running. The guard asks to be woken when the next queued
job turns urgent, so it acts on time even when nothing else happens.

**Gangs that spot cannot hold** (``gangs_off_spot=True``, off by default). The latest
safe start assumes on-demand can be bought when a job turns urgent. For a gang the size
of a pool that fails twice over: several such gangs turn urgent together and queue for
the same on-demand pool, and waiting for spot is waiting for a whole spot pool to drain
while other work keeps landing on it (:func:`spot_can_hold_gang`: no spot pool that
admits the job can assemble its room from its empty nodes plus the nodes it may still
buy). Such a *stranded* gang is served on safe capacity as soon as it is queued - placed
on ready on-prem/on-demand, or on-demand bought for it - without preemption and without
spot, after the urgent jobs. Jobs that fit one node are never stranded (a node frees or
is bought quickly), and a gang whose spot room can still be assembled is left to the
policy.

**Backlogs** (``backlog_buy=True``, off by default). The urgency test looks at one job at
a time, so a burst of hundreds of short deadline jobs passes it job by job while together
they need more GPUs than the fleet has; when they turn urgent, the on-demand bought for
them comes a provisioning delay too late for most, and a cost-minded policy may hold paid
on-demand nodes idle meanwhile, waiting for spot. With the option the guard also runs the
fluid test of earliest-deadline-first over the queued deadline jobs
(:meth:`DeadlineGuard.backlog_shortfall`): when they cannot all start on the GPUs idle now
and cannot all finish in half their time left on the fleet's capacity, it places them
(earliest deadline first) on idle on-prem/on-demand GPUs and buys on-demand for the
shortfall. Half the time left, and estimates scaled up by the estimator's mean error,
because a burst keeps arriving while it is served and its jobs may run far longer than
their users' history says: a test that trusts both buys after the burst has already missed.

**Preemption** (``preempt=True``, off by default). When an urgent job has nowhere to go
- no safe capacity ready or coming, no spot - the guard suspends running jobs to make
room (:meth:`DeadlineGuard.victims`): gracefully (a checkpoint first, so only a restart
overhead is lost), and only jobs that are preemptible and can afford the wait - after the
urgent job's estimated run plus a restart each would still not be urgent itself. The
guard thus never trades one miss for another by its own estimates, and a victim cannot
preempt its preemptor back. An urgent job the estimates call hopeless (it could not
finish even if started now) preempts nobody. Room is made where the job will run: on
one node for a job that fits a node, anywhere in one pool for a gang job larger than a
node, suspending as few GPUs as it can: a deadline can be missed in a burst where every
node is busy and no capacity can be bought, and a gang job on fragmented pools needs
room that no single victim on a single node gives.

It changes nothing for jobs without a deadline, nothing while every deadline has
room, and nothing on clusters without on-prem or on-demand capacity.

Measurements (misses and cost with and without the guard, and the shipped spot policy
trained behind it): BENCHMARKS.md, "Cost report: spot economics", "The deadline guard".
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from dataclasses import dataclass, fields

from rlsched.cluster.checkpoint import progress_now
from rlsched.cluster.decisions import Decision, Place, Preempt, Scale, WakeAt
from rlsched.cluster.estimate import believed_work
from rlsched.cluster.feasibility import fits_pool_spec, gang_fits_after
from rlsched.cluster.model import ClusterState, JobRun, NodeStatus, Pool, PoolKind, Sharing, estimate_key
from rlsched.policies.heuristics.autoscale import headroom, scale_for_demand
from rlsched.policies.heuristics.spot import place_in_tiers
from rlsched.policies.rules.victims import fewest_gpus, held_gpus

__all__ = ["DeadlineGuard", "GuardSwitches", "Urgency", "spot_can_hold_gang"]

#: A wake-up lands this long after the moment it waits for, so the job is urgent when looked at.
_WAKE_AFTER_S = 1.0
#: The backlog test asks for the queued deadline work to fit in this share of each job's time left:
#: a burst keeps arriving while the backlog is served, and the test sees only what has arrived.
_BACKLOG_HORIZON_FRAC = 0.5


@dataclass(frozen=True, slots=True)
class Urgency:
    """How close one queued deadline job is to its latest safe start.

    Attributes:
        run: the job.
        time_left: deadline - now.
        remaining: the work it still needs (estimated, capped at its allowance).
        delay: provisioning delay of the quickest safe pool that fits it.
        overhead: the restart overhead a (re)start repeats.
        margin: the safety margin.
    """

    run: JobRun
    time_left: float
    remaining: float
    delay: float
    overhead: float
    margin: float

    @property
    def need(self) -> float:
        """The time it must be given: remaining + delay + overhead + margin."""
        return self.remaining + self.delay + self.overhead + self.margin

    @property
    def slack(self) -> float:
        """Seconds until the job becomes urgent (<= 0: it is)."""
        return self.time_left - self.need

    @property
    def hold(self) -> float:
        """How long starting it now would keep capacity busy: remaining work + a restart."""
        return self.remaining + self.overhead

    @property
    def hopeless(self) -> bool:
        """It could not finish by its deadline even if started now (by the estimates)."""
        return self.time_left < self.hold


@dataclass(frozen=True, slots=True)
class GuardSwitches:
    """What the guard may do beyond placing urgent jobs on safe capacity (the module doc has each).

    Attributes:
        spot_last_resort: place an urgent job on spot (ready, else bought) when no on-demand can come.
        preempt: suspend a running job that can afford it for an urgent job nothing else can take.
        gangs_off_spot: serve a deadline gang that no spot pool can assemble room for on safe
            capacity at once, without waiting for it to turn urgent.
        backlog_buy: use idle safe capacity and buy on-demand ahead of time when the queued deadline
            work, taken earliest deadline first, cannot all finish in time on the capacity the fleet
            has (:meth:`DeadlineGuard.backlog_shortfall`).
        trust_deadline: take a job whose estimate reaches its whole allowance to need the allowance
            less the margin (:meth:`DeadlineGuard.urgency`), so it is not hopeless on arrival.
    """

    spot_last_resort: bool = True
    preempt: bool = False
    gangs_off_spot: bool = False
    backlog_buy: bool = False
    trust_deadline: bool = False

    def __post_init__(self) -> None:
        if not all(isinstance(getattr(self, f.name), bool) for f in fields(self)):
            raise ValueError(f"{', '.join(f.name for f in fields(self))}: each must be true or false")


class DeadlineGuard:
    """Places urgent deadline jobs on safe capacity ahead of another scheduler's decisions.

    Args:
        margin_frac: the safety margin as a fraction of each job's deadline allowance.
        min_margin_s: the smallest margin (seconds).
        restart_overhead_s: seconds of work a (re)start repeats (the engine's default belief).
        switches: the :class:`GuardSwitches` by name (``preempt=True``, ...); an unknown name is a TypeError.
    """

    #: its placements stand on their own; buying on-demand is extra (see :class:`~rlsched.policies.rules.Rule`)
    releases_nodes = False
    #: nodes bought per pool per decision point
    max_step = 8

    def __init__(self, margin_frac: float = 0.25, min_margin_s: float = 300.0, restart_overhead_s: float = 60.0,
                 **switches: bool) -> None:
        if margin_frac < 0 or min_margin_s < 0 or restart_overhead_s < 0:
            raise ValueError("margin_frac, min_margin_s and restart_overhead_s must be >= 0")
        self.margin_frac = margin_frac
        self.min_margin_s = min_margin_s
        self.restart_overhead_s = restart_overhead_s
        self.switches = GuardSwitches(**switches)
        self._wake_pending = -math.inf
        self._memo_key: tuple[int, float, int, int] | None = None
        self._estimates: dict[tuple[str, int, int], float] = {}
        self._delays: dict[tuple[object, ...], float | None] = {}

    def reset(self, state: ClusterState) -> None:
        self._wake_pending = -math.inf
        self._memo_key = None

    # ------------------------------------------------------------------ the rule
    def urgency(self, state: ClusterState, run: JobRun, *, estimate: float | None = None,
                delay: float | None = None) -> Urgency | None:
        """Where ``run`` stands (None: no deadline, or no safe capacity could ever take it).

        The remaining work is the estimate's, capped at the allowance. A capped job is urgent on
        arrival and, by the cap, also *hopeless* (it could not finish even if started now), so it
        preempts nobody - even when its estimate is the one that is wrong, as an estimate above the
        user's whole allowance usually is. With ``trust_deadline`` such a job is taken to need its
        allowance less the margin instead: still urgent on arrival, but able to make room.

        ``estimate`` and ``delay`` (the job's duration estimate and its quickest safe
        pool's provisioning delay) may be passed in when the caller has them memoised.
        """
        job = run.job
        dl = job.deadline
        if dl is None:
            return None
        if delay is None:
            delay = self.safe_delay(state, run)
            if delay is None:
                return None
        allowance = max(dl - job.submit_time, 0.0)
        progress = progress_now(run, state.time)
        work = believed_work(state.estimator.estimate(job) if estimate is None else estimate, progress)
        remaining = min(work - progress, max(allowance - progress, 0.0))
        margin = max(self.margin_frac * allowance, self.min_margin_s)
        if self.switches.trust_deadline and work >= allowance:
            # an estimate that reaches the whole allowance says the estimator does not know this job;
            # believe the user instead: it fits the allowance less the margin, so it is not hopeless
            remaining = max(allowance - margin - progress, 0.0)
        return Urgency(run, dl - state.time, remaining, delay, self.restart_overhead_s, margin)

    @staticmethod
    def safe_delay(state: ClusterState, run: JobRun) -> float | None:
        """Provisioning delay of the quickest on-prem/on-demand pool that fits ``run`` (None: none fits)."""
        delays = [p.spec.provision_delay_s for p in state.pools.values()
                  if p.spec.kind is not PoolKind.SPOT and fits_pool_spec(run.job, p.spec)]
        return min(delays) if delays else None

    def _memoised(self, state: ClusterState, run: JobRun) -> Urgency | None:
        """:meth:`urgency` with estimates memoised per (user, request shape) and delays per shape.

        Estimates depend only on (user, request shape) and change only when the
        estimator learns (its version); delays depend only on the request shape and the
        pool specs. The memo lives for one decision point (same state, time and
        estimator version): the scans run over the whole queue, and the victim search
        over every running job, at every decision point.
        """
        estimator = state.estimator
        key = (id(state), state.time, id(estimator), estimator.version)
        if key != self._memo_key:
            self._memo_key = key
            self._estimates = {}
            self._delays = {}
        shape = run.shape
        delay = self._delays[shape] if shape in self._delays else self._delays.setdefault(
            shape, self.safe_delay(state, run))
        if delay is None:
            return None
        job = run.job
        if estimator.oracle:
            est = estimator.estimate(job)
        else:
            ek = estimate_key(job)
            got = self._estimates.get(ek)
            est = got if got is not None else self._estimates.setdefault(ek, estimator.estimate(job))
        return self.urgency(state, run, estimate=est, delay=delay)

    def urgent(self, state: ClusterState) -> tuple[list[Urgency], float]:
        """Queued urgent jobs (least slack first) and when the next one turns urgent (inf: never)."""
        due, _stranded, nxt = self._scan(state)
        return due, nxt

    def _scan(self, state: ClusterState) -> tuple[list[Urgency], list[Urgency], float]:
        """Urgent jobs, stranded gangs (both least slack first), and when the next job turns urgent."""
        due: list[Urgency] = []
        stranded: list[Urgency] = []
        nxt = math.inf
        spot_rooms: dict[tuple[object, ...], bool] = {}
        for run in state.queue.values():
            if run.job.deadline is None:
                continue
            u = self._memoised(state, run)
            if u is None:
                continue
            if u.slack <= 0:
                due.append(u)
                continue
            nxt = min(nxt, state.time + u.slack)
            if self.switches.gangs_off_spot and run.job.preemptible:
                shape = run.shape
                if shape not in spot_rooms:  # it depends on the request shape alone
                    spot_rooms[shape] = spot_can_hold_gang(state, run)
                if not spot_rooms[shape]:
                    stranded.append(u)
        key = lambda u: (u.slack, u.run.job.submit_time)  # noqa: E731
        due.sort(key=key)
        stranded.sort(key=key)
        return due, stranded, nxt

    # ------------------------------------------------------------------ decisions
    def decide(self, state: ClusterState) -> Iterator[Decision]:
        """Place or buy for every urgent job; the caller applies each decision as it is yielded."""
        if not state.queue:
            return
        due, stranded, nxt = self._scan(state)
        demand: dict[str, float] = {}
        no_victim: dict[tuple[object, ...], float] = {}
        # stranded gangs after the urgent jobs, on safe capacity only: no spot, no preemption
        for u, urgent in [(u, True) for u in due] + [(u, False) for u in stranded]:
            run = u.run
            if run.job.job_id not in state.queue:
                continue
            place = _safe_place(state, run)
            if place is not None:
                yield place
                continue
            if _want(state, run, PoolKind.ONDEMAND, demand) or not urgent:
                continue
            if self.switches.spot_last_resort and run.job.preemptible:
                target = place_in_tiers(state, run, [[PoolKind.SPOT]])
                if target is not None:
                    yield Place(run.job.job_id, target)
                    continue
                if _want(state, run, PoolKind.SPOT, demand):
                    continue
            if self.switches.preempt:
                # A search that failed for a request shape fails for any later job of that shape that
                # would hold the victim as long or longer: this pass only removes candidates.
                shape = run.shape
                if u.hopeless or no_victim.get(shape, math.inf) <= u.hold:
                    continue  # hopeless by the estimates, or no victim can hold it
                victims = self.victims(state, u)
                if not victims:
                    no_victim[shape] = min(u.hold, no_victim.get(shape, math.inf))
                    continue
                for victim in victims:
                    yield Preempt(victim.job.job_id, checkpoint=True,
                                  reason=f"deadline guard: room for {run.job.job_id}, whose deadline is at risk")
                tiers = [[PoolKind.ONPREM], [PoolKind.ONDEMAND]] + ([[PoolKind.SPOT]] if run.job.preemptible else [])
                target = place_in_tiers(state, run, tiers)
                if target is not None:
                    yield Place(run.job.job_id, target)
        yield from scale_for_demand(state, demand, self.max_step)
        if self.switches.backlog_buy:
            yield from self._backlog(state)
        wake = nxt + _WAKE_AFTER_S
        if wake < math.inf and not (state.time < self._wake_pending <= wake):
            self._wake_pending = wake
            yield WakeAt(wake)

    def backlog_shortfall(self, state: ClusterState) -> tuple[float, JobRun | None, list[JobRun]]:
        """GPUs the fleet lacks to finish every queued deadline job in time.

        The per-job test (:attr:`Urgency.slack`) asks whether *one* job can still wait; a burst
        of hundreds of short deadline jobs passes it job by job while together they need more
        GPUs than the fleet has, and by the time they turn urgent the on-demand bought for them
        arrives a provisioning delay too late for most. This is the fluid test of earliest-
        deadline-first: with the queued jobs that are not yet urgent taken by latest safe
        finish, ``T = (deadline - now - margin - restart) / 2`` (half: a burst goes on arriving
        while its backlog is served), the first ``k`` need ``W_k`` GPU-seconds (their estimates
        scaled up by ``exp(log_error)``, the estimator's mean miss: a test that passes only on
        estimates this far off would buy too late whenever they are short), the running jobs
        hold ``B(T_k)`` of the fleet's ``C`` GPUs until then (each its estimated remaining run,
        at most ``T_k``), and GPUs bought now serve from one provisioning delay ``d`` on, so
        ``S`` more GPUs suffice when ``C T_k + S (T_k - d) >= W_k + B(T_k)`` for
        every ``k``. ``C`` counts ready and provisioning GPUs of every pool, spot included (a
        reclaim is the urgency test's business). A queue that could all start on the GPUs idle
        or provisioning now is never short: holding it (for spot, say) is the policy's choice,
        and the inflated estimates would otherwise call a few queued jobs a shortfall wherever
        the estimator is poor.

        Returns ``(max S, the job it binds at, the jobs in that order)``; ``S <= 0`` and no
        binding job when the fleet suffices.
        """
        scale = self._work_scale(state)
        queued: list[tuple[float, float, float, JobRun]] = []
        for run in state.queue.values():
            if run.job.deadline is None:
                continue
            u = self._memoised(state, run)
            if u is None or u.slack <= 0:
                continue  # no safe capacity fits it, or it is urgent: served above
            horizon = (u.time_left - u.margin - u.overhead) * _BACKLOG_HORIZON_FRAC
            queued.append((horizon, scale * u.remaining * run.job.gpu_demand, u.delay, run))
        if not queued:
            return 0.0, None, []
        queued.sort(key=lambda q: (q[0], q[3].job.submit_time))
        order = [q[3] for q in queued]
        capacity, idle = _fleet_gpus(state)
        if sum(r.job.gpu_demand for r in order) <= idle:
            return 0.0, None, order  # it can all start on what is idle: holding it is the policy's choice
        held = _Holdings(self._running_left(state))
        work = 0.0
        worst, binding = 0.0, None
        for horizon, w, delay, run in queued:
            work += w
            if horizon <= delay:
                continue  # bought capacity would come too late for it
            short = (work + held.until(horizon) - capacity * horizon) / (horizon - delay)
            if short > worst:
                worst, binding = short, run
        return worst, binding, order

    @staticmethod
    def _work_scale(state: ClusterState) -> float:
        """What the backlog test multiplies queued estimates by: ``exp(log_error)`` (1 with true durations)."""
        return 1.0 if state.estimator.oracle else math.exp(state.estimator.log_error)

    def _running_left(self, state: ClusterState) -> Iterator[tuple[float, float]]:
        """``(estimated seconds left, GPUs held)`` of every running job."""
        est = state.estimator.estimate
        for run in state.running.values():
            progress = progress_now(run, state.time)
            yield max(believed_work(est(run.job), progress) - progress, 0.0), run.job.gpu_demand

    def _backlog(self, state: ClusterState) -> Iterator[Decision]:
        """When the fleet is short (:meth:`backlog_shortfall`): use idle safe capacity, buy the rest.

        Every queued deadline job then counts as urgent for *placement*: earliest deadline
        first, each goes on ready on-prem/on-demand capacity it fits (no preemption, no spot),
        so paid nodes do not idle while the backlog that needs them waits for cheaper ones.
        The shortfall is bought as on-demand (spot when no on-demand can grow, as the last
        resort), in the pool that fits the job the shortfall binds at.
        """
        short, binding, order = self.backlog_shortfall(state)
        if binding is None:
            return
        free = sum(p.free_whole_gpus() for p in state.pools.values() if p.spec.kind is not PoolKind.SPOT)
        for run in order:
            if free <= 0:
                break
            if run.job.job_id not in state.queue:
                continue
            place = _safe_place(state, run)
            if place is not None:
                free -= run.job.num_gpus
                yield place
        pool = _growable_pool(state, binding, PoolKind.ONDEMAND)
        if pool is None and self.switches.spot_last_resort and binding.job.preemptible:
            pool = _growable_pool(state, binding, PoolKind.SPOT)
        if pool is None:
            return
        nodes = min(math.ceil(short / pool.spec.gpus_per_node), headroom(state, pool), self.max_step)
        if nodes > 0:
            yield Scale(pool.name, nodes)

    def victims(self, state: ClusterState, u: Urgency) -> list[JobRun]:
        """Running jobs to suspend so that urgent ``u`` can start now (empty: no room can be made).

        Only when nothing else can take ``u`` (no safe capacity ready or coming, no spot).
        A victim is preemptible, runs on whole GPUs in a pool ``u`` may use, and can
        afford to wait: after ``u``'s estimated run (plus a restart) it would still not be
        urgent itself - so the guard never trades one miss for another by its own
        estimates, and a victim cannot turn around and preempt ``u``. ``u`` itself must
        still be able to finish by its deadline if started now (by the same estimates): a
        job the estimates call hopeless is not worth another job's restart.

        Room is made where ``u`` will be placed: on one node for a job that fits a node
        (victims running only on that node), anywhere in one pool for a gang job larger
        than a node (any victims in the pool, their GPUs plus the pool's free ones). In
        each such room as few GPUs as possible are suspended - one victim that suffices,
        else the largest first until the request is covered. Among rooms: safe capacity
        before spot, fewest GPUs suspended, fewest victims, then most slack. Suspensions
        are graceful (a checkpoint first), so a victim loses no work, only a restart
        overhead.
        """
        job = u.run.job
        if job.fractional or u.hopeless:
            return []
        hold = u.hold  # how long it would keep its victims waiting
        rooms: dict[tuple[str, str], list[tuple[JobRun, float]]] = {}
        for other in state.running.values():
            ojob = other.job
            pl = other.placement
            if not ojob.preemptible or pl is None or pl.slice_start is not None or ojob.fractional:
                continue
            spec = state.pools[pl.pool].spec
            if spec.sharing is not Sharing.EXCLUSIVE or not fits_pool_spec(job, spec):
                continue
            if spec.kind is PoolKind.SPOT and not job.preemptible:
                continue
            if job.num_gpus > spec.gpus_per_node:
                room = ("pool", pl.pool)
            else:
                nodes = {node_id for node_id, _ in pl.gpus}
                if len(nodes) != 1:
                    continue
                room = ("node", next(iter(nodes)))
            if ojob.deadline is not None:
                ov = self._memoised(state, other)
                if ov is None or ov.slack - hold - self.restart_overhead_s < 0:
                    continue
                slack = ov.slack
            else:
                slack = math.inf
            rooms.setdefault(room, []).append((other, slack))
        best: list[JobRun] = []
        best_key: tuple[float, ...] | None = None
        for (where, name), eligible in rooms.items():
            if where == "pool":  # a gang: free GPUs anywhere on the pool's ready nodes
                pool = state.pools[name]
                free = pool.free_whole_gpus()
            else:
                pool = state.pools[state.nodes[name].pool]
                free = state.nodes[name].free_whole
            chosen = fewest_gpus(eligible, job.num_gpus - free)
            if not chosen:
                continue
            if where == "pool" and not gang_fits_after(pool, job, state.time, _freed_per_node(chosen)):
                continue  # enough GPUs, but not a legal gang place (the pool's gang rule): suspend nobody
            key = (1.0 if pool.spec.kind is PoolKind.SPOT else 0.0, float(sum(held_gpus(v) for v in chosen)),
                   float(len(chosen)), -min(s for _, s in chosen))
            if best_key is None or key < best_key:
                best, best_key = [r for r, _ in chosen], key
        return best


def _growable_pool(state: ClusterState, run: JobRun, kind: PoolKind) -> Pool | None:
    """The cheapest pool of ``kind`` that fits ``run`` and may still grow or is growing (quickest on ties)."""
    best: Pool | None = None
    key = (math.inf, math.inf)
    for pool in state.pools.values():
        if pool.spec.kind is not kind or not fits_pool_spec(run.job, pool.spec):
            continue
        if headroom(state, pool) <= 0 and pool.provisioning_gpus() <= 0:
            continue
        q = state.quotes.get(pool.name)
        k = (q.price_per_gpu_hour if q else 0.0, pool.spec.provision_delay_s)
        if k < key:
            best, key = pool, k
    return best


def _safe_place(state: ClusterState, run: JobRun) -> Place | None:
    """``run`` placed on ready on-prem or on-demand capacity (first fit, cheapest pool first), if it fits."""
    target = place_in_tiers(state, run, [[PoolKind.ONPREM], [PoolKind.ONDEMAND]])
    return None if target is None else Place(run.job.job_id, target)


def _want(state: ClusterState, run: JobRun, kind: PoolKind, demand: dict[str, float]) -> bool:
    """Add ``run``'s GPUs to the demand of the cheapest pool of ``kind`` that can grow for it (False: none)."""
    pool = _growable_pool(state, run, kind)
    if pool is None:
        return False
    demand[pool.name] = demand.get(pool.name, 0.0) + run.job.gpu_demand
    return True


def spot_can_hold_gang(state: ClusterState, run: JobRun) -> bool:
    """Could a spot pool give preemptible ``run`` its room without waiting for other jobs to leave?

    True for a job that fits on one node of a spot pool that admits it (a node is freed
    or bought quickly), and for a gang whose room a spot pool can assemble from the nodes
    it holds empty (ready without jobs, or provisioning) plus the nodes it may still buy
    (its maximum, and the market's availability). Also True when no spot pool admits
    ``run`` at all: then it is not waiting for spot. False: every spot pool that admits
    it is too full of other jobs to assemble its room, so waiting for spot means waiting
    for the pool to drain while other work keeps arriving there.
    """
    job = run.job
    admitted = False
    for pool in state.pools.values():
        spec = pool.spec
        if spec.kind is not PoolKind.SPOT or spec.sharing is not Sharing.EXCLUSIVE or not fits_pool_spec(job, spec):
            continue
        admitted = True
        if job.num_gpus <= spec.gpus_per_node:
            return True
        empty = sum(1 for n in pool.nodes.values()
                    if n.status is NodeStatus.PROVISIONING or (n.ready and not n.jobs))
        if empty + headroom(state, pool) >= math.ceil(job.num_gpus / spec.gpus_per_node):
            return True
    return not admitted


def _fleet_gpus(state: ClusterState) -> tuple[float, float]:
    """``(GPUs ready or provisioning, of them free: idle on ready nodes or still provisioning)``."""
    coming = sum(p.provisioning_gpus() for p in state.pools.values())
    idle = sum(p.free_whole_gpus() for p in state.pools.values())
    return float(state.capacity_gpus() + coming), float(idle + coming)


class _Holdings:
    """What running jobs hold of the fleet over the next ``T`` seconds, ``B(T) = sum g_i min(t_i, T)``.

    Built once per decision point from each job's ``(estimated seconds left t_i, GPUs g_i)``;
    :meth:`until` is then a binary search over prefix sums, so the backlog test stays
    O((queue + running) log) however many prefixes it checks.
    """

    __slots__ = ("_ends", "_gpus_after", "_work_before")

    def __init__(self, running: Iterator[tuple[float, float]]) -> None:
        held = sorted(running)
        self._ends = [t for t, _ in held]
        self._gpus_after = [0.0] * (len(held) + 1)  # GPUs held by the jobs from i on
        self._work_before = [0.0] * (len(held) + 1)  # GPU-seconds of the jobs before i
        for i in range(len(held) - 1, -1, -1):
            self._gpus_after[i] = self._gpus_after[i + 1] + held[i][1]
        for i, (t, g) in enumerate(held):
            self._work_before[i + 1] = self._work_before[i] + t * g

    def until(self, horizon: float) -> float:
        """GPU-seconds the running jobs hold between now and ``horizon`` seconds from now."""
        i = bisect.bisect_right(self._ends, horizon)
        return self._work_before[i] + self._gpus_after[i] * horizon


def _freed_per_node(victims: list[tuple[JobRun, float]]) -> dict[str, int]:
    """GPUs the victims ``(run, merit)`` would free on each node."""
    out: dict[str, int] = {}
    for run, _ in victims:
        for node_id, _gi in run.placement.gpus if run.placement is not None else ():
            out[node_id] = out.get(node_id, 0) + 1
    return out
