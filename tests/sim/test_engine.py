"""The discrete-event engine: determinism, conservation, sharing, reclaims, costs, utilisation."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rlsched.cluster.decisions import Decision, Place, Preempt, Reconfigure, Scale, WakeAt
from rlsched.cluster.feasibility import candidates
from rlsched.cluster.model import ClusterState, NodeStatus, PoolKind, RunState, Sharing
from rlsched.cluster.shorthand import parse_cluster
from rlsched.market import default_market
from rlsched.policies import make_policy
from rlsched.sim.engine import Engine, SimConfig
from rlsched.sim.metrics import RESULT_KEYS, Report
from rlsched.workload import load_trace

from .helpers import FakeMarket, Greedy, job, pool

DATA = Path(__file__).resolve().parents[1] / "data"


def _conserved(engine: Engine, report: Report) -> None:
    total = len(engine.jobs)
    assert report.jobs_completed + report.jobs_unschedulable + report.jobs_skipped == total
    states = [r.state for r in engine.runs.values()]
    assert len(states) == total
    assert all(s in (RunState.DONE, RunState.UNSCHEDULABLE, RunState.SKIPPED) for s in states)
    assert states.count(RunState.DONE) == report.jobs_completed
    assert not engine.state.queue and not engine.state.running
    for r in engine.finished:
        assert r.finish_time is not None and r.finish_time >= r.job.submit_time + r.job.duration - 1e-6


def _result(report: Report) -> dict[str, object]:
    d = report.result()
    d.pop("wall_s")
    return d


# --------------------------------------------------------------------------- determinism


def _hybrid_run(seed: int, n_jobs: int = 80) -> tuple[Engine, Report]:
    pools = parse_cluster("2x8xA100-80GB,spot:1-3x8xA100-80GB,ondemand:0-2x8xA100-80GB")
    market = default_market()
    market.check_pools(pools)
    jobs = [replace(j, preemptible=True) for j in load_trace(str(DATA / "philly_slice.csv")).jobs[:n_jobs]]
    engine = Engine(pools, jobs, market, SimConfig(seed=seed))
    return engine, engine.run(make_policy("spot-fallback"))


def test_same_seed_same_report_and_timeline() -> None:
    e1, r1 = _hybrid_run(0)
    e2, r2 = _hybrid_run(0)
    assert _result(r1) == _result(r2)
    assert r1.timeline == r2.timeline
    assert r1.sim_events == r2.sim_events
    assert {k: (r.finish_time, r.preemptions) for k, r in e1.runs.items()} == {
        k: (r.finish_time, r.preemptions) for k, r in e2.runs.items()}
    assert len(r1.timeline.time_s) > 2
    _conserved(e1, r1)
    assert set(RESULT_KEYS) == set(r1.result())


class _ExpMarket(FakeMarket):
    """Fixed price; spot lifetimes drawn from the engine's seeded generator (mean 2 h)."""

    def sample_lifetime(self, pool, rng):  # type: ignore[no-untyped-def]
        return float(rng.exponential(7200.0))


def _reclaiming_run(seed: int) -> tuple[Engine, Report]:
    pools = parse_cluster("1x8xA100-80GB,spot:2-4x8xA100-80GB/delay=120,ondemand:0-2x8xA100-80GB/delay=120")
    jobs = [replace(j, preemptible=True) for j in load_trace(str(DATA / "philly_slice.csv")).jobs[:80]
            if j.num_gpus <= 8]
    engine = Engine(pools, jobs, _ExpMarket(price=1.0), SimConfig(seed=seed))
    return engine, engine.run(make_policy("spot-fallback"))


def test_determinism_with_random_reclaims() -> None:
    e1, r1 = _reclaiming_run(0)
    _, r2 = _reclaiming_run(0)
    assert r1.preemptions > 0, "the scenario must exercise reclaims"
    assert _result(r1) == _result(r2)
    assert r1.timeline == r2.timeline
    _conserved(e1, r1)
    assert r1.jobs_completed == len(e1.jobs)
    assert r1.refused_decisions == 0
    # Another seed gives other lifetimes, hence other reclaims.
    _, r3 = _reclaiming_run(1)
    assert (r3.preemptions, r3.lost_gpu_hours, r3.cost_usd) != (r1.preemptions, r1.lost_gpu_hours, r1.cost_usd)


def test_reset_replays_identically() -> None:
    e, r1 = _hybrid_run(3, n_jobs=40)
    e.reset()
    r2 = e.run(make_policy("spot-fallback"))
    assert _result(r1) == _result(r2)


def test_spot_lifetimes_depend_on_the_seed() -> None:
    pools = parse_cluster("spot:4-4x8xA100-80GB")
    market = default_market()
    probe = Engine(pools, [job("a", 0, 10, preemptible=True)], market, SimConfig(seed=0))
    assert market.sample_lifetime(pools[0], probe.rng) is not None, "the default market reclaims A100 spot nodes"

    def reclaims(seed: int) -> list[float | None]:
        e = Engine(pools, [job("a", 0, 10, preemptible=True)], market, SimConfig(seed=seed))
        return sorted(n.reclaim_at for n in e.state.nodes.values())  # type: ignore[type-var]

    assert reclaims(0) == reclaims(0)
    assert all(t is not None and t > 0 for t in reclaims(0))
    assert reclaims(0) != reclaims(1)


# --------------------------------------------------------------------------- conservation, admission


def test_unschedulable_and_skipped_jobs_are_counted() -> None:
    pools = [pool("p", nodes=2, gpus=4)]
    jobs = [job("ok", 0, 100, 2), job("big", 1, 100, 9), job("cpu", 2, 100, 0), job("ok2", 3, 50, 8),
            job("h100", 4, 10, 1, gpu_models=frozenset({"H100-80GB"}))]
    e = Engine(pools, jobs)
    r = e.run(Greedy())
    _conserved(e, r)
    assert (r.jobs_completed, r.jobs_unschedulable, r.jobs_skipped) == (2, 2, 1)
    assert e.runs["big"].state is RunState.UNSCHEDULABLE
    assert "9 GPUs" in e.runs["big"].reason
    assert "H100-80GB" in e.runs["h100"].reason
    assert sum(r.unschedulable_reasons.values()) == 2
    assert e.runs["cpu"].state is RunState.SKIPPED
    assert r.skipped_reasons == {e.runs["cpu"].reason: 1}
    # The 8-GPU job spans both nodes (gang) once the 2-GPU job is gone.
    assert e.runs["ok2"].finish_time == pytest.approx(150.0)


def test_single_job_jct_equals_duration() -> None:
    e = Engine([pool("p", nodes=1, gpus=8)], [job("a", 1000.0, 3600.0, 4)])
    r = e.run(Greedy())
    assert r.jobs_completed == 1
    assert r.mean_jct_s == pytest.approx(3600.0)
    assert r.mean_wait_s == pytest.approx(0.0)
    assert r.makespan_s == pytest.approx(3600.0)
    assert r.gpu_utilization == pytest.approx(0.5)
    assert r.cost_usd == 0.0 and r.preemptions == 0 and r.lost_gpu_hours == 0.0


def test_duplicate_job_ids_are_rejected() -> None:
    e = Engine([pool("p")], [job("a", 0, 1), job("a", 1, 1)])
    with pytest.raises(ValueError, match="duplicate"):
        e.run(Greedy())


def test_refused_decisions_are_counted_and_not_applied() -> None:
    def hook(state: ClusterState) -> Iterator[Decision]:
        if state.time == 0.0:
            yield Place("nope", next(iter(candidates(state, job("x", 0, 1)))))
            yield Scale("p", 1)  # on-prem
            yield WakeAt(0.0)  # not in the future
            yield Preempt("nobody")

    e = Engine([pool("p")], [job("a", 0, 10)])
    r = e.run(Greedy(hook=hook))
    assert r.refused_decisions == 4
    assert e.refusals == {"Place": 1, "Scale": 1, "WakeAt": 1, "Preempt": 1}
    assert r.jobs_completed == 1


# --------------------------------------------------------------------------- sharing


def test_time_slicing_two_overlapping_jobs_take_twice_as_long() -> None:
    e = Engine([pool("ts", sharing=Sharing.TIMESLICE, replicas=2)], [job("a", 0, 100), job("b", 0, 100)])
    r = e.run(Greedy())
    assert e.runs["a"].finish_time == pytest.approx(200.0)
    assert e.runs["b"].finish_time == pytest.approx(200.0)
    assert r.mean_jct_s == pytest.approx(200.0)
    assert r.gpu_utilization == pytest.approx(1.0)


def test_time_slicing_partial_overlap() -> None:
    # a alone for 50 s (50 done), shared at half speed until a finishes at 150 (b has 50 done),
    # then b alone for its last 50 s.
    e = Engine([pool("ts", sharing=Sharing.TIMESLICE, replicas=2)], [job("a", 0, 100), job("b", 50, 100)])
    e.run(Greedy())
    assert e.runs["a"].finish_time == pytest.approx(150.0)
    assert e.runs["b"].finish_time == pytest.approx(200.0)


def test_time_slicing_replica_limit_queues_the_third_job() -> None:
    e = Engine([pool("ts", sharing=Sharing.TIMESLICE, replicas=2)],
               [job("a", 0, 100), job("b", 0, 100), job("c", 0, 100)])
    e.run(Greedy())
    assert e.runs["c"].first_start == pytest.approx(200.0)
    assert e.runs["c"].finish_time == pytest.approx(300.0)


def test_mig_fractional_jobs_share_one_gpu() -> None:
    layout = ("1g.10gb",) * 7
    jobs = [job(f"f{i}", 0, 100, 1, gpu_milli=100) for i in range(8)]
    e = Engine([pool("mig", sharing=Sharing.MIG, layout=layout)], jobs)
    r = e.run(Greedy())
    starts = sorted(run.first_start for run in e.runs.values())  # type: ignore[type-var]
    assert starts == [0.0] * 7 + [100.0]
    held = {run.placement for run in e.runs.values()}
    assert held == {None}
    assert r.makespan_s == pytest.approx(200.0)
    # 7/7 of the GPU for 100 s, then 1/7 for 100 s.
    assert r.gpu_utilization == pytest.approx((100 * 1.0 + 100 / 7) / 200)


def test_mig_utilisation_counts_compute_share() -> None:
    e = Engine([pool("mig", sharing=Sharing.MIG, layout=("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"))],
               [job("f", 0, 100, 1, gpu_milli=143)])
    r = e.run(Greedy())
    assert r.gpu_utilization == pytest.approx(1 / 7)
    assert e.runs["f"].finish_time == pytest.approx(100.0)


def test_mig_reconfigure_blocks_then_serves_new_profile() -> None:
    seen: list[tuple[float, int]] = []

    def hook(state: ClusterState) -> Iterator[Decision]:
        node = next(iter(state.nodes.values()))
        gpu = node.gpus[0]
        for run in state.queue.values():
            seen.append((state.time, len(candidates(state, run.job))))
        if state.queue and gpu.layout() != ("7g.80gb",) and gpu.idle():
            yield Reconfigure(node.id, 0, ("7g.80gb",))

    cfg = SimConfig(mig_reconfig_s=45.0)
    e = Engine([pool("mig", sharing=Sharing.MIG, layout=("1g.10gb",) * 7)], [job("w", 0, 100, 1)], config=cfg)
    g = Greedy(hook=hook)
    r = e.run(g)
    assert r.refused_decisions == 0
    assert seen[0] == (0.0, 0)  # nothing fits before the reconfiguration
    assert 45.0 in g.calls  # the end of the reconfiguration is a decision point
    assert e.runs["w"].first_start == pytest.approx(45.0)
    assert e.runs["w"].finish_time == pytest.approx(145.0)
    assert e.runs["w"].profile is None  # released
    gpu = next(iter(e.state.nodes.values())).gpus[0]
    assert gpu.layout() == ("7g.80gb",)


def test_mig_reconfigured_gpu_accepts_nothing_meanwhile() -> None:
    # A fractional job arriving during the reconfiguration waits for its end.
    seen: dict[float, int] = {}

    def hook(state: ClusterState) -> Iterator[Decision]:
        node = next(iter(state.nodes.values()))
        if state.time == 0.0:
            yield Reconfigure(node.id, 0, ("3g.40gb", "3g.40gb"))
        for run in state.queue.values():
            seen[state.time] = len(candidates(state, run.job))

    cfg = SimConfig(mig_reconfig_s=60.0)
    e = Engine([pool("mig", sharing=Sharing.MIG, layout=("7g.80gb",))],
               [job("t", 0, 1, 1, gpu_milli=400), job("f", 10, 100, 1, gpu_milli=300)], config=cfg)
    r = e.run(Greedy(hook=hook))
    assert r.refused_decisions == 0
    assert seen[10.0] == 0
    assert e.runs["f"].first_start == pytest.approx(60.0)
    assert e.runs["f"].finish_time == pytest.approx(160.0)
    assert e.runs["t"].first_start == pytest.approx(60.0)  # both 3g instances serve at once
    assert e.runs["t"].finish_time == pytest.approx(61.0)


# --------------------------------------------------------------------------- preemption and checkpoints


def test_spot_reclaim_loses_work_since_last_checkpoint() -> None:
    # Node 1 (2 GPUs) is reclaimed at t=1000 with 1000 s of work done; checkpoints every 300 s keep 900.
    # The scheduler buys a new node (ready at 1100) which is never reclaimed; after the 60 s restart
    # overhead the job still needs 3000 - 900 + 60 = 2160 s and finishes at 3260.
    market = FakeMarket(price=2.0, lifetimes=[1000.0, 1e9])
    spot = pool("spot", kind=PoolKind.SPOT, nodes=1, lo=1, gpus=2, delay=100.0)
    cfg = SimConfig(checkpoint_interval_s=300.0, restart_overhead_s=60.0)
    e = Engine([spot], [job("j", 0, 3000, 2, preemptible=True)], market, cfg)
    r = e.run(Greedy(scale=["spot"]))
    run = e.runs["j"]
    assert run.state is RunState.DONE
    assert run.preemptions == 1 and run.restarts == 1
    assert r.preemptions == 1 and r.restarts == 1
    assert run.lost_gpu_seconds == pytest.approx(100.0 * 2)
    assert r.lost_gpu_hours == pytest.approx(200.0 / 3600.0)
    assert run.first_start == 0.0
    assert run.finish_time == pytest.approx(3260.0)
    assert run.checkpoint_at == pytest.approx(900.0)  # the kept checkpoint was written when work reached 900
    assert run.queued_s == pytest.approx(100.0)
    assert r.mean_wait_s == pytest.approx(100.0)
    # Cost: node 1 held 0..1000, node 2 requested at 1000 (provisioning is paid) and held to the end.
    assert r.cost_spot_usd == pytest.approx(2 * 2.0 * (1000.0 + 2260.0) / 3600.0)
    assert r.cost_usd == pytest.approx(r.cost_spot_usd)
    assert r.cost_ondemand_usd == 0.0
    # Utilisation: 2 GPUs busy whenever 2 GPUs are ready (the provisioning gap has no capacity).
    assert r.gpu_utilization == pytest.approx(1.0)


def test_job_checkpoint_interval_overrides_default() -> None:
    market = FakeMarket(lifetimes=[1000.0, 1e9])
    spot = pool("spot", kind=PoolKind.SPOT, nodes=1, lo=1, gpus=1, delay=1.0)
    cfg = SimConfig(checkpoint_interval_s=300.0, restart_overhead_s=0.0)
    e = Engine([spot], [job("j", 0, 3000, 1, preemptible=True, checkpoint_interval=400.0)], market, cfg)
    r = e.run(Greedy(scale=["spot"]))
    assert e.runs["j"].lost_gpu_seconds == pytest.approx(200.0)  # 1000 - 800
    assert e.runs["j"].finish_time == pytest.approx(1001.0 + 2200.0)
    assert r.jobs_completed == 1


def test_no_checkpoints_lose_everything() -> None:
    market = FakeMarket(lifetimes=[500.0, 1e9])
    spot = pool("spot", kind=PoolKind.SPOT, nodes=1, lo=1, gpus=1, delay=1.0)
    cfg = SimConfig(checkpoint_interval_s=0.0, restart_overhead_s=0.0)
    e = Engine([spot], [job("j", 0, 1000, 1, preemptible=True)], market, cfg)
    r = e.run(Greedy(scale=["spot"]))
    assert r.lost_gpu_hours == pytest.approx(500.0 / 3600)
    assert e.runs["j"].finish_time == pytest.approx(1501.0)


def test_checkpoint_survives_a_reclaim_during_restart_overhead() -> None:
    # Reclaimed at 1000 (900 kept, 100 lost), restarted at 1001 with work 840 (60 s reload overhead),
    # reclaimed again at 1041 while still reloading (work 880 < checkpoint 900): the 900 s checkpoint is
    # intact, so the job restarts at 1042 with 900 - 60 = 840 done and finishes at 1042 + 2160 = 3202.
    market = FakeMarket(lifetimes=[1000.0, 40.0, 1e9])
    spot = pool("spot", kind=PoolKind.SPOT, nodes=1, lo=1, gpus=1, delay=1.0)
    cfg = SimConfig(checkpoint_interval_s=300.0, restart_overhead_s=60.0)
    e = Engine([spot], [job("j", 0, 3000, 1, preemptible=True)], market, cfg)
    e.run(Greedy(scale=["spot"]))
    run = e.runs["j"]
    assert run.preemptions == 2
    assert run.checkpointed == pytest.approx(900.0)
    assert run.checkpoint_at == pytest.approx(900.0)  # the second reclaim wrote nothing newer
    assert run.finish_time == pytest.approx(3202.0)


def test_gang_job_reclaimed_on_one_node_releases_all_its_nodes() -> None:
    # A 4-GPU job on two 2-GPU spot nodes; node 1 dies at 500 (checkpoint at 400: 100 s x 4 GPUs lost).
    market = FakeMarket(price=1.0, lifetimes=[500.0, 1e9, 1e9])
    spot = pool("spot", kind=PoolKind.SPOT, nodes=3, lo=2, gpus=2, delay=1.0)
    cfg = SimConfig(checkpoint_interval_s=200.0, restart_overhead_s=0.0)
    e = Engine([spot], [job("g", 0, 1000, 4, preemptible=True)], market, cfg)
    r = e.run(Greedy(scale=["spot"]))
    run = e.runs["g"]
    assert run.preemptions == 1
    assert r.lost_gpu_hours == pytest.approx(400.0 / 3600)
    assert run.finish_time == pytest.approx(501.0 + 600.0)
    # Node 1: 0..500; node 2: 0..1101; node 3: 500..1101 (2 GPUs each).
    assert r.cost_spot_usd == pytest.approx(2 * (500.0 + 1101.0 + 601.0) / 3600.0)
    assert e.state.allocated == pytest.approx(0.0)


def test_spot_availability_drop_requeues_everything_and_run_completes() -> None:
    # Two spot nodes; availability drops to 0 at t=500 (never returns). Jobs requeue and finish on demand.
    market = FakeMarket(price=1.0, avail=[(0.0, 2), (500.0, 0)])
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=2, lo=2, gpus=1),
             pool("od", kind=PoolKind.ONDEMAND, nodes=2, gpus=1, delay=50.0)]
    jobs = [job("a", 0, 1000, 1, preemptible=True), job("b", 0, 1000, 1, preemptible=True),
            job("c", 0, 100, 1, preemptible=False)]
    cfg = SimConfig(checkpoint_interval_s=200.0, restart_overhead_s=0.0)
    e = Engine(pools, jobs, market, cfg)
    r = e.run(Greedy(scale=["od"]))
    _conserved(e, r)
    assert r.jobs_completed == 3
    assert r.preemptions == 2
    assert all(e.runs[j].preemptions == 1 for j in ("a", "b"))
    assert not e.state.pools["spot"].nodes
    # Each lost 500 - 400 = 100 s.
    assert r.lost_gpu_hours == pytest.approx(200.0 / 3600)
    assert e.refused == 0


def test_spot_availability_returning_wakes_the_scheduler() -> None:
    market = FakeMarket(avail=[(0.0, 2), (500.0, 0), (2000.0, 2)])
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=2, lo=0, gpus=1, delay=10.0)]
    jobs = [job("a", 0, 1000, 1, preemptible=True), job("b", 0, 1000, 1, preemptible=True)]
    g = Greedy(scale=["spot"])
    e = Engine(pools, jobs, market)
    r = e.run(g)
    assert 2000.0 in g.calls
    assert r.jobs_completed == 2


def test_graceful_priority_preemption_loses_no_work() -> None:
    def hook(state: ClusterState) -> Iterator[Decision]:
        if "hi" in state.queue and "lo" in state.running:
            yield Preempt("lo", reason="priority", checkpoint=True)
            yield Place("hi", candidates(state, state.queue["hi"].job)[0])

    cfg = SimConfig(restart_overhead_s=60.0, checkpoint_interval_s=1800.0)
    e = Engine([pool("p")], [job("lo", 0, 1000, priority=0), job("hi", 300, 100, priority=5)], config=cfg)
    r = e.run(Greedy(hook=hook))
    assert r.refused_decisions == 0
    assert r.lost_gpu_hours == 0.0
    assert r.preemptions == 1
    assert e.runs["hi"].finish_time == pytest.approx(400.0)
    # lo kept its 300 s and pays the 60 s restart overhead: 1000 - 300 + 60 = 760 s from 400.
    assert e.runs["lo"].finish_time == pytest.approx(1160.0)
    assert e.runs["lo"].queued_s == pytest.approx(100.0)
    assert e.runs["lo"].checkpoint_at == pytest.approx(300.0)  # a graceful stop checkpoints as it stops


def test_abrupt_preemption_loses_work_since_checkpoint() -> None:
    def hook(state: ClusterState) -> Iterator[Decision]:
        if "hi" in state.queue and "lo" in state.running:
            yield Preempt("lo", reason="kill", checkpoint=False)
            yield Place("hi", candidates(state, state.queue["hi"].job)[0])

    cfg = SimConfig(restart_overhead_s=60.0, checkpoint_interval_s=250.0)
    e = Engine([pool("p")], [job("lo", 0, 1000), job("hi", 300, 100)], config=cfg)
    r = e.run(Greedy(hook=hook))
    # 300 done, 250 checkpointed: 50 lost; lo restarts at 400 needing 1000 - 250 + 60 = 810.
    assert r.lost_gpu_hours == pytest.approx(50.0 / 3600)
    assert e.runs["lo"].finish_time == pytest.approx(1210.0)
    assert e.runs["lo"].checkpoint_at == pytest.approx(250.0)


# --------------------------------------------------------------------------- elastic pools and cost


def test_scale_up_has_the_provisioning_delay() -> None:
    od = pool("od", kind=PoolKind.ONDEMAND, nodes=2, gpus=1, delay=200.0, cost=3.0)
    e = Engine([od], [job("a", 0, 1000)])
    g = Greedy(scale=["od"])
    r = e.run(g)
    assert e.runs["a"].first_start == pytest.approx(200.0)
    assert e.runs["a"].finish_time == pytest.approx(1200.0)
    assert r.mean_wait_s == pytest.approx(200.0)
    assert 200.0 in g.calls  # node ready is a decision point
    assert r.cost_ondemand_usd == pytest.approx(3.0 * 1200.0 / 3600.0)
    assert r.gpu_utilization == pytest.approx(1.0)  # capacity counts only ready nodes


def test_idle_elastic_node_stops_and_is_charged_only_while_held() -> None:
    # a: request at 0, ready 200, runs 200..1200; idle stop at 1200 + 300 = 1500.
    # b: arrives at 3000, new node ready 3200, runs 3200..3700.
    od = pool("od", kind=PoolKind.ONDEMAND, nodes=2, gpus=2, delay=200.0, idle=300.0, cost=3.0)
    e = Engine([od], [job("a", 0, 1000), job("b", 3000, 500)])
    r = e.run(Greedy(scale=["od"]))
    assert e.runs["b"].first_start == pytest.approx(3200.0)
    held_s = 1500.0 + (3700.0 - 3000.0)
    assert r.cost_usd == pytest.approx(2 * 3.0 * held_s / 3600.0)
    assert r.cost_ondemand_usd == pytest.approx(r.cost_usd)
    # Utilisation: 1 of 2 GPUs busy over the ready time (200..1500 and 3200..3700).
    assert r.gpu_utilization == pytest.approx((1000 + 500) / (2 * (1300 + 500)))
    nodes = r.timeline.nodes["od"]
    assert max(nodes) == 1 and 0 in nodes


def test_min_nodes_are_never_idle_stopped() -> None:
    od = pool("od", kind=PoolKind.ONDEMAND, nodes=2, lo=1, gpus=1, idle=10.0, cost=1.0)
    e = Engine([od], [job("a", 0, 100), job("b", 5000, 100)])
    r = e.run(Greedy())
    assert e.runs["b"].first_start == pytest.approx(5000.0)
    assert r.cost_usd == pytest.approx(1.0 * 5100.0 / 3600.0)


def test_scale_down_stops_idle_and_provisioning_nodes_only() -> None:
    def hook(state: ClusterState) -> Iterator[Decision]:
        if state.time == 0.0:
            yield Scale("od", 2)  # two more, provisioning
        if state.time == 10.0:
            yield Scale("od", -5)

    od = pool("od", kind=PoolKind.ONDEMAND, nodes=4, lo=1, gpus=2, delay=100.0, cost=1.0)
    e = Engine([od], [job("a", 0, 1000), job("tick", 10, 1)])
    r = e.run(Greedy(hook=hook))
    assert r.refused_decisions == 0
    assert e.runs["tick"].finish_time == pytest.approx(11.0)
    # The busy min node survives; the two provisioning nodes were stopped at t=10.
    assert r.cost_usd == pytest.approx(2 * (1000.0 + 2 * 10.0) / 3600.0)
    assert all(n.status is NodeStatus.READY for n in e.state.nodes.values())


def test_spot_scale_respects_availability() -> None:
    def hook(state: ClusterState) -> Iterator[Decision]:
        if state.time == 0.0:
            yield Scale("spot", 5)

    market = FakeMarket(avail=[(0.0, 2)])
    e = Engine([pool("spot", kind=PoolKind.SPOT, nodes=8, gpus=1)], [job("a", 0, 10, preemptible=True)], market)
    e.run(Greedy(hook=hook))
    assert max(e.timeline.nodes["spot"]) == 2


def test_instant_scale_up_is_a_decision_point() -> None:
    pools = parse_cluster("ondemand:0-2x8xA100-80GB/cost=1/delay=0")
    e = Engine(pools, [job("a", 0, 100)])
    r = e.run(make_policy("fifo"))
    assert r.jobs_completed == 1
    assert e.runs["a"].finish_time == pytest.approx(100.0)


def test_zero_idle_stop_does_not_kill_fresh_nodes() -> None:
    od = pool("od", kind=PoolKind.ONDEMAND, nodes=1, gpus=1, delay=5.0, idle=0.0, cost=1.0)
    e = Engine([od], [job("a", 0, 10)])
    r = e.run(Greedy(scale=["od"], max_scales=3))
    assert r.jobs_completed == 1
    assert e.runs["a"].first_start == pytest.approx(5.0)


# --------------------------------------------------------------------------- utilisation


def test_utilisation_hand_computation() -> None:
    # a (1 GPU) runs 0..100; b (2 GPUs) must wait for it and runs 100..150: (100*1 + 50*2) / (150*2).
    e = Engine([pool("p", gpus=2)], [job("a", 0, 100, 1), job("b", 0, 50, 2)])
    r = e.run(Greedy())
    assert r.gpu_utilization == pytest.approx(200.0 / 300.0)
    assert r.makespan_s == pytest.approx(150.0)
    assert r.mean_jct_s == pytest.approx((100.0 + 150.0) / 2)
    assert r.mean_wait_s == pytest.approx(50.0)
    assert 0.0 < min(v for v in r.timeline.utilization if v > 0) <= max(r.timeline.utilization) <= 1.0


def test_deadline_misses() -> None:
    e = Engine([pool("p")], [job("a", 0, 100, deadline=150.0), job("b", 0, 100, deadline=150.0)])
    r = e.run(Greedy())
    assert r.deadline_misses == 1


def test_forecaster_hook_observes_arrivals_and_publishes_forecasts() -> None:
    """A fitted forecaster sees each arrival and its prediction reaches the state at decision points."""
    from rlsched.cluster import Job, parse_cluster
    from rlsched.policies import make_policy
    from rlsched.sim import Engine
    from rlsched.workload.forecast import SmoothedSeasonal

    history = [Job(f"h{i}", i * 600.0, 1800.0, 1) for i in range(24 * 6 * 3)]  # three days, one job per 10 min
    fc = SmoothedSeasonal()
    fc.fit(history)
    seen: list[float] = []

    class Spy:
        name = "spy"

        def __init__(self) -> None:
            self.inner = make_policy("fifo")

        def reset(self, state: object) -> None:
            self.inner.reset(state)  # type: ignore[arg-type]

        def decide(self, state: object):  # type: ignore[no-untyped-def]
            seen.append(state.demand_forecast.get("*", -1.0))  # type: ignore[attr-defined]
            yield from self.inner.decide(state)  # type: ignore[arg-type]

    jobs = [Job(f"j{i}", 3 * 86400.0 + i * 600.0, 1800.0, 1) for i in range(30)]
    eng = Engine(parse_cluster("1x8xA100-80GB"), jobs, forecaster=fc, forecast_horizon_s=3600.0)
    rep = eng.run(Spy())
    assert rep.jobs_completed == 30
    assert seen and all(v >= 0 for v in seen)
    # one 1-GPU job of 30 min every 10 min keeps ~3 GPUs busy: the forecast says so
    assert 1.5 < seen[-1] < 4.5
