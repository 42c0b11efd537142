"""The deadline guard on constructed clusters whose right answer is known by hand.

The numbers: a 1-GPU job with W = 1000 s (true durations, so the estimate is W),
submitted at 0 with deadline 4000 s: allowance 4000, margin max(0.25 x 4000, 300) =
1000, on-demand delay 40 s, restart overhead 60 s, so it needs 1000 + 40 + 60 + 1000 =
2100 s and turns urgent at 4000 - 2100 = 1900 s.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sim.helpers import FakeMarket, job, pool

from rlsched.cluster.decisions import Decision, Place, Preempt, Scale, WakeAt
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, JobRun, PoolKind, PoolSpec
from rlsched.policies.heuristics.spot import place_in_tiers
from rlsched.policies.rules.deadline_guard import DeadlineGuard, spot_can_hold_gang
from rlsched.sim.engine import Engine, SimConfig

URGENT_AT = 1900.0


def _hybrid(od_nodes: int = 1, spot_nodes: int = 1, delay: float = 40.0) -> list[PoolSpec]:
    return [pool("spot", kind=PoolKind.SPOT, nodes=spot_nodes, gpus=1, delay=delay),
            pool("od", kind=PoolKind.ONDEMAND, nodes=od_nodes, gpus=1, delay=delay)]


def _job(jid: str = "j", deadline: float = 4000.0, **kw: object) -> Job:
    return job(jid, 0, 1000, preemptible=True, deadline=deadline, **kw)


def _state(pools: list[PoolSpec], *jobs: Job) -> ClusterState:
    st = ClusterState(pools)
    st.estimator.oracle = True
    for j in jobs:
        st.enqueue(JobRun(job=j))
    return st


def _decide_applied(guard: DeadlineGuard, st: ClusterState) -> list[Decision]:
    """Run the guard as the engine does: each placement is applied before the next is computed."""
    out = []
    for d in guard.decide(st):
        out.append(d)
        if isinstance(d, Place):
            run = st.queue[d.job_id]
            st.allocate(run, d.placement)
            st.dequeue(d.job_id)
            st.running[d.job_id] = run
    return out


class SpotOnly:
    """A scheduler that waits for spot forever: places preemptible jobs on ready spot, never buys."""

    name = "spot-only"

    def reset(self, state: ClusterState) -> None:
        return None

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        for run in list(state.queue.values()):
            target = place_in_tiers(state, run, [[PoolKind.SPOT]])
            if target is not None:
                yield Place(run.job.job_id, target)


class Guarded:
    """``inner`` with a deadline guard in front (what PpoScheduler does with a model's guard)."""

    def __init__(self, inner: SpotOnly, guard: DeadlineGuard) -> None:
        self.inner, self.guard = inner, guard
        self.name = f"guarded-{inner.name}"
        self.log: list[tuple[float, Decision]] = []

    def reset(self, state: ClusterState) -> None:
        self.guard.reset(state)
        self.inner.reset(state)

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        for d in self.guard.decide(state):
            self.log.append((state.time, d))
            yield d
        yield from self.inner.decide(state)


# --------------------------------------------------------------------------- the rule


def test_urgency_by_hand() -> None:
    st = _state(_hybrid(), _job())
    u = DeadlineGuard().urgency(st, st.queue["j"])
    assert u is not None
    assert u.need == pytest.approx(2100.0)
    assert u.slack == pytest.approx(4000.0 - 2100.0)
    st.time = URGENT_AT
    assert DeadlineGuard().urgency(st, st.queue["j"]).slack == pytest.approx(0.0)  # type: ignore[union-attr]


def test_small_allowances_get_the_minimum_margin() -> None:
    # allowance 1200: 0.25 x 1200 = 300 = the floor; with a 600 s floor the floor wins
    st = _state(_hybrid(), _job(deadline=1200.0))
    assert DeadlineGuard().urgency(st, st.queue["j"]).need == pytest.approx(1000 + 40 + 60 + 300)  # type: ignore[union-attr]
    assert DeadlineGuard(min_margin_s=600).urgency(st, st.queue["j"]).need == pytest.approx(1700)  # type: ignore[union-attr]


def test_a_job_estimated_beyond_its_allowance_is_hopeless_unless_the_deadline_is_trusted() -> None:
    """W = 5000 s against a 4,000 s allowance: capped, it needs 4,000 + 60 > 4,000 s and is hopeless on
    arrival; trusting the deadline it needs 4,000 - 1,000 (the margin) = 3,000 s: urgent, not hopeless."""
    st = _state(_hybrid(), job("long", 0, 5000, preemptible=True, deadline=4000.0))
    capped = DeadlineGuard().urgency(st, st.queue["long"])
    trusted = DeadlineGuard(trust_deadline=True).urgency(st, st.queue["long"])
    assert capped is not None and trusted is not None
    assert (capped.remaining, capped.hopeless, capped.slack <= 0) == (4000.0, True, True)
    assert (trusted.remaining, trusted.hopeless, trusted.slack <= 0) == (3000.0, False, True)
    # an estimate below the allowance is taken as it is either way
    st = _state(_hybrid(), _job("short"))
    assert DeadlineGuard(trust_deadline=True).urgency(st, st.queue["short"]).remaining == 1000.0  # type: ignore[union-attr]


def test_remaining_work_counts_progress_and_is_capped_at_the_allowance() -> None:
    st = _state(_hybrid(), _job())
    run = st.queue["j"]
    run.work_done = 400.0  # requeued after 400 s of kept work
    assert DeadlineGuard().urgency(st, run).need == pytest.approx(600 + 40 + 60 + 1000)  # type: ignore[union-attr]
    # believed longer than the whole allowance: remaining capped at allowance - progress
    st2 = _state(_hybrid(), job("long", 0, 9000, preemptible=True, deadline=4000.0))
    assert DeadlineGuard().urgency(st2, st2.queue["long"]).need == pytest.approx(4000 + 40 + 60 + 1000)  # type: ignore[union-attr]


def test_jobs_without_deadline_or_safe_capacity_are_ignored() -> None:
    spot_only = [pool("spot", kind=PoolKind.SPOT, nodes=1, gpus=1)]
    st = _state(spot_only, _job())
    assert DeadlineGuard().urgency(st, st.queue["j"]) is None
    st2 = _state(_hybrid(), job("free", 0, 1000, preemptible=True))
    assert DeadlineGuard().urgency(st2, st2.queue["free"]) is None
    assert list(DeadlineGuard().decide(st2)) == []


def test_before_the_latest_safe_start_it_only_asks_to_be_woken() -> None:
    st = _state(_hybrid(), _job())
    got = list(DeadlineGuard().decide(st))
    assert got == [WakeAt(URGENT_AT + 1.0)]


def test_urgent_jobs_go_least_slack_first_to_ready_ondemand() -> None:
    pools = _hybrid(od_nodes=2)
    st = _state(pools, _job("late", deadline=3000.0), _job("later", deadline=3500.0))
    for _ in range(2):
        st.add_node("od", 0.0, 0.0)
    st.time = 2500.0  # both urgent (late at 900 + 1000 x ..., later at 1375 + ...)
    guard = DeadlineGuard()
    due, _ = guard.urgent(st)
    assert [u.run.job.job_id for u in due] == ["late", "later"]
    placed = [d for d in _decide_applied(guard, st) if isinstance(d, Place)]
    assert [(d.job_id, d.placement.pool) for d in placed] == [("late", "od"), ("later", "od")]


def test_urgent_job_without_ready_capacity_buys_ondemand_once() -> None:
    st = _state(_hybrid(od_nodes=4), _job("a"), _job("b"))
    st.time = 2500.0
    guard = DeadlineGuard()
    assert [d for d in guard.decide(st) if isinstance(d, Scale)] == [Scale("od", 2)]
    for _ in range(2):
        st.add_node("od", st.time, st.time + 40.0)  # what the engine does with that Scale
    assert [d for d in guard.decide(st) if isinstance(d, Scale)] == []  # provisioning covers both


def test_spot_is_the_last_resort_only_when_no_ondemand_can_come() -> None:
    st = _state(_hybrid(od_nodes=1), _job("a"), _job("b"))
    st.add_node("od", 0.0, 0.0)
    st.add_node("spot", 0.0, 0.0)
    st.time = 2500.0
    decisions = _decide_applied(DeadlineGuard(), st)
    places = {d.job_id: d.placement.pool for d in decisions if isinstance(d, Place)}
    assert places == {"a": "od", "b": "spot"}  # od full and at its maximum: b takes ready spot
    st2 = _state(_hybrid(od_nodes=1), _job("a"), _job("b"))
    st2.add_node("od", 0.0, 0.0)
    st2.add_node("spot", 0.0, 0.0)
    st2.time = 2500.0
    places2 = {d.job_id for d in _decide_applied(DeadlineGuard(spot_last_resort=False), st2) if isinstance(d, Place)}
    assert places2 == {"a"}


def test_spot_is_bought_as_the_last_resort_when_no_ondemand_can_come() -> None:
    """On-demand is full at its maximum and no spot node is ready: an urgent preemptible job
    has a spot node bought for it (waiting for on-demand that cannot come is a certain miss)."""
    st = _state(_hybrid(od_nodes=1, spot_nodes=2), _job("a"), _job("b"))
    st.add_node("od", 0.0, 0.0)
    st.time = 2500.0
    decisions = _decide_applied(DeadlineGuard(), st)
    assert next(d for d in decisions if isinstance(d, Place)).placement.pool == "od"
    assert [d for d in decisions if isinstance(d, Scale)] == [Scale("spot", 1)]
    st2 = _state(_hybrid(od_nodes=1, spot_nodes=2), _job("a"), _job("b"))
    st2.add_node("od", 0.0, 0.0)
    st2.time = 2500.0
    assert [d for d in _decide_applied(DeadlineGuard(spot_last_resort=False), st2) if isinstance(d, Scale)] == []


def _gang_fleet(spot_nodes: int = 2) -> list[PoolSpec]:
    """Nodes of one GPU, so a 2-GPU job is a gang of two whole nodes."""
    return [pool("spot", kind=PoolKind.SPOT, nodes=spot_nodes, gpus=1, delay=40.0),
            pool("od", kind=PoolKind.ONDEMAND, nodes=2, gpus=1, delay=40.0)]


def test_spot_can_hold_a_gang_only_with_room_to_assemble() -> None:
    gang = job("g", 0, 1000, n=2, preemptible=True, deadline=100_000.0)
    st = _state(_gang_fleet(), gang)
    assert spot_can_hold_gang(st, st.queue["g"])  # an empty pool that may buy both nodes
    busy = job("busy", 0, 50_000, preemptible=True)
    st.add_node("spot", 0.0, 0.0)
    run = JobRun(job=busy)
    st.allocate(run, place_in_tiers(st, run, [[PoolKind.SPOT]]))  # type: ignore[arg-type]
    st.running["busy"] = run
    assert spot_can_hold_gang(st, st.queue["g"]) is False  # one node busy, one left to buy: no room
    st3 = _state(_gang_fleet(spot_nodes=3), gang)
    st3.add_node("spot", 0.0, 0.0)
    run3 = JobRun(job=busy)
    st3.allocate(run3, place_in_tiers(st3, run3, [[PoolKind.SPOT]]))  # type: ignore[arg-type]
    st3.running["busy"] = run3
    st3.add_node("spot", 0.0, 100.0)  # provisioning: counts as empty room
    assert spot_can_hold_gang(st3, st3.queue["g"])  # one provisioning + one to buy
    small = _state(_gang_fleet(), job("s", 0, 1000, preemptible=True, deadline=100_000.0))
    assert spot_can_hold_gang(small, small.queue["s"])  # fits one node: never stranded
    safe = _state(_gang_fleet(), job("n", 0, 1000, n=2, deadline=100_000.0))
    assert spot_can_hold_gang(safe, safe.queue["n"])  # not preemptible: not waiting for spot


def test_a_gang_spot_cannot_hold_goes_to_ondemand_before_it_is_urgent() -> None:
    """Two long jobs hold the whole spot pool (at its maximum of two nodes) when two 2-GPU gangs
    arrive at 10 (W = 1,500, deadline 4,000). Each turns urgent at 4000 - (1500 + 40 + 60 +
    997.5) = 1,402.5, when the guard alone buys two on-demand nodes: the first gang runs
    1,443-2,943 and the second, waiting for those nodes, 2,943-4,443 - a miss. With
    ``gangs_off_spot`` both are stranded at once: the nodes are bought at 10, the first gang
    runs 50-1,550 and the second 1,550-3,050."""
    def replay(guard: DeadlineGuard) -> Engine:
        pools = [pool("spot", kind=PoolKind.SPOT, nodes=2, lo=2, gpus=1, delay=40.0),
                 pool("od", kind=PoolKind.ONDEMAND, nodes=2, gpus=1, delay=40.0)]
        jobs = [job("s1", 0, 100_000, preemptible=True), job("s2", 0, 100_000, preemptible=True),
                job("A", 10, 1500, n=2, preemptible=True, deadline=4000.0),
                job("B", 10, 1500, n=2, preemptible=True, deadline=4000.0)]
        e = Engine(pools, jobs, FakeMarket(price=1.0), SimConfig(oracle_durations=True))
        e.run(Guarded(SpotOnly(), guard))
        return e

    late = replay(DeadlineGuard())
    assert late.runs["A"].first_start == pytest.approx(1443.5)
    assert late.runs["B"].finish_time > 4000.0  # type: ignore[operator]
    early = replay(DeadlineGuard(gangs_off_spot=True))
    assert early.runs["A"].first_start == pytest.approx(50.0)
    assert early.runs["B"].finish_time == pytest.approx(3050.0)
    assert all(r.on_spot is False for r in (early.runs["A"], early.runs["B"]))


def test_bad_parameters_are_refused() -> None:
    for kw in ({"margin_frac": -0.1}, {"min_margin_s": -1.0}, {"restart_overhead_s": -1.0}, {"gangs_off_spot": 1},
               {"preempt": "yes"}, {"spot_last_resort": 1}, {"backlog_buy": "on"}, {"trust_deadline": 0}):
        with pytest.raises(ValueError):
            DeadlineGuard(**kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the backlog test
# 1-GPU jobs of W = 1000 s (true durations, so no inflation: exp(0) = 1), deadline 20,000 s: margin
# 0.25 x 20,000 = 5,000, so T = (20,000 - 5,000 - 60) / 2 = 7,470 s; on-demand delay 40 s. One ready
# on-demand GPU (C = 1). k such jobs need S = (1000 k + B - 7,470) / 7,430 more GPUs.
BACKLOG_T = 7470.0


def _backlog_state(*jobs: Job) -> ClusterState:
    st = _state([pool("od", kind=PoolKind.ONDEMAND, nodes=5, gpus=1, delay=40.0)], *jobs)
    st.add_node("od", 0.0, 0.0)
    return st


def _burst(k: int) -> list[Job]:
    return [_job(f"b{i:02d}", deadline=20000.0) for i in range(k)]


def test_backlog_shortfall_by_hand() -> None:
    guard = DeadlineGuard(backlog_buy=True)
    short, binding, order = guard.backlog_shortfall(_backlog_state(*_burst(7)))
    assert (short, binding) == (0.0, None) and len(order) == 7  # 7,000 GPU-s fit in 7,470 s on one GPU
    short, binding, order = guard.backlog_shortfall(_backlog_state(*_burst(20)))
    assert short == pytest.approx((20000.0 - BACKLOG_T) / (BACKLOG_T - 40.0))  # 1.686 GPUs
    assert binding is not None and binding.job.job_id == "b19"  # the last job binds: its prefix is the largest
    assert [r.job.job_id for r in order] == [f"b{i:02d}" for i in range(20)]  # equal deadlines: by submission


def test_running_jobs_hold_capacity_until_their_estimated_end() -> None:
    """A running job with 3,000 s left holds the one GPU for 3,000 of the 7,470 s: S grows by 3,000 / 7,430."""
    st = _backlog_state(job("long", 0, 3000), *_burst(20))
    run = st.queue["long"]
    target = place_in_tiers(st, run, [[PoolKind.ONDEMAND]])
    assert target is not None
    st.allocate(run, target)
    st.dequeue("long")
    st.running["long"] = run
    short, _, _ = DeadlineGuard(backlog_buy=True).backlog_shortfall(st)
    assert short == pytest.approx((20000.0 + 3000.0 - BACKLOG_T) / (BACKLOG_T - 40.0))  # 2.09 GPUs


def test_a_queue_that_fits_on_idle_gpus_is_never_short() -> None:
    """One 10,000 s job needs (10,000 - 7,470) / 7,430 more GPUs by the fluid test, but it could start now
    on the idle GPU: holding it is the policy's choice, not a shortfall."""
    big = job("big", 0, 10000, preemptible=True, deadline=20000.0)
    assert DeadlineGuard(backlog_buy=True).backlog_shortfall(_backlog_state(big))[:2] == (0.0, None)
    st = _backlog_state(big, _job("small", deadline=20000.0))  # two queued GPUs, one idle: now it is short
    short, binding, _ = DeadlineGuard(backlog_buy=True).backlog_shortfall(st)
    assert binding is not None and short == pytest.approx((11000.0 - BACKLOG_T) / (BACKLOG_T - 40.0))


def test_a_short_fleet_places_the_backlog_on_idle_safe_capacity_and_buys_the_rest() -> None:
    st = _backlog_state(*_burst(20))
    acts = [d for d in _decide_applied(DeadlineGuard(backlog_buy=True), st) if not isinstance(d, WakeAt)]
    assert [type(d).__name__ for d in acts] == ["Place", "Scale"]
    assert isinstance(acts[0], Place) and acts[0].job_id == "b00"  # the earliest deadline, on the idle node
    assert acts[1] == Scale("od", 2)  # ceil(1.686 GPUs / 1 GPU per node)
    # without the option, or with a fleet that suffices, nothing happens before the jobs turn urgent
    assert all(isinstance(d, WakeAt) for d in _decide_applied(DeadlineGuard(), _backlog_state(*_burst(20))))
    assert all(isinstance(d, WakeAt)
               for d in _decide_applied(DeadlineGuard(backlog_buy=True), _backlog_state(*_burst(7))))


# --------------------------------------------------------------------------- end to end


def test_a_scheduler_that_waits_for_spot_that_never_comes_meets_the_deadline_with_the_guard() -> None:
    """No spot is sold. Alone, the spot-only scheduler strands the job; guarded, the job is
    bought an on-demand node at 1901 (the wake-up after 1900), placed when it is ready at
    1941 and finishes at 2941 <= 4000."""
    market = FakeMarket(price=1.0, avail=[(0.0, 0)])
    alone = Engine(_hybrid(), [_job()], market, SimConfig(oracle_durations=True))
    r_alone = alone.run(SpotOnly())
    assert r_alone.jobs_completed == 0 and r_alone.deadline_misses == 1

    guarded = Guarded(SpotOnly(), DeadlineGuard())
    e = Engine(_hybrid(), [_job()], FakeMarket(price=1.0, avail=[(0.0, 0)]), SimConfig(oracle_durations=True))
    r = e.run(guarded)
    assert r.jobs_completed == 1 and r.deadline_misses == 0
    acts = [(t, d) for t, d in guarded.log if not isinstance(d, WakeAt)]
    assert acts[0] == (pytest.approx(URGENT_AT + 1.0), Scale("od", 1))
    assert acts[1][0] == pytest.approx(URGENT_AT + 41.0) and isinstance(acts[1][1], Place)
    assert acts[1][1].placement.pool == "od"
    assert e.runs["j"].finish_time == pytest.approx(URGENT_AT + 41.0 + 1000.0)


def test_with_spot_on_sale_the_guard_changes_nothing() -> None:
    """Spot is there at once: the job runs on spot from 0 and is never urgent."""
    guarded = Guarded(SpotOnly(), DeadlineGuard())
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=1, lo=1, gpus=1),
             pool("od", kind=PoolKind.ONDEMAND, nodes=1, gpus=1)]
    e = Engine(pools, [_job()], FakeMarket(price=1.0), SimConfig(oracle_durations=True))
    r = e.run(guarded)
    assert r.jobs_completed == 1 and r.cost_ondemand_usd == 0.0
    assert [d for _, d in guarded.log if not isinstance(d, WakeAt)] == []


# --------------------------------------------------------------------------- preemption (preempt=True)


def _fifo_guarded(guard: DeadlineGuard) -> Guarded:
    """A FIFO placer (any pool, first fit) behind the guard."""

    class Fifo(SpotOnly):
        name = "fifo"

        def decide(self, state: ClusterState) -> Iterator[Decision]:
            for run in list(state.queue.values()):
                target = place_in_tiers(state, run, [[PoolKind.ONPREM], [PoolKind.ONDEMAND], [PoolKind.SPOT]])
                if target is not None:
                    yield Place(run.job.job_id, target)

    return Guarded(Fifo(), guard)


def _one_held_node() -> list[PoolSpec]:
    return [pool("od", kind=PoolKind.ONDEMAND, nodes=1, lo=1, gpus=1)]


def _replay(jobs: list[Job], guard: DeadlineGuard, pools: list[PoolSpec] | None = None) -> tuple[Engine, Guarded]:
    g = _fifo_guarded(guard)
    e = Engine(pools or _one_held_node(), jobs, FakeMarket(price=1.0), SimConfig(oracle_durations=True))
    e.run(g)
    return e, g


def test_preempts_a_job_with_slack_for_an_urgent_one_nothing_else_can_take() -> None:
    """One on-demand node, held at its maximum, runs v (10,000 s, deadline 100,000) when u
    (1,000 s, deadline 3,100) arrives at 100. u needs 1000 + 60 + max(0.25 x 3000, 300) = 1,810 s:
    urgent at 1,290, woken at 1,291. Nothing can be bought, so the guard suspends v (it can
    afford u's 1,060 s) and u runs 1,291-2,291; v resumes from its checkpoint and finishes at
    2,291 + 60 (restart) + 8,709 = 11,060, well before its deadline."""
    jobs = [job("v", 0, 10_000, preemptible=True, deadline=100_000.0),
            job("u", 100, 1000, preemptible=True, deadline=3100.0)]
    e, g = _replay(jobs, DeadlineGuard(preempt=True))
    acts = [(t, type(d).__name__, getattr(d, "job_id", None)) for t, d in g.log if not isinstance(d, WakeAt)]
    assert acts == [(pytest.approx(1291.0), "Preempt", "v"), (pytest.approx(1291.0), "Place", "u")]
    assert e.runs["u"].finish_time == pytest.approx(2291.0)
    assert e.runs["v"].finish_time == pytest.approx(11_060.0)
    assert e.runs["v"].lost_gpu_seconds == 0.0 and e.runs["v"].restarts == 1
    r = e.report("t", 0.0)
    assert r.deadline_misses == 0
    # without preemption u waits for v and misses
    e2, _ = _replay(jobs, DeadlineGuard())
    assert e2.runs["u"].finish_time == pytest.approx(11_000.0)
    assert e2.report("t", 0.0).deadline_misses == 1


def test_never_trades_one_miss_for_another() -> None:
    """v's own deadline (10,900) leaves it 900 s of slack - less than u's 1,060 s: v is kept."""
    jobs = [job("v", 0, 10_000, preemptible=True, deadline=10_900.0),
            job("u", 100, 1000, preemptible=True, deadline=3100.0)]
    e, g = _replay(jobs, DeadlineGuard(preempt=True))
    assert not [d for _, d in g.log if isinstance(d, Preempt)]
    assert e.runs["v"].restarts == 0


def test_a_job_the_estimates_call_hopeless_preempts_nobody() -> None:
    """u (5,000 s) arrives at 100 with deadline 3,100: it cannot finish in time even if started now."""
    jobs = [job("v", 0, 10_000, preemptible=True, deadline=100_000.0),
            job("u", 100, 5000, preemptible=True, deadline=3100.0)]
    _, g = _replay(jobs, DeadlineGuard(preempt=True))
    assert not [d for _, d in g.log if isinstance(d, Preempt)]


def test_victims_that_cannot_make_room_or_may_not_be_stopped_are_skipped() -> None:
    """A non-preemptible job is never suspended; a 1-GPU victim cannot make room for a 2-GPU job."""
    jobs = [job("v", 0, 10_000, deadline=100_000.0),  # not preemptible
            job("u", 100, 1000, preemptible=True, deadline=3100.0)]
    _, g = _replay(jobs, DeadlineGuard(preempt=True))
    assert not [d for _, d in g.log if isinstance(d, Preempt)]
    # a 3-GPU node: "small" (1 GPU, preemptible) and "pinned" (2 GPUs, not preemptible); "big" needs 2
    st = _state([pool("od", kind=PoolKind.ONDEMAND, nodes=1, gpus=3)],
                job("big", 0, 1000, 2, preemptible=True, deadline=3000.0))
    st.add_node("od", 0.0, 0.0)
    for name, n, pre in (("small", 1, True), ("pinned", 2, False)):
        r = JobRun(job=job(name, 0, 10_000, n, preemptible=pre))
        st.enqueue(r)
        placement = place_in_tiers(st, r, [[PoolKind.ONDEMAND]])
        assert placement is not None
        st.allocate(r, placement)
        st.dequeue(name)
        st.running[name] = r
    st.time = 2000.0
    guard = DeadlineGuard(preempt=True)
    u = guard.urgency(st, st.queue["big"])
    assert u is not None and u.slack <= 0
    assert guard.victims(st, u) == []  # small's 1 GPU + 0 free < 2; pinned may not be stopped


def test_a_hopeless_job_does_not_stop_the_search_for_a_later_one_of_its_shape() -> None:
    """At 1,291 both h (hopeless: 400 s of allowance left it long ago) and u are urgent, h first
    (least slack). h would hold a victim 460 s, u 1,060 s; a failed search for h must not be
    remembered as "no victim for this shape", or u would be skipped and miss."""
    jobs = [job("v", 0, 10_000, preemptible=True, deadline=100_000.0),
            job("u", 100, 1000, preemptible=True, deadline=3100.0),
            job("h", 1000, 500, preemptible=True, deadline=1400.0)]
    e, g = _replay(jobs, DeadlineGuard(preempt=True))
    acts = [(t, type(d).__name__, getattr(d, "job_id", None)) for t, d in g.log if not isinstance(d, WakeAt)]
    assert acts[:2] == [(pytest.approx(1291.0), "Preempt", "v"), (pytest.approx(1291.0), "Place", "u")]
    assert e.runs["u"].finish_time == pytest.approx(2291.0)


def _acts(g: Guarded) -> list[tuple[float, str, str | None]]:
    return [(t, type(d).__name__, getattr(d, "job_id", None)) for t, d in g.log if not isinstance(d, WakeAt)]


def test_a_gang_job_larger_than_a_node_gets_room_across_the_pool() -> None:
    """Two held 2-GPU nodes: v1 (2 GPUs) fills node 0, v2 (1 GPU) half of node 1. The 3-GPU gang
    job u (1,000 s, deadline 3,100) turns urgent at 1,291 with one GPU free: no single node can
    ever hold it, so room is made in the pool - v1 alone covers the two missing GPUs (v2 would
    not), and u runs on node 0's two GPUs plus node 1's free one. v1 resumes when u is done."""
    pools = [pool("od", kind=PoolKind.ONDEMAND, nodes=2, lo=2, gpus=2)]
    jobs = [job("v1", 0, 10_000, 2, preemptible=True),
            job("v2", 0, 10_000, 1, preemptible=True),
            job("u", 100, 1000, 3, preemptible=True, deadline=3100.0)]
    e, g = _replay(jobs, DeadlineGuard(preempt=True), pools)
    assert _acts(g) == [(pytest.approx(1291.0), "Preempt", "v1"), (pytest.approx(1291.0), "Place", "u")]
    assert e.runs["u"].finish_time == pytest.approx(2291.0)
    assert e.runs["v1"].finish_time == pytest.approx(2291.0 + 60.0 + 10_000 - 1291.0)
    assert e.runs["v2"].restarts == 0 and e.runs["v1"].lost_gpu_seconds == 0.0
    assert e.report("t", 0.0).deadline_misses == 0


def test_a_gang_takes_as_many_victims_as_it_needs_largest_first() -> None:
    """Two 2-GPU nodes each run two 1-GPU jobs (a, b; c, d) and the 4-GPU gang u needs the
    whole pool: all four are suspended. When one of them cannot afford the wait (c, whose own
    deadline leaves no room for u's run) the gang cannot be made room for, and nobody is
    suspended for nothing: u misses, c does not."""
    pools = [pool("od", kind=PoolKind.ONDEMAND, nodes=2, lo=2, gpus=2)]
    jobs = [job(x, 0, 10_000, 1, preemptible=True) for x in "abcd"]
    jobs.append(job("u", 100, 1000, 4, preemptible=True, deadline=3100.0))
    e, g = _replay(jobs, DeadlineGuard(preempt=True), pools)
    assert sorted(j for _, kind, j in _acts(g) if kind == "Preempt") == ["a", "b", "c", "d"]
    assert e.runs["u"].finish_time == pytest.approx(2291.0)
    tight = [job(x, 0, 10_000, 1, preemptible=True) for x in "abd"]
    tight.insert(2, job("c", 0, 10_000, 1, preemptible=True, deadline=10_900.0))
    tight.append(job("u", 100, 1000, 4, preemptible=True, deadline=3100.0))
    e2, g2 = _replay(tight, DeadlineGuard(preempt=True), pools)
    assert not [d for _, d in g2.log if isinstance(d, Preempt)]
    assert e2.report("t", 0.0).deadline_misses == 1


def test_room_on_one_node_may_take_several_victims() -> None:
    """A job that fits a node gets room on one node: on a 4-GPU node running a (1 GPU), b (1) and
    c (2), the 3-GPU u suspends c and one of the 1-GPU jobs - no single victim covers 3 GPUs."""
    pools = [pool("od", kind=PoolKind.ONDEMAND, nodes=1, lo=1, gpus=4)]
    jobs = [job("a", 0, 10_000, 1, preemptible=True), job("b", 0, 10_000, 1, preemptible=True),
            job("c", 0, 10_000, 2, preemptible=True),
            job("u", 100, 1000, 3, preemptible=True, deadline=3100.0)]
    e, g = _replay(jobs, DeadlineGuard(preempt=True), pools)
    pre = [j for _, kind, j in _acts(g) if kind == "Preempt"]
    assert len(pre) == 2 and pre[0] == "c" and pre[1] in ("a", "b")
    assert e.runs["u"].finish_time == pytest.approx(2291.0)
    assert e.report("t", 0.0).deadline_misses == 0


def test_among_rooms_the_fewest_gpus_are_suspended() -> None:
    """Two 2-GPU nodes: node 0 runs one 2-GPU job, node 1 two 1-GPU jobs. A 1-GPU urgent job
    takes one 1-GPU victim on node 1, not the 2-GPU job."""
    pools = [pool("od", kind=PoolKind.ONDEMAND, nodes=2, lo=2, gpus=2)]
    jobs = [job("big", 0, 10_000, 2, preemptible=True),
            job("s1", 0, 10_000, 1, preemptible=True), job("s2", 0, 10_000, 1, preemptible=True),
            job("u", 100, 1000, 1, preemptible=True, deadline=3100.0)]
    _, g = _replay(jobs, DeadlineGuard(preempt=True), pools)
    pre = [j for _, kind, j in _acts(g) if kind == "Preempt"]
    assert len(pre) == 1 and pre[0] in ("s1", "s2")
