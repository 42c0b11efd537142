"""Heuristic teachers expressed in the codec's action space (for behaviour cloning).

DL2 warm-started its RL scheduler by imitating the incumbent. Our incumbent (and
the runtime fallback) is weighted-priority, so the default teacher picks, among
legal place actions, the window job with the highest ``0.6 x priority + 0.4 x wait``
score (normalised over the window) in the cheapest legal pool. The ``sjf`` teacher
picks the window job with the shortest *estimated* duration (the estimator every
scheduler sees, never the true one), oldest first on ties: a stronger starting
point on mean JCT that PPO then has to improve on. With nothing to place, both buy
one node in the cheapest elastic pool that can grow (when none is already
provisioning), else wait. Neither reconfigures MIG.

``sjf-spot-first`` is the cost-aware teacher of the spot experiment. Jobs *at risk* go
first, least deadline slack first, then the rest in SJF order. A job is at risk when it is
not preemptible, when its deadline slack is below its estimated remaining work plus the
on-demand provisioning delay, or when it has queued longer than ``max(estimate, 1 h)``
(spot that stays short that long is not coming soon enough). At-risk jobs try on-prem,
then on-demand, then spot; the others on-prem and spot only, and wait for spot rather
than buy or fill on-demand (waiting is legal while only on-demand capacity fits, so held
on-demand nodes drain and reach the idle stop). It buys spot while the window's relaxed demand
exceeds the spot pools' free and provisioning GPUs, and on-demand only for the window's
at-risk demand (the window is what the student observes); idle nodes are stopped by the
engine's idle-stop rule, so it never scales down.

``sjf-spot-reserve`` is ``sjf-spot-first`` made for bursts of deadline jobs that fill spot
(:func:`_reserve_risk`): a job no spot can come for goes first by its deadline and turns at
risk 30 minutes earlier, and "queued too long" counts only while on-demand has room for it
beyond the urgent jobs' demand. It is the teacher ``models/spot`` is anchored to.

With a codec that has preempt slots (``preempt_slots`` > 0), the ``follow:NAME`` teachers
also preempt as the ``preempt_long`` rule decides
(:class:`~rlsched.policies.rules.preempt_long.LongJobPreemption`, default parameters):
when none of the nominees can be placed and a blocked one waits behind running jobs whose
believed remaining work is far longer, they preempt the rule's first victim for it if
that job is in a running slot. Without preempt slots they act exactly as before.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rlsched.cluster.model import ClusterState, JobRun, NodeStatus, Pool, PoolKind
from rlsched.policies.heuristics.spot import obtainable

if TYPE_CHECKING:
    from rlsched.envs.codec import ObservationCodec

#: teacher names accepted by ``bc.teacher`` in an experiment file (plus ``follow:NAME`` for a nominator NAME)
TEACHERS = ("weighted-priority", "sjf", "sjf-spot-first", "sjf-spot-reserve", "best-follow", "lookahead")
#: the cost-aware teachers of spot fleets (each is a baseline beside a model taught by any of them)
SPOT_TEACHERS = ("sjf-spot-first", "sjf-spot-reserve")
#: teachers that pick among the follow teachers (per world, per state) rather than act themselves
PICKERS = ("best-follow", "lookahead")
#: ``follow:NAME`` teaches "place what heuristic NAME would place next" through a nominating codec
FOLLOW = "follow:"


def is_teacher(rule: str, nominators: tuple[str, ...] = ()) -> bool:
    """Whether ``rule`` names a teacher usable with a codec nominating with ``nominators``."""
    if rule.startswith(FOLLOW):
        return rule[len(FOLLOW):] in nominators
    if rule in PICKERS:
        return bool(nominators)
    return rule in TEACHERS


def acts_itself(rule: str, nominators: tuple[str, ...] = ()) -> bool:
    """Whether ``rule`` is a teacher that chooses actions itself with such a codec (not a picker among
    follow teachers): what a :class:`~rlsched.train.teacher.TeacherScheduler` runs and a codec anchors to."""
    return is_teacher(rule, nominators) and rule not in PICKERS


def acting_teachers() -> list[str]:
    """The :data:`TEACHERS` that act themselves (error messages list them)."""
    return [t for t in TEACHERS if t not in PICKERS]


def with_spot_teachers(taught: list[str]) -> list[str]:
    """``taught`` and, when any of it is a spot teacher, every other :data:`SPOT_TEACHERS` after it.

    A model of one spot teacher faces them all as baselines (the family benchmark, the cost report, the
    training run's final evaluation): a model of a newer teacher must still beat the older one.
    """
    if not any(t in SPOT_TEACHERS for t in taught):
        return list(taught)
    return [*taught, *(t for t in SPOT_TEACHERS if t not in taught)]


#: a job without a deadline counts as at risk after queueing this long (or its estimate, if longer)
AT_RISK_WAIT_S = 3600.0


def at_risk(run: JobRun, estimate: float, now: float, ondemand_delay_s: float) -> bool:
    """Whether a queued job should be given on-demand capacity (see the module doc)."""
    return urgent(run, estimate, now, ondemand_delay_s) or waited_too_long(run, estimate, now)


def urgent(run: JobRun, estimate: float, now: float, ondemand_delay_s: float) -> bool:
    """At risk whatever the queue: not preemptible, or too little deadline slack to wait for spot."""
    job = run.job
    if not job.preemptible:
        return True
    remaining = max(estimate - run.work_done, 0.0)
    return job.deadline is not None and job.deadline - now - remaining < remaining + ondemand_delay_s


def waited_too_long(run: JobRun, estimate: float, now: float) -> bool:
    """Queued longer than ``max(estimate, 1 h)``: spot that stays short that long is not coming soon."""
    return run.queued_s + (now - run.enqueued_at) > max(estimate, AT_RISK_WAIT_S)


def ondemand_room(state: ClusterState, pools: list[Pool]) -> int:
    """On-demand GPUs a queued job could still get: free, provisioning, and not yet bought (``pools``'s)."""
    room = 0
    for pool in pools:
        if pool.spec.kind is PoolKind.ONDEMAND:
            room += pool.free_whole_gpus() + pool.provisioning_gpus()
            room += max(pool.spec.max_nodes - len(pool.nodes), 0) * pool.spec.gpus_per_node
    return room


#: pool order of the spot-first teacher: on-prem, then spot, then on-demand (cheapest first within a kind)
_KIND_RANK = {PoolKind.ONPREM: 0, PoolKind.SPOT: 1, PoolKind.ONDEMAND: 2}


def _price(state: ClusterState, pool: Pool) -> float:
    """A pool's current price per GPU-hour (0 without a quote: on-prem)."""
    q = state.quotes.get(pool.name)
    return q.price_per_gpu_hour if q else 0.0


#: ``sjf-spot-reserve``: a job no spot can come for turns at risk this much earlier
STUCK_EARLY_S = 1800.0


def _reserve_risk(state: ClusterState, pools: list[Pool], runs: list[JobRun], now: float,
                  ondemand_delay_s: float) -> tuple[list[bool], list[bool]]:
    """``sjf-spot-reserve``'s at-risk flags and its go-first flags for the window ``runs``.

    Three changes to ``sjf-spot-first``'s rule, each for what it does in a burst of deadline
    jobs that fills spot (BENCHMARKS.md, "A teacher for bursts"):

    * a job that no spot can come for (:func:`~rlsched.policies.heuristics.spot.obtainable`: no
      spot pool it fits has headroom or nodes provisioning) goes first, least slack first, even
      before it is at risk: its wait for spot has no end in sight, so its deadline orders it;
    * such a job also turns at risk :data:`STUCK_EARLY_S` earlier, so it may buy or take
      on-demand before the burst's other jobs turn urgent with it;
    * the "queued longer than max(estimate, 1 h)" clause holds only while the on-demand pools'
      free, provisioning and unbought GPUs, less the window's urgent demand, still fit the job:
      in a burst, jobs that merely waited must not take the on-demand capacity urgent ones need.
    """
    est = state.estimator.estimate
    estimates = [est(r.job) for r in runs]
    stuck = [not obtainable(state, r, PoolKind.SPOT) for r in runs]
    must = [urgent(r, e, now, ondemand_delay_s + (STUCK_EARLY_S if s else 0.0))
            for r, e, s in zip(runs, estimates, stuck, strict=True)]
    spare = ondemand_room(state, pools) - sum(r.job.gpu_demand for r, m in zip(runs, must, strict=True) if m)
    risky = [m or (r.job.gpu_demand <= spare and waited_too_long(r, e, now))
             for r, e, m in zip(runs, estimates, must, strict=True)]
    return risky, [r or s for r, s in zip(risky, stuck, strict=True)]


def _spot_first_action(codec: ObservationCodec, state: ClusterState, mask: np.ndarray, reserve: bool = False) -> int:
    p_slots = codec.max_pools
    pools = list(state.pools.values())[:p_slots]
    now = state.time
    est = state.estimator.estimate
    od_delay = min((p.spec.provision_delay_s for p in pools if p.spec.kind is PoolKind.ONDEMAND), default=0.0)
    runs = codec.window_runs(state)
    order = sorted(range(len(pools)), key=lambda p: (
        _KIND_RANK[pools[p].spec.kind], _price(state, pools[p])))
    if reserve:
        risky, first = _reserve_risk(state, pools, runs, now, od_delay)
    else:
        risky = [at_risk(r, est(r.job), now, od_delay) for r in runs]
        first = risky

    def slack(i: int) -> float:
        dl = runs[i].job.deadline
        return math.inf if dl is None else dl - now - max(est(runs[i].job) - runs[i].work_done, 0.0)

    # At-risk jobs first, least slack first (earliest-deadline style); then SJF, oldest first on ties.
    ranked = sorted(range(len(runs)), key=lambda i: (
        (0, slack(i), runs[i].job.submit_time) if first[i] else (1, est(runs[i].job), runs[i].job.submit_time), i))
    # Waiting is illegal while a window job fits on-prem or spot capacity (the mask), so a first pass
    # that places nothing means only held on-demand capacity fits. Relaxed jobs then wait for spot -
    # unless waiting is masked because nothing is left to happen (it would strand the queue; see
    # ObservationCodec.unstranded): the second pass fills on-demand then.
    # At-risk jobs try on-demand before spot: a reclaim would cost them the deadline.
    risky_order = sorted(order, key=lambda p: pools[p].spec.kind is PoolKind.SPOT)
    for strict in (True, False):
        for k in ranked:
            for p in (risky_order if risky[k] else order):
                if strict and pools[p].spec.kind is PoolKind.ONDEMAND and not risky[k]:
                    continue
                a = k * p_slots + p
                if mask[a]:
                    return a
        if mask[codec.wait_action]:
            break
    # Buying: spot for the preemptible demand, on-demand only for at-risk demand - of the window's
    # jobs only: a teacher should decide from what the student observes, or cloning cannot match it
    # (a first version counted the whole queue; its clone agreed on 94% of decisions yet missed 15x
    # the deadlines, the disagreements being exactly these buys).
    want = {PoolKind.SPOT: 0.0, PoolKind.ONDEMAND: 0.0}
    for run, risky_run in zip(runs, risky, strict=True):
        want[PoolKind.ONDEMAND if risky_run else PoolKind.SPOT] += run.job.gpu_demand
    for kind in (PoolKind.SPOT, PoolKind.ONDEMAND):
        mine = [p for p in order if pools[p].spec.kind is kind]
        have = sum(pools[p].free_whole_gpus() + pools[p].provisioning_gpus() for p in mine)
        if want[kind] > have:
            for p in mine:
                a = codec.scale_offset + 2 * p
                if mask[a]:
                    return a
    if reserve and not mask[codec.wait_action]:
        return _unstranding_action(codec, mask, order)
    return codec.wait_action


def _unstranding_action(codec: ObservationCodec, mask: np.ndarray, order: list[int]) -> int:
    """A legal action where waiting is not: one node of the first pool in ``order`` that may grow, else the
    first legal action.

    Waiting is masked where nothing is left to happen (:meth:`~rlsched.envs.codec.ObservationCodec.unstranded`):
    it would strand the queue. ``sjf-spot-first`` still answers "wait" there; run as a scheduler, that ends
    the decision point, but an anchored network cannot take it, and its own scores choose instead.
    ``sjf-spot-reserve`` answers with a legal action, so network and teacher agree everywhere.
    """
    for p in order:
        a = codec.scale_offset + 2 * p
        if mask[a]:
            return a
    return int(np.flatnonzero(mask)[0])


def _follow_action(codec: ObservationCodec, state: ClusterState, mask: np.ndarray, name: str) -> int:
    """Place the job heuristic ``name`` nominated first (its next placement), in the cheapest legal pool.

    With nothing of its nominees placeable, it buys or waits like the other teachers.
    """
    nomination = codec.nomination
    if nomination is None or name not in nomination.names:
        raise ValueError(f"teacher follow:{name} needs a codec nominating with {name!r}")
    col = codec.nomination_columns(state)[:, nomination.names.index(name)]
    p_slots = codec.max_pools
    pools = list(state.pools.values())[:p_slots]
    order = sorted(range(len(pools)), key=lambda p: (0, 0.0) if pools[p].spec.kind is PoolKind.ONPREM
                   else (1, _price(state, pools[p])))
    for k in np.argsort(-col, kind="stable"):
        if col[k] <= 0.0:
            break
        for p in order:
            a = int(k) * p_slots + p
            if mask[a]:
                return a
    if codec.preempt_slots:
        window = codec.window_runs(state)
        nominees = [window[int(k)] for k in np.argsort(-col, kind="stable") if col[k] > 0.0 and k < len(window)]
        preempt = _preempt_long_action(codec, state, mask, nominees)
        if preempt is not None:
            return preempt
    resplit = _mig_resplit(codec, state, mask, pools, [r for r, c in zip(codec.window_runs(state), col, strict=False)
                                                       if c > 0.0])
    if resplit is not None:
        return resplit
    return _buy_or_wait(codec, state, mask, pools, order)


def _preempt_long_action(codec: ObservationCodec, state: ClusterState, mask: np.ndarray,
                         nominees: list[JobRun]) -> int | None:
    """Preempt the ``preempt_long`` rule's first victim for the first blocked nominee it finds one for.

    None when no nominee has victims, or the victim is not in a running slot, or the mask
    refuses the action (nothing blocked, preemption not trained).
    """
    from rlsched.policies.rules.preempt_long import LongJobPreemption

    rule = LongJobPreemption()
    slot_of = {r.job.job_id: i for i, r in enumerate(codec.running_runs(state))}
    if not slot_of:
        return None
    for run in nominees:
        if LongJobPreemption._fits_now(state, run):
            continue
        room = rule.victims(state, run)
        if room is None:
            continue
        i = slot_of.get(room[1][0].job.job_id)
        if i is not None and mask[codec.preempt_offset + i]:
            return codec.preempt_offset + i
    return None


def _mig_resplit(codec: ObservationCodec, state: ClusterState, mask: np.ndarray, pools: list[Pool],
                 blocked: list[JobRun]) -> int | None:
    """The heuristics' dynamic MIG re-split for ``blocked``, as a legal codec action (None: none).

    A heuristic re-splits at most one GPU per (pool, layout) per pass, and its next pass
    comes with the next event - the re-split finishing is one. The teacher decides at
    every step without time moving, so a re-split still in progress must count as that
    pass's: otherwise each step re-splits one more idle GPU for the same blocked job.
    """
    from rlsched.cluster.decisions import Reconfigure
    from rlsched.policies.heuristics.queue import mig_reconfigurations

    n_l = codec.layouts
    if not n_l:
        return None
    now = state.time
    for d in mig_reconfigurations(state, blocked):
        if not isinstance(d, Reconfigure):
            continue
        target = tuple(sorted(d.layout))
        for p, pool in enumerate(pools):
            if d.node_id not in pool.nodes:
                continue
            if any(g.busy_until > now and tuple(sorted(sl.profile.name for sl in g.slices)) == target
                   for node in pool.nodes.values() for g in node.gpus):
                break  # this layout is already on its way in this pool
            for li, lay in enumerate(codec.layouts_of(pool)):
                if lay is not None and tuple(sorted(lay)) == target:
                    a = codec.reconfigure_offset + p * n_l + li
                    if mask[a]:
                        return a
    return None


def _buy_or_wait(codec: ObservationCodec, state: ClusterState, mask: np.ndarray, pools: list[Pool],
                 order: list[int]) -> int:
    """With nothing placeable: one node of the cheapest elastic pool if none provisions, else wait."""
    if not any(n.status is NodeStatus.PROVISIONING for n in state.nodes.values()):
        for p in order:
            if pools[p].spec.kind is PoolKind.ONPREM:
                continue
            a = codec.scale_offset + 2 * p
            if mask[a]:
                return a
    return codec.wait_action


def teacher_action(codec: ObservationCodec, state: ClusterState, mask: np.ndarray,
                   w_priority: float = 0.6, w_wait: float = 0.4, rule: str = "weighted-priority") -> int:
    """The teacher's choice (``rule``: one of :data:`TEACHERS` or ``follow:NAME``) among the legal actions."""
    if rule.startswith(FOLLOW):
        return _follow_action(codec, state, mask, rule[len(FOLLOW):])
    if not acts_itself(rule):
        raise ValueError(f"unknown teacher {rule!r} (one of {', '.join(acting_teachers())}, follow:NAME)")
    if rule in SPOT_TEACHERS:
        return _spot_first_action(codec, state, mask, reserve=rule == "sjf-spot-reserve")
    k_slots, p_slots = codec.window, codec.max_pools
    runs = codec.window_runs(state)
    pools = list(state.pools.values())[:p_slots]

    def pool_cost(p: int) -> tuple[int, float]:
        pool = pools[p]
        return (0, 0.0) if pool.spec.kind is PoolKind.ONPREM else (1, _price(state, pool))

    order = sorted(range(len(pools)), key=pool_cost)
    if runs:
        now = state.time
        prios = [r.job.priority for r in runs]
        waits = [now - r.job.submit_time for r in runs]
        pmin, pmax, wmax = min(prios), max(prios), max(waits)
        if rule == "sjf":
            est = state.estimator.estimate
            # highest score first: shortest estimate, then the longest wait, then slot order
            scores = [(-est(r.job), w, -i) for i, (r, w) in enumerate(zip(runs, waits, strict=True))]
        else:
            scores = [
                (w_priority * ((p - pmin) / (pmax - pmin) if pmax > pmin else 0.0)
                 + w_wait * (w / wmax if wmax > 0 else 0.0), 0.0, -i)
                for i, (p, w) in enumerate(zip(prios, waits, strict=True))
            ]
        for *_, neg_i in sorted(scores, reverse=True):
            k = -neg_i
            for p in order:
                a = k * p_slots + p
                if mask[a]:
                    return a
        # nothing placeable: buy capacity if no pool is already provisioning
        return _buy_or_wait(codec, state, mask, pools, order)
    del k_slots
    return codec.wait_action
