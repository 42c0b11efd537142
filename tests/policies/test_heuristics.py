"""The heuristic schedulers: registry, each policy's distinctive choice, and end-to-end replays."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sim.helpers import FakeMarket, job, pool

from rlsched.cluster.decisions import Decision, Place, Preempt, Scale
from rlsched.cluster.model import ClusterState, PoolKind, RunState, Sharing
from rlsched.cluster.scheduler import Scheduler
from rlsched.cluster.shorthand import parse_cluster
from rlsched.errors import ScenarioError
from rlsched.market import default_market
from rlsched.policies import available, make_policy
from rlsched.sim.engine import Engine, SimConfig
from rlsched.sim.metrics import Report
from rlsched.workload import load_trace

DATA = Path(__file__).resolve().parents[1] / "data"
NAMES = ("weighted-priority", "fifo", "sjf", "tiresias", "best-fit", "fgd", "fair-share", "spot-fallback")
#: the spot-economics baselines (issue 6), registered alongside the queue heuristics
COST_BASELINES = ("ondemand-static", "ondemand-autoscale", "spot-greedy", "uniform-progress")


class Recorder:
    """Wraps a scheduler, logs every decision it yields and checks the cluster's books at each call."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.name = inner.name
        self.log: list[tuple[float, Decision]] = []

    def reset(self, state: ClusterState) -> None:
        self.inner.reset(state)

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        _books(state)
        for d in self.inner.decide(state):
            self.log.append((state.time, d))
            yield d

    def places(self) -> dict[str, list[tuple[float, str, tuple[str, ...]]]]:
        out: dict[str, list[tuple[float, str, tuple[str, ...]]]] = {}
        for t, d in self.log:
            if isinstance(d, Place):
                out.setdefault(d.job_id, []).append((t, d.placement.pool, d.placement.nodes))
        return out


def _books(state: ClusterState) -> None:
    assert state.allocated == pytest.approx(state.allocated_gpus(), abs=1e-6)
    for node in state.nodes.values():
        if not node.gpus[0].mig:
            assert node.free_whole == sum(1 for g in node.gpus if not g.holders)
            limit = node.gpus[0].replicas
            assert all(len(g.holders) <= limit for g in node.gpus)


def _run(pools, jobs, policy, market=None, **cfg) -> tuple[Engine, Report, Recorder]:  # type: ignore[no-untyped-def]
    rec = Recorder(policy if not isinstance(policy, str) else make_policy(policy))
    e = Engine(pools, jobs, market, SimConfig(**cfg))
    return e, e.run(rec), rec


def _start_order(e: Engine) -> list[str]:
    return [r.job.job_id for r in sorted(e.runs.values(), key=lambda r: (r.first_start, r.job.submit_time))]


# --------------------------------------------------------------------------- registry


def test_available_lists_exactly_the_heuristics() -> None:
    names = available()
    assert set(names) == set(NAMES) | set(COST_BASELINES)
    assert all(isinstance(v, str) and v for v in names.values())


@pytest.mark.parametrize("name", NAMES)
def test_make_policy_builds_each(name: str) -> None:
    p = make_policy(name)
    assert p.name == name
    assert isinstance(p, Scheduler)


@pytest.mark.parametrize(("typo", "hint"), [("fifoo", "fifo"), ("best_fit", "best-fit"), ("tiresas", "tiresias")])
def test_unknown_policy_did_you_mean(typo: str, hint: str) -> None:
    with pytest.raises(ScenarioError, match=rf"did you mean .*{hint}"):
        make_policy(typo)


def test_bad_policy_parameters() -> None:
    with pytest.raises(ScenarioError, match="bad parameters"):
        make_policy("fifo", turbo=True)
    with pytest.raises((ScenarioError, ValueError), match="weights"):
        make_policy("weighted-priority", w_priority=-1.0)


# --------------------------------------------------------------------------- orders


def _priority_jobs() -> list:  # type: ignore[type-arg]
    return [job("blocker", 0, 100), job("old-low", 10, 100, priority=0), job("new-high", 20, 100, priority=5)]


def test_weighted_priority_serves_high_priority_before_older_low() -> None:
    e, r, _ = _run([pool("p")], _priority_jobs(), "weighted-priority")
    assert e.runs["new-high"].first_start == pytest.approx(100.0)
    assert e.runs["old-low"].first_start == pytest.approx(200.0)
    assert r.refused_decisions == 0


def test_weighted_priority_weights_are_configurable() -> None:
    e, _, _ = _run([pool("p")], _priority_jobs(), make_policy("weighted-priority", w_priority=0.0))
    assert _start_order(e) == ["blocker", "old-low", "new-high"]
    e, _, _ = _run([pool("p")], _priority_jobs(), "fifo")
    assert _start_order(e) == ["blocker", "old-low", "new-high"]


def test_weighted_priority_preempts_lower_priority_preemptible_jobs() -> None:
    jobs = [job("low", 0, 1000, preemptible=True, priority=0), job("high", 100, 50, priority=3)]
    e, r, rec = _run([pool("p")], jobs, make_policy("weighted-priority", preempt=True), restart_overhead_s=0.0)
    assert any(isinstance(d, Preempt) and d.job_id == "low" and d.checkpoint for _, d in rec.log)
    assert e.runs["high"].first_start == pytest.approx(100.0)
    assert e.runs["low"].finish_time == pytest.approx(1050.0)
    assert r.lost_gpu_hours == 0.0
    e, r, _ = _run([pool("p")], jobs, "weighted-priority")
    assert e.runs["high"].first_start == pytest.approx(1000.0)
    assert r.preemptions == 0


def _hol_jobs() -> list:  # type: ignore[type-arg]
    # a holds 1 of 2 GPUs; b (2 GPUs) is blocked behind it; c (1 GPU) could backfill.
    return [job("a", 0, 100, 1), job("b", 1, 100, 2), job("c", 2, 10, 1)]


def test_fifo_does_not_backfill() -> None:
    e, _, _ = _run([pool("p", gpus=2)], _hol_jobs(), "fifo")
    assert e.runs["b"].first_start == pytest.approx(100.0)
    assert e.runs["c"].first_start == pytest.approx(200.0)


def test_weighted_priority_backfills() -> None:
    e, _, _ = _run([pool("p", gpus=2)], _hol_jobs(), "weighted-priority")
    assert e.runs["c"].first_start == pytest.approx(2.0)
    assert e.runs["b"].first_start == pytest.approx(100.0)


def _sjf_jobs() -> list:  # type: ignore[type-arg]
    return [
        # Training: both arrive together; with no history they are equal and go in submission order.
        job("a1", 0, 1000, user="u-long"), job("b1", 0, 10, user="u-short"),
        # Test: a blocker, then a long user's job submitted before a short user's.
        job("x", 2000, 100, user="u-other"),
        job("a2", 2010, 1000, user="u-long"), job("b2", 2020, 10, user="u-short"),
    ]


def test_sjf_uses_learnt_per_user_durations() -> None:
    e, _, _ = _run([pool("p")], _sjf_jobs(), "sjf")
    assert e.runs["a1"].first_start == 0.0 and e.runs["b1"].first_start == pytest.approx(1000.0)
    assert e.runs["b2"].first_start == pytest.approx(2100.0)
    assert e.runs["a2"].first_start == pytest.approx(2110.0)
    est = e.state.estimator
    assert est.estimate(job("q", 0, 1, user="u-short")) < est.estimate(job("q", 0, 1, user="u-long"))
    # FIFO does the opposite on the same trace.
    e, _, _ = _run([pool("p")], _sjf_jobs(), "fifo")
    assert e.runs["a2"].first_start == pytest.approx(2100.0)


def test_sjf_oracle_uses_true_durations() -> None:
    pol = make_policy("sjf", oracle=True)
    assert pol.name == "sjf-oracle"
    e, _, _ = _run([pool("p")], _sjf_jobs(), pol)
    assert e.runs["b1"].first_start == 0.0
    assert e.runs["a1"].first_start == pytest.approx(10.0)


def test_tiresias_preempts_a_long_running_job_for_a_new_one() -> None:
    jobs = [job("long", 0, 1000, preemptible=True), job("new", 200, 10)]
    pol = make_policy("tiresias", thresholds=(50.0,))
    e, r, rec = _run([pool("p")], jobs, pol, restart_overhead_s=60.0)
    assert any(isinstance(d, Preempt) and d.job_id == "long" for _, d in rec.log)
    assert e.runs["new"].first_start == pytest.approx(200.0)
    assert e.runs["new"].finish_time == pytest.approx(210.0)
    assert e.runs["long"].preemptions == 1
    assert r.lost_gpu_hours == 0.0  # graceful
    # 200 s kept, 60 s restart overhead: 860 s from 210.
    assert e.runs["long"].finish_time == pytest.approx(1070.0)
    # Without preemption the new job waits for the long one.
    e, r, _ = _run([pool("p")], jobs, make_policy("tiresias", thresholds=(50.0,), preempt=False))
    assert e.runs["new"].first_start == pytest.approx(1000.0)
    assert r.preemptions == 0


def test_tiresias_never_preempts_a_job_that_is_not_preemptible() -> None:
    jobs = [job("long", 0, 1000), job("new", 200, 10)]
    e, r, _ = _run([pool("p")], jobs, make_policy("tiresias", thresholds=(50.0,)))
    assert r.preemptions == 0
    assert e.runs["new"].first_start == pytest.approx(1000.0)


def test_tiresias_does_not_preempt_within_the_same_queue() -> None:
    jobs = [job("long", 0, 1000, preemptible=True), job("new", 20, 10)]
    e, r, _ = _run([pool("p")], jobs, make_policy("tiresias", thresholds=(50.0,)))
    # At t=20 the running job has attained only 20 < 50 GPU-s: same queue, no preemption ...
    assert e.runs["new"].first_start >= 50.0  # type: ignore[operator]
    # ... but it is demoted when it crosses 50 (Tiresias wakes itself) and then yields.
    assert e.runs["new"].first_start == pytest.approx(50.0)
    assert r.preemptions == 1


def test_tiresias_preempts_for_every_blocked_job_at_one_decision_point() -> None:
    # Six 1-GPU nodes busy with long jobs already demoted; six short jobs arrive together.
    # Every one of them preempts (there was a cap of four per decision point before).
    longs = [job(f"L{i}", 0, 10_000, preemptible=True) for i in range(6)]
    shorts = [job(f"s{i}", 100, 10) for i in range(6)]
    e, r, _ = _run([pool("p", nodes=6)], longs + shorts, make_policy("tiresias", thresholds=(50.0,)),
                   restart_overhead_s=0.0)
    assert all(e.runs[f"s{i}"].first_start == pytest.approx(100.0) for i in range(6))
    assert r.preemptions == 6


def test_tiresias_preempts_a_gang_and_a_gang_preempts_for_whole_nodes() -> None:
    # Two nodes of 2 GPUs. A demoted 4-GPU gang yields to a 1-GPU newcomer ...
    jobs = [job("gang", 0, 1_000, n=4, preemptible=True), job("new", 100, 10)]
    e, r, rec = _run([pool("p", nodes=2, gpus=2)], jobs, make_policy("tiresias", thresholds=(50.0,)),
                     restart_overhead_s=0.0)
    assert any(isinstance(d, Preempt) and d.job_id == "gang" for _, d in rec.log)
    assert e.runs["new"].first_start == pytest.approx(100.0)
    assert e.runs["gang"].finish_time == pytest.approx(1_010.0)
    # ... and a new 4-GPU gang empties both nodes of demoted 1-GPU jobs to start at once.
    jobs = [job(f"o{i}", 0, 1_000, preemptible=True) for i in range(4)] + [job("g", 100, 10, n=4)]
    e, r, _ = _run([pool("p", nodes=2, gpus=2)], jobs, make_policy("tiresias", thresholds=(50.0,)),
                   restart_overhead_s=0.0)
    assert e.runs["g"].first_start == pytest.approx(100.0)
    assert r.preemptions == 4


def test_tiresias_weighs_a_node_room_against_a_gang_room_in_another_pool() -> None:
    # Pool "eight" (one 8-GPU node) runs X; pool "four" (two 4-GPU nodes) runs the gang Y, submitted
    # later, so of lower priority once both are demoted. A 6-GPU job fits a node of "eight" but is a
    # gang in "four": it suspends Y, the least important victim, and runs there as 4 + 2.
    jobs = [job("X", 0, 1_000, n=8, preemptible=True), job("Y", 1, 1_000, n=8, preemptible=True),
            job("J", 100, 10, n=6)]
    pools = [pool("eight", gpus=8), pool("four", nodes=2, gpus=4)]
    e, _, rec = _run(pools, jobs, make_policy("tiresias", thresholds=(50.0,)), restart_overhead_s=0.0)
    assert [d.job_id for _, d in rec.log if isinstance(d, Preempt)] == ["Y"]
    assert e.runs["J"].first_start == pytest.approx(100.0)
    assert rec.places()["J"][0][1] == "four"


def test_tiresias_gang_preemption_needs_whole_nodes_by_default() -> None:
    # Two nodes of 2 GPUs; on each, one demoted preemptible job and one that is not preemptible.
    # A 3-GPU gang needs one whole node plus one GPU: no node can be emptied, so nobody is
    # preempted and it waits for the first node to empty at 1,000.
    jobs = [job("a", 0, 1_000, preemptible=True), job("b", 0, 1_000), job("c", 0, 1_000, preemptible=True),
            job("d", 0, 1_000), job("g", 100, 10, n=3)]
    e, r, _ = _run([pool("p", nodes=2, gpus=2)], jobs, make_policy("tiresias", thresholds=(50.0,)))
    assert r.preemptions == 0
    assert e.runs["g"].first_start == pytest.approx(1_000.0)


def test_tiresias_promotes_a_starving_job_back_to_the_first_queue() -> None:
    # One GPU, threshold 100 GPU-s. A runs from 0 and is demoted at 100, when B (waiting since 10)
    # preempts it. B is demoted at 200; A has then waited 100 s = 1 x the 100 s it ran: with
    # PromoteKnob 1 it goes back to queue 0 and preempts B; without promotion it waits for B.
    jobs = [job("A", 0, 1_000, preemptible=True), job("B", 10, 1_000, preemptible=True)]
    e, _, _ = _run([pool("p")], jobs, make_policy("tiresias", thresholds=(100.0,)), restart_overhead_s=0.0)
    assert e.runs["B"].first_start == pytest.approx(100.0)
    assert e.runs["B"].finish_time == pytest.approx(1_100.0)
    assert e.runs["A"].finish_time == pytest.approx(2_000.0)
    e, r, rec = _run([pool("p")], jobs, make_policy("tiresias", thresholds=(100.0,), promote_knob=1.0),
                     restart_overhead_s=0.0)
    starts = {jid: [t for t, *_ in v] for jid, v in rec.places().items()}
    assert starts["A"][:2] == [pytest.approx(0.0), pytest.approx(200.0)]
    assert starts["B"][:2] == [pytest.approx(100.0), pytest.approx(300.0)]
    assert r.jobs_completed == 2 and r.preemptions > 2


_TIRESIAS_TIES = """
import sys
sys.path.insert(0, {tests!r})
from sim.helpers import job, pool
from rlsched.policies import make_policy
from rlsched.sim.engine import Engine
jobs = [job(f"L{{i}}", 0, 5_000, n=1 + i % 3, preemptible=True) for i in range(12)]
jobs += [job(f"s{{i}}", 100 + 50 * (i // 4), 30 + i, n=1 + i % 2) for i in range(16)]
e = Engine([pool("p", nodes=4, gpus=4)], jobs)
e.run(make_policy("tiresias", thresholds=(50.0, 500.0)))
print(sorted((r.job.job_id, r.first_start, r.finish_time, r.preemptions) for r in e.runs.values()))
"""


def test_tiresias_does_not_depend_on_string_hashing() -> None:
    # Equal submissions tie on rank; the victims and their order must not follow the hash seed.
    import os
    import subprocess
    import sys

    code = _TIRESIAS_TIES.format(tests=str(Path(__file__).resolve().parents[1]))
    outs = set()
    for seed in ("0", "1", "2"):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        outs.add(proc.stdout)
    assert len(outs) == 1, outs
    assert ", 1)" in next(iter(outs))  # something was preempted


def test_tiresias_follows_a_job_another_rule_moved_between_its_decision_points() -> None:
    # A rule in front (as node consolidation does) suspends V and restarts it on another node
    # between two of Tiresias' decision points: V is running both times, on different GPUs, and
    # Tiresias' per-node record of its candidate victims must follow it.
    from rlsched.cluster.feasibility import node_candidates
    from rlsched.policies.heuristics.tiresias import Tiresias

    class MoveV:
        name = "move-v"

        def __init__(self) -> None:
            self.inner = Tiresias(thresholds=(50.0,))
            self.moved = False

        def reset(self, state: ClusterState) -> None:
            self.inner.reset(state)

        def decide(self, state: ClusterState) -> Iterator[Decision]:
            run = state.running.get("V")
            if run is not None and not self.moved and state.time >= 100:
                self.moved = True
                src = run.placement.nodes[0]  # type: ignore[union-attr]
                yield Preempt("V", reason="move", checkpoint=True)
                dst = next(n for n in state.nodes.values() if n.id != src and node_candidates(n, run.job, state.time))
                yield Place("V", node_candidates(dst, run.job, state.time)[0])
            yield from self.inner.decide(state)
            tir = self.inner
            tir._sync(state)
            for jid in tir._victimish:
                where = {n for n, _ in state.running[jid].placement.gpus}  # type: ignore[union-attr]
                assert {n for n, held in tir._on_node.items() if jid in held} == where, jid

    jobs = [job("V", 0, 1_000, preemptible=True), job("W", 0, 1_000, n=2, preemptible=True),
            job("late", 100, 10)]
    e, r, _ = _run([pool("p", nodes=2, gpus=3)], jobs, MoveV(), restart_overhead_s=0.0)
    assert e.runs["V"].restarts >= 1 and r.jobs_completed == 3


def test_policy_strings_set_parameters() -> None:
    from rlsched.policies.registry import parse_policy_string

    assert parse_policy_string("tiresias:thresholds=3250/7200,promote_knob=2") == (
        "tiresias", {"thresholds": (3250.0, 7200.0), "promote_knob": 2})
    assert parse_policy_string("sjf:oracle=true") == ("sjf", {"oracle": True})
    assert parse_policy_string("spot-fallback:max_step=4,risk_factor=0.25") == (
        "spot-fallback", {"max_step": 4, "risk_factor": 0.25})
    pol = make_policy("tiresias:thresholds=14400,promote_knob=8,preempt=false")
    assert (pol.thresholds, pol.promote_knob, pol.preempt) == ((14400.0,), 8.0, False)  # type: ignore[attr-defined]
    assert pol.name == "tiresias:thresholds=14400,promote_knob=8,preempt=false"  # reports tell variants apart
    assert make_policy("tiresias:thresholds=14400", promote_knob=1.0).promote_knob == 1.0  # type: ignore[attr-defined]
    with pytest.raises(ScenarioError, match="parameters are KEY=VALUE"):
        make_policy("tiresias:14400")
    with pytest.raises(ScenarioError, match="thresholds takes numbers joined by '/'"):
        make_policy("tiresias:thresholds=1/x")
    with pytest.raises(ScenarioError, match="bad parameters for policy 'tiresias'"):
        make_policy("tiresias:threshold=3600")


def test_listed_parameters_are_what_a_policy_string_sets() -> None:
    """Every parameter ``rlsched policies`` lists, written back as a policy string, builds that policy."""
    from rlsched.policies.registry import available, parameters

    assert parameters("tiresias") == {"thresholds": "3250/7200", "promote_knob": "0", "preempt": "true"}
    assert parameters("sjf") == {"oracle": "false"}
    listed = {name: parameters(name) for name in available()}
    assert sum(map(bool, listed.values())) >= 5
    for name, params in listed.items():
        if params:
            make_policy(name + ":" + ",".join(f"{k}={v}" for k, v in params.items()))


@pytest.mark.parametrize("params", [{"thresholds": (-1.0,)}, {"thresholds": (10.0, 10.0)},
                                    {"promote_knob": -1.0}, {"thresholds": ("x",)}])
def test_tiresias_refuses_bad_parameters_in_one_line(params: dict[str, object]) -> None:
    with pytest.raises(ScenarioError, match="bad parameters for policy 'tiresias'"):
        make_policy("tiresias", **params)


def test_fair_share_alternates_users() -> None:
    # Two GPUs; u1 submits four jobs before u2's two. Whenever a GPU frees up, the user holding
    # fewer GPUs goes next.
    jobs = [job("a1", 0, 100, user="u1"), job("a2", 1, 100, user="u1"), job("a3", 2, 100, user="u1"),
            job("a4", 3, 100, user="u1"), job("b1", 4, 100, user="u2"), job("b2", 5, 100, user="u2")]
    e, _, _ = _run([pool("p", gpus=2)], jobs, "fair-share")
    assert _start_order(e) == ["a1", "a2", "b1", "a3", "b2", "a4"]
    e, _, _ = _run([pool("p", gpus=2)], jobs, "fifo")
    assert _start_order(e) == ["a1", "a2", "a3", "a4", "b1", "b2"]


def test_fair_share_within_one_pass() -> None:
    # Everything arrives at once on 4 GPUs: two jobs per user, not the first four submitted.
    jobs = [job(f"a{i}", 0, 100, user="u1") for i in range(4)] + [job(f"b{i}", 0, 100, user="u2")
                                                                   for i in range(4)]
    e, _, _ = _run([pool("p", gpus=4)], jobs, "fair-share")
    first = {jid for jid, r in e.runs.items() if r.first_start == 0.0}
    assert first == {"a0", "a1", "b0", "b1"}


# --------------------------------------------------------------------------- placement


def _two_nodes_jobs() -> list:  # type: ignore[type-arg]
    # After t=10, node 1 is empty and node 2 has 1 GPU left.
    return [job("x", 0, 10, 4), job("y", 0, 1000, 3), job("c", 20, 100, 1)]


def test_best_fit_chooses_the_fuller_node() -> None:
    pools = [pool("p", nodes=2, gpus=4)]
    _, _, rec = _run(pools, _two_nodes_jobs(), "best-fit")
    node_of = {j: v[0][2] for j, v in rec.places().items()}
    assert node_of["y"] != node_of["x"]
    assert node_of["c"] == node_of["y"]
    # First-fit takes the first node instead.
    _, _, rec = _run(pools, _two_nodes_jobs(), "fifo")
    node_of = {j: v[0][2] for j, v in rec.places().items()}
    assert node_of["c"] == node_of["x"]


def test_fgd_keeps_a_whole_node_for_the_8_gpu_pattern() -> None:
    # x (8 GPUs) and y (1 GPU) teach the popularity; after x ends node 1 is empty and node 2 has 7 free.
    # z (1 GPU) should go next to y, so that w (8 GPUs) starts immediately.
    jobs = [job("x", 0, 10, 8), job("y", 0, 1000, 1), job("z", 20, 500, 1), job("w", 30, 100, 8)]
    pools = [pool("p", nodes=2, gpus=8)]
    e, _, rec = _run(pools, jobs, "fgd")
    node_of = {j: v[0][2] for j, v in rec.places().items()}
    assert node_of["z"] == node_of["y"]
    assert e.runs["w"].first_start == pytest.approx(30.0)
    e, _, _ = _run(pools, jobs, "weighted-priority")  # first-fit fragments node 1
    assert e.runs["w"].first_start == pytest.approx(520.0)


def test_fgd_prefers_matching_mig_instances() -> None:
    # One GPU with 1g+1g+2g+3g: a 1g job must not take anything else; it gets a 1g instance.
    pools = [pool("mig", sharing=Sharing.MIG, layout=("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"))]
    jobs = [job("f1", 0, 100, 1, gpu_milli=100), job("f2", 0, 100, 1, gpu_milli=100),
            job("f3", 0, 100, 1, gpu_milli=250), job("f4", 0, 100, 1, gpu_milli=400),
            job("f5", 0, 100, 1, gpu_milli=100)]
    e, r, _ = _run(pools, jobs, "fgd")
    assert [e.runs[f"f{i}"].first_start for i in range(1, 6)] == [0.0, 0.0, 0.0, 0.0, 100.0]
    assert r.refused_decisions == 0


# --------------------------------------------------------------------------- spot fallback


def test_spot_fallback_places_by_preemptibility_and_scales_spot() -> None:
    market = FakeMarket(price=1.0)
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=4, gpus=1, delay=100.0),
             pool("od", kind=PoolKind.ONDEMAND, nodes=4, gpus=1, delay=100.0)]
    jobs = [job("p1", 0, 1000, preemptible=True), job("p2", 0, 1000, preemptible=True),
            job("p3", 0, 1000, preemptible=True), job("n1", 0, 1000, preemptible=False)]
    e, r, rec = _run(pools, jobs, "spot-fallback", market)
    scales = [(t, d) for t, d in rec.log if isinstance(d, Scale)]
    assert (0.0, Scale("spot", 3)) in scales
    assert (0.0, Scale("od", 1)) in scales
    pool_of = {j: v[0][1] for j, v in rec.places().items()}
    assert pool_of == {"p1": "spot", "p2": "spot", "p3": "spot", "n1": "od"}
    assert all(e.runs[j].first_start == pytest.approx(100.0) for j in pool_of)
    assert r.cost_spot_usd == pytest.approx(3 * 1100.0 / 3600.0)
    assert r.cost_ondemand_usd == pytest.approx(1100.0 / 3600.0)
    assert r.refused_decisions == 0


def test_spot_fallback_uses_ready_spot_before_on_demand() -> None:
    market = FakeMarket(price=1.0)
    pools = [pool("od", kind=PoolKind.ONDEMAND, nodes=1, lo=1, gpus=2),
             pool("spot", kind=PoolKind.SPOT, nodes=1, lo=1, gpus=2)]
    jobs = [job("p", 0, 10, preemptible=True), job("n", 0, 10)]
    _, _, rec = _run(pools, jobs, "spot-fallback", market)
    pool_of = {j: v[0][1] for j, v in rec.places().items()}
    assert pool_of == {"p": "spot", "n": "od"}


def test_spot_fallback_keeps_deadline_jobs_at_risk_off_spot() -> None:
    market = FakeMarket(price=1.0)
    pools = [pool("od", kind=PoolKind.ONDEMAND, nodes=1, lo=1, gpus=2),
             pool("spot", kind=PoolKind.SPOT, nodes=1, lo=1, gpus=2)]
    # Estimated duration is the 1 h prior; a deadline in 1.2 h is at risk, one in 10 h is not.
    jobs = [job("tight", 0, 10, preemptible=True, deadline=1.2 * 3600), job("loose", 0, 10, preemptible=True,
                                                                            deadline=10 * 3600)]
    _, _, rec = _run(pools, jobs, "spot-fallback", market)
    pool_of = {j: v[0][1] for j, v in rec.places().items()}
    assert pool_of == {"tight": "od", "loose": "spot"}


# --------------------------------------------------------------------------- end to end

HYBRID = "4x8xA100-80GB,1x8xA100-80GB/mig=balanced,spot:0-2x8xA100-80GB,ondemand:0-2x8xA100-80GB"


def _trace(name: str, strip_models: bool) -> list:  # type: ignore[type-arg]
    jobs = load_trace(str(DATA / name)).jobs
    out = []
    for i, j in enumerate(jobs):
        j = replace(j, preemptible=i % 2 == 0)
        if strip_models:
            j = replace(j, gpu_models=frozenset())
        out.append(j)
    return out


@pytest.mark.parametrize(("trace", "strip"), [("philly_slice.csv", False), ("openb_pods_slice.csv", False),
                                              ("openb_pods_slice.csv", True)])
@pytest.mark.parametrize("name", NAMES + COST_BASELINES)
def test_replay_real_trace(name: str, trace: str, strip: bool) -> None:
    pools = parse_cluster(HYBRID)
    market = default_market()
    market.check_pools(pools)
    jobs = _trace(trace, strip)
    e, r, rec = _run(pools, jobs, name, market)
    total = len(jobs)
    assert r.jobs_completed + r.jobs_unschedulable + r.jobs_skipped == total
    assert all(run.state in (RunState.DONE, RunState.UNSCHEDULABLE, RunState.SKIPPED) for run in e.runs.values())
    assert r.refused_decisions == 0, e.refusals
    assert 0.0 < r.gpu_utilization <= 1.0 + 1e-9
    assert r.cost_usd >= 0.0
    assert r.cost_usd == pytest.approx(r.cost_ondemand_usd + r.cost_spot_usd + e.cost_onprem)
    assert r.jobs_completed > 0
    assert r.lost_gpu_hours >= 0.0
    # Only "never fits" reasons: nothing is stranded by the policy.
    assert not any(k.startswith("never placed") for k in r.unschedulable_reasons), r.unschedulable_reasons
    cpu_only = sum(1 for j in jobs if j.num_gpus == 0)
    assert r.jobs_skipped == cpu_only
    if strip:
        # With the model restriction lifted every GPU job fits this cluster.
        assert r.jobs_unschedulable == 0
    # Every job that ran on spot was preemptible.
    for jid, places in rec.places().items():
        if any(p == "spot-a100-80gb" for _, p, _ in places):
            assert e.runs[jid].job.preemptible
    for run in e.finished:
        assert run.finish_time is not None
        assert run.finish_time - run.job.submit_time >= run.job.duration - 1e-6



@pytest.mark.parametrize(
    "name", NAMES)
def test_idle_stopped_elastic_cluster_serves_a_late_job(name: str) -> None:
    # a runs on a bought node which is stopped after 2 s idle; b arrives within the autoscaler's scan
    # interval, with nothing running or provisioning: the policy must still get capacity for it.
    pools = parse_cluster("ondemand:0-1x1xA100-80GB/cost=1/delay=5/idle=2")
    e, r, _ = _run(pools, [job("a", 0, 1), job("b", 10, 1)], name)
    assert r.jobs_completed == 2
    assert e.runs["b"].first_start == pytest.approx(35.0)  # next scan at 30, ready 5 s later


def test_weighted_priority_with_preemption_does_not_strand_the_queue() -> None:
    pools = parse_cluster("ondemand:0-1x1xA100-80GB/cost=1/delay=5/idle=2")
    e, r, _ = _run(pools, [job("a", 0, 1), job("b", 10, 1)], make_policy("weighted-priority", preempt=True))
    assert r.jobs_completed == 2
    assert e.runs["b"].first_start == pytest.approx(35.0)
