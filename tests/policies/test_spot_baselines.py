"""Cost baselines on constructed markets whose right answer is known by hand.

Each case replays a tiny workload on fixed spot/on-demand prices (and, where it
matters, scripted spot lifetimes or availability) and checks that every baseline
makes the choice its definition implies, with costs computed by hand.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import pytest
from sim.helpers import FakeMarket, job, pool

import rlsched.policies.heuristics.spot
import rlsched.policies.heuristics.uniform_progress  # noqa: F401
from rlsched.cluster.decisions import Decision, Place, Preempt
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, JobRun, PoolKind, PoolSpec
from rlsched.cluster.scheduler import Scheduler
from rlsched.policies import available, make_policy
from rlsched.policies.heuristics.uniform_progress import UniformProgress, progress_view
from rlsched.sim.engine import Engine, SimConfig
from rlsched.sim.job_report import JOB_REPORT_COLUMNS, write_job_report
from rlsched.sim.metrics import Report

BASELINES = ("ondemand-static", "ondemand-autoscale", "spot-greedy", "spot-fallback", "uniform-progress")
SPOT_USERS = ("spot-greedy", "spot-fallback", "uniform-progress")
SPOT_P, OD_P = 1.0, 3.0  # USD per GPU-hour


class PricedMarket(FakeMarket):
    """FakeMarket with a spot price and a different on-demand price."""

    def __init__(self, spot: float = SPOT_P, ondemand: float = OD_P, **kw: object) -> None:
        super().__init__(price=spot, **kw)  # type: ignore[arg-type]
        self.spot, self.od = spot, ondemand

    def price(self, pool: PoolSpec, t: float) -> float:
        return self.spot if pool.kind is PoolKind.SPOT else self.od

    def ondemand_price(self, pool: PoolSpec, t: float) -> float:
        return self.od

    def cost(self, pool: PoolSpec, t0: float, t1: float) -> float:
        return self.price(pool, t0) * (t1 - t0) / 3600.0


class Recorder:
    """Logs every decision of the wrapped scheduler with its time."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.name = inner.name
        self.log: list[tuple[float, Decision]] = []

    def reset(self, state: ClusterState) -> None:
        self.inner.reset(state)

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        for d in self.inner.decide(state):
            self.log.append((state.time, d))
            yield d

    def pools_of(self, job_id: str) -> list[tuple[float, str]]:
        return [(t, d.placement.pool) for t, d in self.log if isinstance(d, Place) and d.job_id == job_id]


def _hybrid(spot_nodes: int = 2, od_nodes: int = 2, gpus: int = 1, delay: float = 0.0,
            idle: float = 600.0) -> list[PoolSpec]:
    return [pool("spot", kind=PoolKind.SPOT, nodes=spot_nodes, gpus=gpus, delay=delay, idle=idle),
            pool("od", kind=PoolKind.ONDEMAND, nodes=od_nodes, gpus=gpus, delay=delay, idle=idle)]


def _run(pools: list[PoolSpec], jobs: list[Job], name: str, market: FakeMarket,
         **cfg: object) -> tuple[Engine, Report, Recorder]:
    rec = Recorder(make_policy(name))
    e = Engine(pools, jobs, market, SimConfig(**cfg))  # type: ignore[arg-type]
    return e, e.run(rec), rec


# --------------------------------------------------------------------------- registry


def test_baselines_are_registered() -> None:
    names = available()
    for name in BASELINES:
        assert name in names
        p = make_policy(name)
        assert p.name == name
        assert isinstance(p, Scheduler)


# --------------------------------------------------------------------------- (a) cheap spot, no deadlines


@pytest.mark.parametrize("name", BASELINES)
def test_a_spot_users_take_cheap_spot_ondemand_only_never_do(name: str) -> None:
    """Two 1-GPU preemptible 1 h jobs, no deadlines, spot at 1/3 of on-demand, nothing reclaimed."""
    jobs = [job("a", 0, 3600, preemptible=True), job("b", 0, 3600, preemptible=True)]
    _e, r, rec = _run(_hybrid(), jobs, name, PricedMarket())
    assert r.jobs_completed == 2 and r.deadline_misses == 0
    used = {p for j in ("a", "b") for _, p in rec.pools_of(j)}
    if name in SPOT_USERS:
        assert used == {"spot"}
        assert r.cost_spot_usd == pytest.approx(2 * SPOT_P * 1.0)  # 2 GPUs x 1 h
        assert r.cost_ondemand_usd == 0.0
    else:
        assert used == {"od"}
        assert r.cost_spot_usd == 0.0
        assert r.cost_ondemand_usd == pytest.approx(2 * OD_P * 1.0)  # max = 2 nodes, all busy
    assert r.mean_jct_s == pytest.approx(3600.0)


def test_a_non_preemptible_jobs_never_touch_spot() -> None:
    jobs = [job("n", 0, 3600)]
    for name in SPOT_USERS:
        _, r, rec = _run(_hybrid(), jobs, name, PricedMarket())
        assert [p for _, p in rec.pools_of("n")] == ["od"]
        assert r.cost_spot_usd == 0.0


# --------------------------------------------------------------------------- (b) tight deadline, known reclaims


def _deadline_case(name: str) -> tuple[Engine, Report, Recorder]:
    """W = 1000 s, deadline 2000 s, no checkpoints; every bought spot node lives 900 s (twice).

    spot-greedy: spot 0-900 (reclaimed, all 900 s lost), spot again 900-1800 (lost
    again), then 1060 s (work + 60 s restart overhead) -> finishes 2860 > 2000: late.
    uniform-progress: at 900 its progress is -60 (overhead to repay) against a line
    at 450: behind, so on-demand from 900 -> finishes 1960 <= 2000.
    """
    jobs = [job("j", 0, 1000, preemptible=True, deadline=2000.0, checkpoint_interval=0.0)]
    market = PricedMarket(lifetimes=[900.0, 900.0])
    return _run(_hybrid(spot_nodes=1, od_nodes=1), jobs, name, market, oracle_durations=True)


def test_b_uniform_progress_switches_to_ondemand_when_behind_and_meets_the_deadline() -> None:
    e, r, rec = _deadline_case("uniform-progress")
    assert rec.pools_of("j") == [(0.0, "spot"), (900.0, "od")]
    run = e.runs["j"]
    assert run.finish_time == pytest.approx(1960.0)
    assert r.deadline_misses == 0 and r.restarts == 1
    assert r.lost_gpu_hours == pytest.approx(900.0 / 3600.0)
    assert r.cost_spot_usd == pytest.approx(SPOT_P * 900 / 3600)
    assert r.cost_ondemand_usd == pytest.approx(OD_P * 1060 / 3600)


def test_b_spot_greedy_goes_back_to_spot_and_misses() -> None:
    e, r, rec = _deadline_case("spot-greedy")
    assert rec.pools_of("j") == [(0.0, "spot"), (900.0, "spot"), (1800.0, "spot")]
    assert e.runs["j"].finish_time == pytest.approx(2860.0)
    assert r.deadline_misses == 1 and r.restarts == 2
    # 900 s lost at the first reclaim; 900 - 60 (overhead repaid, not work) at the second.
    assert r.lost_gpu_hours == pytest.approx((900.0 + 840.0) / 3600.0)
    assert r.cost_ondemand_usd == 0.0


def test_b_uniform_progress_migrates_a_running_spot_job_whose_slack_runs_out() -> None:
    """Checkpoints every 1000 s: at t = 941 the un-checkpointed 941 s plus the 60 s overhead
    exceed the 1000 s of slack, so the job is moved (gracefully) to on-demand and finishes
    at 941 + 60 + 59 = 1060 instead of risking the reclaim at 1000. The on-demand pool keeps
    one node up (min 1): a job is only moved onto capacity that is free at that moment."""
    jobs = [job("j", 0, 1000, preemptible=True, deadline=2000.0, checkpoint_interval=1000.0)]
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=1, gpus=1), pool("od", kind=PoolKind.ONDEMAND, nodes=1, lo=1)]
    e, r, rec = _run(pools, jobs, "uniform-progress",
                     PricedMarket(lifetimes=[1000.0]), oracle_durations=True)
    preempts = [(t, d) for t, d in rec.log if isinstance(d, Preempt)]
    assert [t for t, _ in preempts] == [pytest.approx(941.0)]
    assert preempts[0][1].checkpoint
    assert [p for _, p in rec.pools_of("j")] == ["spot", "od"]
    assert r.deadline_misses == 0 and r.lost_gpu_hours == 0.0
    assert e.runs["j"].finish_time == pytest.approx(941.0 + 60.0 + 59.0)


# --------------------------------------------------------------------------- (c) spot withdrawn at once


@pytest.mark.parametrize("name", SPOT_USERS)
def test_c_spot_availability_drops_to_zero_everything_requeues_and_completes(name: str) -> None:
    """Four 1-GPU jobs on four spot nodes; at t = 1000 availability drops to 0 (all reclaimed).

    Checkpoints every 300 s: each job keeps 900 s, loses 100 s, repays 60 s of overhead
    and finishes the remaining 2160 s on on-demand (spot never comes back).
    """
    jobs = [job(f"j{i}", 0, 3000, preemptible=True, checkpoint_interval=300.0) for i in range(4)]
    market = PricedMarket(avail=[(0.0, 4), (1000.0, 0)])
    e, r, rec = _run(_hybrid(spot_nodes=4, od_nodes=4), jobs, name, market)
    assert r.jobs_completed == 4 and r.jobs_unschedulable == 0
    assert r.preemptions == 4 and r.restarts == 4
    assert r.lost_gpu_hours == pytest.approx(4 * 100 / 3600)
    for i in range(4):
        assert [p for _, p in rec.pools_of(f"j{i}")] == ["spot", "od"]
        assert e.runs[f"j{i}"].finish_time == pytest.approx(1000 + 60 + 2100)
    assert r.cost_spot_usd == pytest.approx(4 * SPOT_P * 1000 / 3600)
    assert r.cost_ondemand_usd == pytest.approx(4 * OD_P * 2160 / 3600)


# --------------------------------------------------------------------------- (d) static peak provisioning


def test_d_ondemand_static_holds_every_node_from_the_start() -> None:
    """3 on-demand nodes x 2 GPUs at $3/GPU-h held for the 2 h makespan: 3 x 2 x 3 x 2 = $36.

    Only one GPU is ever busy; the idle nodes are stopped by the engine after 600 s and
    re-bought in the same instant, so the bill is that of a fixed reservation.
    """
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=3, gpus=2), pool("od", kind=PoolKind.ONDEMAND, nodes=3, gpus=2)]
    jobs = [job("j", 0, 7200, preemptible=True)]
    _e, r, _rec = _run(pools, jobs, "ondemand-static", PricedMarket())
    assert r.makespan_s == pytest.approx(7200.0)
    assert r.cost_ondemand_usd == pytest.approx(3 * 2 * OD_P * 2.0)
    assert r.cost_spot_usd == 0.0
    # The first sample is taken at t = 0 before any decision; every later one shows 3 nodes.
    assert r.timeline.time_s[0] == 0.0 and set(r.timeline.nodes["od"][1:]) == {3}
    assert set(r.timeline.nodes["spot"]) == {0}


def test_d_ondemand_autoscale_buys_only_what_the_queue_needs() -> None:
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=3, gpus=2), pool("od", kind=PoolKind.ONDEMAND, nodes=3, gpus=2)]
    jobs = [job("j", 0, 7200, preemptible=True)]
    _, r, _ = _run(pools, jobs, "ondemand-autoscale", PricedMarket())
    assert r.cost_ondemand_usd == pytest.approx(1 * 2 * OD_P * 2.0)  # one 2-GPU node for 2 h
    assert r.cost_spot_usd == 0.0


# --------------------------------------------------------------------------- (e) the line itself


def test_e_progress_line_by_hand() -> None:
    # W = 1000 s, s = 0, D = 2000 s: the line has slope 1/2. At t = 800 it is at 400.
    on = progress_view(t=800, submit=0, deadline=2000, work=1000, progress=400, restart_cost=100)
    assert on.line == pytest.approx(400) and not on.behind and not on.exhausted
    assert on.kind is PoolKind.SPOT and on.slack == pytest.approx(600)
    behind = progress_view(t=800, submit=0, deadline=2000, work=1000, progress=399.9, restart_cost=100)
    assert behind.behind and behind.kind is PoolKind.ONDEMAND
    # Ahead of the line (700 > 650) but slack 2000 - 1300 - 300 = 400 < restart cost 450.
    late = progress_view(t=1300, submit=0, deadline=2000, work=1000, progress=700, restart_cost=450)
    assert not late.behind and late.exhausted and late.kind is PoolKind.ONDEMAND
    # Exactly enough slack for one restart is still spot.
    edge = progress_view(t=1300, submit=0, deadline=2000, work=1000, progress=700, restart_cost=400)
    assert not edge.exhausted and edge.kind is PoolKind.SPOT


def _state_with(run: JobRun, pools: list[PoolSpec]) -> ClusterState:
    st = ClusterState(pools)
    st.estimator.oracle = True
    st.enqueue(run)
    return st


def test_e_policy_applies_the_line_and_commits_for_good() -> None:
    """Queued job, W = 1000, D = 2000, on-demand delay 40 s, overhead 60 s: restart cost 100 s."""
    pools = _hybrid(delay=40.0)
    up = UniformProgress()
    run = JobRun(job=job("j", 0, 1000, preemptible=True, deadline=2000.0))
    st = _state_with(run, pools)
    up.reset(st)
    run.work_done = 400.0
    st.time = 800.0  # on the line
    assert up.kind_for(st, run) is PoolKind.SPOT
    st.time = 800.5  # line at 400.25: just behind
    assert up.kind_for(st, run) is PoolKind.ONDEMAND
    assert "j" not in up.committed  # behind, but slack 599.5 >= 100: not for good
    run.work_done = 700.0
    st.time = 1201.0  # line 600.5 < 700: ahead; slack 2000 - 1201 - 300 = 499 >= 100
    assert up.kind_for(st, run) is PoolKind.SPOT
    st.time = 1601.0  # slack 2000 - 1601 - 300 = 99 < 100: exhausted
    assert up.kind_for(st, run) is PoolKind.ONDEMAND and "j" in up.committed
    run.work_done = 990.0
    st.time = 1602.0  # far ahead again, but committed: on-demand for good
    assert up.kind_for(st, run) is PoolKind.ONDEMAND


def test_e_jobs_without_deadlines_behave_like_spot_fallback() -> None:
    jobs = [job("p", 0, 3600, preemptible=True), job("n", 0, 3600)]
    pools = [pool("od", kind=PoolKind.ONDEMAND, nodes=1, lo=1, gpus=1),
             pool("spot", kind=PoolKind.SPOT, nodes=1, lo=1, gpus=1)]
    for name in ("spot-fallback", "uniform-progress"):
        _, _r, rec = _run(pools, jobs, name, PricedMarket())
        assert {j: rec.pools_of(j)[0][1] for j in ("p", "n")} == {"p": "spot", "n": "od"}


def test_e_ahead_jobs_wait_for_spot_when_none_is_sold_until_the_line_catches_up() -> None:
    """No spot for sale: a job on its line waits (free) and goes on-demand once behind.

    W = 1000, D = 3000: at t = 0 progress 0 is on the line (spot, none for sale: wait);
    the line leaves 0 at once, so the job is behind at its wake-up one second later
    and buys on-demand. It is never placed at t = 0 on on-demand.
    """
    jobs = [job("j", 0, 1000, preemptible=True, deadline=3000.0)]
    market = PricedMarket(avail=[(0.0, 0)])
    _e, r, rec = _run(_hybrid(spot_nodes=1, od_nodes=1), jobs, "uniform-progress", market,
                     oracle_durations=True)
    assert [p for _, p in rec.pools_of("j")] == ["od"]
    assert r.deadline_misses == 0 and r.jobs_completed == 1
    start = rec.pools_of("j")[0][0]
    assert start == pytest.approx(1.0)  # the wake-up one second after the line moved


# --------------------------------------------------------------------------- per-job report


def test_job_report_rows_add_up_to_the_run_totals(tmp_path: Path) -> None:
    e, r, _ = _deadline_case("spot-greedy")
    path = tmp_path / "jobs.csv"
    assert write_job_report(e, path) == 1
    rows = list(csv.DictReader(path.open()))
    assert tuple(rows[0]) == JOB_REPORT_COLUMNS
    row = rows[0]
    assert row["job_id"] == "j" and row["met"] == "false" and row["on_spot"] == "true"
    assert int(row["restarts"]) == r.restarts == 2
    assert int(row["preemptions"]) == 2
    assert float(row["lost_gpu_hours"]) == pytest.approx(r.lost_gpu_hours)
    assert float(row["jct"]) == pytest.approx(2860.0)
    assert float(row["start"]) == 0.0 and float(row["deadline"]) == 2000.0

    e2, _, _ = _deadline_case("uniform-progress")
    write_job_report(e2, path)
    (row2,) = list(csv.DictReader(path.open()))
    assert row2["met"] == "true" and row2["on_spot"] == "false"


def test_job_report_marks_jobs_without_deadline_and_unfinished(tmp_path: Path) -> None:
    jobs = [job("a", 0, 100), job("b", 0, 10**6, deadline=500.0)]
    e = Engine([pool("on", nodes=2)], jobs, None, SimConfig(horizon_s=1000.0))
    e.run(make_policy("ondemand-autoscale"))
    write_job_report(e, tmp_path / "j.csv")
    rows = {r["job_id"]: r for r in csv.DictReader((tmp_path / "j.csv").open())}
    assert rows["a"]["met"] == "" and rows["a"]["finish"] == "100.000"
    assert rows["b"]["met"] == "false" and rows["b"]["finish"] == "" and rows["b"]["jct"] == ""
