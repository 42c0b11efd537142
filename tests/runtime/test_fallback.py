"""The fallback guard: every fallback reason, the circuit breaker's timing, shadow mode, and a real PPO run."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlsched.cluster.catalog import gpu_model
from rlsched.cluster.decisions import Decision, Place, Preempt, Reconfigure, Scale, WakeAt
from rlsched.cluster.feasibility import check_decision, check_placement
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, JobRun, MarketQuote, Placement, PoolKind, PoolSpec, RunState
from rlsched.envs.codec import ObservationCodec
from rlsched.learned.ppo import ModelError, PolicyModel, PpoScheduler
from rlsched.policies.heuristics import WeightedPriority
from rlsched.runtime.audit import AuditEvent, FallbackReason
from rlsched.runtime.fallback import BreakerState, FallbackConfig, FallbackScheduler, illegal_reason

from .audit_sink import MemorySink

A100 = gpu_model("A100-80GB")


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class Scripted:
    """A primary whose ``decide`` is a function of the state (counts its calls)."""

    def __init__(self, fn: Callable[[ClusterState], Iterator[Decision]], name: str = "fake-ppo") -> None:
        self.fn = fn
        self.name = name
        self.calls = 0
        self.resets = 0

    def reset(self, state: ClusterState) -> None:
        self.resets += 1

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        self.calls += 1
        return self.fn(state)


def _state(n_jobs: int = 3, gpus: int = 4, elastic: bool = False) -> ClusterState:
    specs = [PoolSpec("onprem", PoolKind.ONPREM, A100, gpus, 1, 1)]
    if elastic:
        specs.append(PoolSpec("spot", PoolKind.SPOT, A100, gpus, 0, 2))
    st = ClusterState(specs)
    st.add_node("onprem", 0.0, 0.0)
    for i in range(n_jobs):
        st.enqueue(JobRun(Job(f"j{i}", float(i), 100.0, num_gpus=1, priority=i)))
    st.time = 10.0
    return st


def _apply(state: ClusterState, d: Decision) -> None:
    """Apply a Place as the engine would (other kinds are not needed here)."""
    if isinstance(d, Place):
        run = state.queue[d.job_id]
        assert check_placement(state, run.job, d.placement) is None, d
        state.dequeue(d.job_id)
        state.allocate(run, d.placement)
        run.state = RunState.RUNNING
        state.running[d.job_id] = run


def _drive(sched: FallbackScheduler, state: ClusterState) -> list[Decision]:
    out = []
    for d in sched.decide(state):
        out.append(d)
        _apply(state, d)
    return out


def _place(state: ClusterState, job: str, gpu: int) -> Place:
    node = next(iter(state.nodes))
    return Place(job, Placement("onprem", ((node, gpu),)))


def _guard(primary: Any, clock: FakeClock, sink: MemorySink, **cfg: Any) -> FallbackScheduler:
    g = FallbackScheduler(primary, WeightedPriority(), FallbackConfig(**cfg), sink, clock=clock)
    return g


def _reasons(sink: MemorySink, event: AuditEvent = AuditEvent.FALLBACK) -> list[str]:
    return [r.reason for r in sink.records if r.event is event]


# --------------------------------------------------------------------------- happy path


def test_healthy_primary_decides_alone() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()

    def fn(s: ClusterState) -> Iterator[Decision]:
        yield _place(s, "j0", 3)  # not what the heuristic would pick (j2 on GPU 0)

    g = _guard(Scripted(fn), clock, sink)
    g.reset(st)
    assert _drive(g, st) == [_place(st, "j0", 3)]
    assert g.fallbacks_by_reason == {} and g.primary_decisions == 1 and g.fallback_decisions == 0
    assert sink.records == []


# --------------------------------------------------------------------------- each reason


def test_inference_error_falls_back_and_heuristic_finishes_the_point() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()

    def fn(s: ClusterState) -> Iterator[Decision]:
        yield _place(s, "j0", 3)
        raise RuntimeError("CUDA out of memory")

    g = _guard(Scripted(fn), clock, sink)
    g.reset(st)
    out = _drive(g, st)
    assert out[0] == _place(st, "j0", 3)  # already applied, legal: it stays
    assert {d.job_id for d in out[1:] if isinstance(d, Place)} == {"j1", "j2"}  # the heuristic placed the rest
    assert g.fallbacks_by_reason == {"inference-error": 1}
    rec = sink.events(AuditEvent.FALLBACK)[0]
    assert rec.reason == "inference-error" and "CUDA out of memory" in rec.extra["detail"]
    assert rec.policy == "weighted-priority"


def test_primary_raising_on_call_is_an_inference_error() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()

    class Broken(Scripted):
        def decide(self, state: ClusterState) -> Iterator[Decision]:
            raise ValueError("bad tensor shape")

    g = _guard(Broken(lambda s: iter(())), clock, sink)
    g.reset(st)
    assert len(_drive(g, st)) == 3
    assert g.fallbacks_by_reason == {"inference-error": 1}


class _NanNet:
    n_actions = 0

    def __call__(self, obs: dict[str, Any]) -> Any:
        import torch

        return torch.full((1, self.n_actions), float("nan"))


def _nan_scheduler() -> PpoScheduler:
    codec = ObservationCodec()
    params = {"window": codec.window, "max_pools": codec.max_pools, "layouts": codec.layouts}
    net = _NanNet()
    net.n_actions = codec.n_actions
    return PpoScheduler(PolicyModel(net, params, codec.signature(), {"version": "nan-1"}))


def test_nan_output_from_a_policy_model() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()
    g = _guard(_nan_scheduler(), clock, sink)
    g.reset(st)
    out = _drive(g, st)
    assert {d.job_id for d in out if isinstance(d, Place)} == {"j0", "j1", "j2"}
    assert g.fallbacks_by_reason == {"nan-output": 1}
    assert sink.events(AuditEvent.FALLBACK)[0].model_version.startswith("nan-1@")


def test_non_finite_wake_time_is_nan_output() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()
    g = _guard(Scripted(lambda s: iter([WakeAt(math.nan)])), clock, sink)
    g.reset(st)
    assert all(not isinstance(d, WakeAt) for d in _drive(g, st))
    assert g.fallbacks_by_reason == {"nan-output": 1}


def test_latency_budget_discards_the_slow_decision() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()

    def fn(s: ClusterState) -> Iterator[Decision]:
        clock.advance(0.010)
        yield _place(s, "j0", 3)  # 10 ms: fine
        clock.advance(0.120)
        yield _place(s, "j1", 2)  # 120 ms: over the 50 ms budget

    g = _guard(Scripted(fn), clock, sink, latency_budget_s=0.05)
    g.reset(st)
    out = _drive(g, st)
    assert out[0] == _place(st, "j0", 3)
    assert _place(st, "j1", 2) not in out
    assert g.fallbacks_by_reason == {"latency-budget": 1}
    rec = sink.events(AuditEvent.FALLBACK)[0]
    assert rec.extra["latency_ms"] == pytest.approx(120.0) and rec.job == "j1"


def test_illegal_action_is_refused_never_yielded() -> None:
    st, clock = _state(), FakeClock()
    node = next(iter(st.nodes))
    bad: list[Decision] = [Place("j0", Placement("onprem", ((node, 9),))),  # no GPU 9
           Place("ghost", Placement("onprem", ((node, 0),))),  # not queued
           Reconfigure(node, 0, ("3g.40gb",)),  # not a MIG GPU
           Preempt("j1"),  # not running
           Scale("onprem", 1)]  # on-prem cannot scale
    for d in bad:
        assert illegal_reason(st, d) is not None
        s2, sink2 = _state(), MemorySink()
        g = _guard(Scripted(lambda s, d=d: iter([d])), clock, sink2)  # type: ignore[misc]
        g.reset(s2)
        out = _drive(g, s2)
        assert d not in out and len(out) == 3
        assert g.refused == 1 and g.fallbacks_by_reason == {"illegal-action": 1}
        rec = sink2.events(AuditEvent.FALLBACK)[0]
        assert rec.reason == "illegal-action" and rec.extra["decision"]["kind"] in (
            "place", "reconfigure", "preempt", "scale")


def test_illegal_reason_accepts_legal_decisions() -> None:
    st = _state(elastic=True)
    assert illegal_reason(st, _place(st, "j0", 0)) is None
    assert illegal_reason(st, Scale("spot", 1)) is None
    assert illegal_reason(st, Scale("spot", -1)) is not None  # nothing to stop
    assert illegal_reason(st, WakeAt(st.time + 5)) is None
    assert illegal_reason(st, WakeAt(st.time)) is not None


def test_spot_scale_up_is_judged_on_the_states_quote_as_the_engine_judges_it() -> None:
    st, clock, sink = _state(elastic=True), FakeClock(), MemorySink()
    st.quotes["spot"] = MarketQuote(1.0, 3.0, spot_available_nodes=0)  # the market sells no spot now
    grow = Scale("spot", 1)
    assert illegal_reason(st, grow) == check_decision(st, grow) == (
        "pool spot cannot grow (max 2, held 0, spot available 0)")
    g = _guard(Scripted(lambda s: iter([grow])), clock, sink)
    g.reset(st)
    assert grow not in _drive(g, st)
    assert g.refused == 1 and sink.events(AuditEvent.FALLBACK)[0].extra["detail"] == illegal_reason(st, grow)
    st.quotes["spot"] = MarketQuote(1.0, 3.0, spot_available_nodes=1)
    assert illegal_reason(st, grow) is None


def test_model_missing_then_loaded_after_cooldown() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()
    attempts: list[int] = []
    good = Scripted(lambda s: iter([_place(s, "j0", 3)]))

    def loader() -> Scripted:
        attempts.append(1)
        if len(attempts) == 1:
            raise ModelError("/models/prod: model folder not found")
        return good

    g = _guard(loader, clock, sink, cooldown_s=60)
    g.reset(st)
    assert not g.primary_available
    assert len(_drive(g, st)) == 3  # heuristic
    assert g.fallbacks_by_reason == {"model-missing": 1}
    assert _reasons(sink) == ["model-missing"] and sink.records[0].extra["stage"] == "load"
    clock.advance(30)
    _drive(g, _state())
    assert len(attempts) == 1  # not retried before the cooldown
    clock.advance(31)
    st2 = _state()
    assert _drive(g, st2) == [_place(st2, "j0", 3)]
    assert len(attempts) == 2 and g.primary_available and good.resets == 1
    assert _reasons(sink, AuditEvent.POLICY_SWITCH) == ["model-loaded"]


def test_a_failing_audit_sink_never_stops_scheduling() -> None:
    st, clock = _state(), FakeClock()

    def broken_sink(rec: object) -> None:
        raise OSError("database is locked")

    g = FallbackScheduler(Scripted(lambda s: (_ for _ in ()).throw(RuntimeError("x"))), WeightedPriority(),
                          FallbackConfig(), broken_sink, clock=clock)
    g.reset(st)
    assert len(_drive(g, st)) == 3
    assert g.audit_errors == 1 and g.fallbacks_by_reason == {"inference-error": 1}


def test_signature_mismatch(tmp_path: Path) -> None:
    codec = ObservationCodec()
    params = {"window": codec.window, "max_pools": codec.max_pools, "layouts": codec.layouts}
    model = PolicyModel(_NanNet(), params, "0000-stale-signature", {})
    st, clock, sink = _state(), FakeClock(), MemorySink()
    g = _guard(lambda: PpoScheduler(model), clock, sink)
    g.reset(st)
    assert len(_drive(g, st)) == 3
    assert g.fallbacks_by_reason == {"signature-mismatch": 1}
    assert "signature" in sink.records[0].extra["detail"]


# --------------------------------------------------------------------------- circuit breaker


def test_circuit_opens_probes_reopens_and_closes() -> None:
    clock, sink = FakeClock(), MemorySink()
    healthy = {"ok": False}

    def fn(s: ClusterState) -> Iterator[Decision]:
        if not healthy["ok"]:
            raise RuntimeError("boom")
        yield from ()

    prim = Scripted(fn)
    g = _guard(prim, clock, sink, failure_threshold=3, window_s=60, cooldown_s=100)
    g.reset(_state())
    for _ in range(2):
        _drive(g, _state())
        clock.advance(1)
    assert g.breaker_state is BreakerState.CLOSED
    _drive(g, _state())  # third failure within 60 s
    assert g.breaker_state is BreakerState.OPEN and prim.calls == 3
    assert _reasons(sink, AuditEvent.POLICY_SWITCH) == ["circuit-open"]

    clock.advance(50)
    _drive(g, _state())
    assert prim.calls == 3  # open: the primary is not even asked
    assert g.fallbacks_by_reason == {"inference-error": 3, "circuit-open": 1}

    clock.advance(60)  # 110 s after opening: half-open, one probe - which fails
    _drive(g, _state())
    assert prim.calls == 4 and g.breaker_state is BreakerState.OPEN
    assert _reasons(sink, AuditEvent.POLICY_SWITCH) == ["circuit-open", "probe", "circuit-open"]
    assert sink.events(AuditEvent.POLICY_SWITCH)[-1].extra["probe_failed"] is True

    clock.advance(99)
    _drive(g, _state())
    assert prim.calls == 4  # still open: the cooldown restarted at the failed probe
    clock.advance(2)
    healthy["ok"] = True
    _drive(g, _state())
    assert prim.calls == 5 and g.breaker_state is BreakerState.CLOSED
    assert _reasons(sink, AuditEvent.POLICY_SWITCH)[-2:] == ["probe", "probe-succeeded"]
    # closed again: a single failure does not reopen it (the window was cleared)
    healthy["ok"] = False
    _drive(g, _state())
    assert g.breaker_state is BreakerState.CLOSED


def test_failures_outside_the_window_do_not_open() -> None:
    clock, sink = FakeClock(), MemorySink()
    prim = Scripted(lambda s: (_ for _ in ()).throw(RuntimeError("x")))
    g = _guard(prim, clock, sink, failure_threshold=2, window_s=10, cooldown_s=100)
    g.reset(_state())
    for _ in range(4):
        _drive(g, _state())
        clock.advance(11)
    assert g.breaker_state is BreakerState.CLOSED and prim.calls == 4
    assert g.fallbacks_by_reason == {"inference-error": 4}


# --------------------------------------------------------------------------- shadow


def test_shadow_mode_logs_primary_and_applies_heuristic() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()
    node = next(iter(st.nodes))

    def fn(s: ClusterState) -> Iterator[Decision]:
        while True:  # not applied, so a real policy would repeat itself on the unchanged state
            clock.advance(0.002)
            yield Place("j0", Placement("onprem", ((node, 3),)))

    prim = Scripted(fn)
    g = _guard(prim, clock, sink, shadow=True)
    g.reset(st)
    heur_state, expected = _state(), []
    for d in WeightedPriority().decide(heur_state):
        expected.append(d)
        _apply(heur_state, d)
    out = _drive(g, st)
    assert out == expected  # exactly the heuristic's decisions
    shadow = sink.events(AuditEvent.SHADOW)
    assert len(shadow) == 2  # the repeat ended the shadow pass
    assert shadow[0].job == "j0" and shadow[0].extra["applied"] is False and shadow[0].extra["legal"] is True
    assert shadow[0].gpus == (st.nodes[node].gpus[3].uuid,)
    assert g.primary_decisions == 0 and g.shadow_decisions == 2 and g.fallbacks_by_reason == {}


def test_shadow_mode_records_primary_failures_without_acting_on_them() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()
    g = _guard(_nan_scheduler(), clock, sink, shadow=True)
    g.reset(st)
    assert len(_drive(g, st)) == 3
    assert g.shadow_failures_by_reason == {"nan-output": 1} and g.fallbacks_by_reason == {}
    assert _reasons(sink, AuditEvent.SHADOW) == ["nan-output"]


# --------------------------------------------------------------------------- end to end


def test_guarded_ppo_in_the_simulator_has_no_refused_decisions(tmp_path: Path) -> None:
    import torch

    from rlsched.learned.ppo_net import SlotScorer
    from rlsched.scenario import load_scenario
    from rlsched.sim import Engine, SimConfig

    torch.manual_seed(0)  # fixed random weights (some seeds oscillate a pool's size and run for minutes)
    codec = ObservationCodec()
    folder = PolicyModel.save(tmp_path / "model", SlotScorer(codec.observation_space), codec, {})
    sc = load_scenario()
    sink = MemorySink()
    guard = FallbackScheduler(lambda: PpoScheduler(PolicyModel.load(folder)), WeightedPriority(),
                              FallbackConfig(latency_budget_s=2.0), sink)
    jobs = sc.jobs[:40]
    engine = Engine(sc.pools, jobs, sc.market, SimConfig(horizon_s=20 * 86400))
    report = engine.run(guard)
    assert report.refused_decisions == 0 and engine.refused == 0
    assert guard.refused == 0
    assert guard.primary_decisions > 0
    assert report.jobs_completed + report.jobs_unschedulable + report.jobs_skipped == len(jobs)
    # whatever fell back (a slow forward pass on a busy machine) was audited with a reason
    assert sum(guard.fallbacks_by_reason.values()) == len(sink.events(AuditEvent.FALLBACK)) + \
        guard.fallbacks_by_reason.get("circuit-open", 0)
    assert all(r.reason in {x.value for x in FallbackReason} for r in sink.events(AuditEvent.FALLBACK))
    assert np.isfinite(report.mean_jct_s) or report.jobs_completed == 0


def test_keep_serving_the_previous_primary_when_the_new_one_does_not_load() -> None:
    st, clock, sink = _state(), FakeClock(), MemorySink()

    def fn(s: ClusterState) -> Iterator[Decision]:
        yield _place(s, "j0", 3)

    working = Scripted(fn, name="model-v1")
    old = _guard(working, clock, sink)

    def unreachable() -> Scripted:
        raise ModelError("models:/x@champion: registry not reachable")

    new = _guard(unreachable, clock, sink)
    assert not new.primary_available and _reasons(sink) == ["model-missing"]
    assert new.keep_serving(old) is True
    assert new.primary is working and new.primary_available
    new.reset(st)
    assert working.resets == 1  # the kept model is reset for the new configuration
    assert _drive(new, st) == [_place(st, "j0", 3)] and new.primary_decisions == 1
    # nothing to keep when the new primary did load, or the previous one had none
    loaded = _guard(Scripted(fn, name="model-v2"), clock, sink)
    assert loaded.keep_serving(old) is False and loaded.primary is not working
    assert _guard(unreachable, clock, sink).keep_serving(_guard(unreachable, clock, sink)) is False


def test_a_decision_loop_goes_to_the_heuristic_audited_and_opens_the_circuit() -> None:
    from rlsched.sim import Engine
    from tests.cluster.test_loop_detector import Alternating
    from tests.sim.helpers import FakeMarket, job, pool

    pools = [pool("onprem", nodes=1, gpus=4), pool("spot", kind=PoolKind.SPOT, nodes=2, gpus=4, delay=100.0)]
    jobs = [job(f"j{i}", 10.0 * i, 600.0, preemptible=True) for i in range(6)]
    clock, sink = FakeClock(), MemorySink()
    primary = Alternating()
    guard = FallbackScheduler(primary, WeightedPriority(), FallbackConfig(failure_threshold=3), sink, clock=clock)
    engine = Engine(pools, jobs, FakeMarket(price=1.0))
    report = engine.run(guard)
    assert report.jobs_completed == 6 and report.refused_decisions == 0
    # the guard caught every loop before the third scale was yielded; the engine's own breaker saw none
    assert report.loop_handovers == 0
    loops = guard.fallbacks_by_reason["decision-loop"]
    assert loops == 3  # then the circuit opened: the heuristic alone until the cooldown ends
    assert guard.breaker_state is BreakerState.OPEN and guard.fallbacks_by_reason.get("circuit-open", 0) >= 1
    recs = [r for r in sink.events(AuditEvent.FALLBACK) if r.reason == "decision-loop"]
    assert len(recs) == loops
    assert "pool spot scaled up and down 3 times" in recs[0].extra["detail"]
    assert recs[0].extra["decision"]["kind"] == "scale"  # the decision that was not applied
    assert primary.decided == 3 * loops
