"""The digital twin: replays of the service's own history, its metrics, and adapt = recommend | switch."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.store import Allocation, Store
from rlsched.service.twin import Hysteresis, PolicyOutcome, TwinResult, gate_refusal

from . import SPEC, kill_jobs, service, write_fleet

TWIN_SPEC = SPEC.replace('  fallback  = "fifo"\n', '  fallback  = "fifo"\n  %(adapt)s\n')


def write_twin_spec(tmp_path: Path, *, scheduler: str = "fifo", adapt: str = "off", twin: str = "") -> None:
    text = TWIN_SPEC % {"scheduler": scheduler, "model": "", "adapt": f'adapt = "{adapt}"\n  {twin}'}
    (tmp_path / "pool.hcl").write_text(text)
    write_fleet(tmp_path)


def congested_jobs(n: int = 80, seed: int = 3) -> list[tuple[float, int, float]]:
    """(submit offset, GPUs, duration): a mix where big jobs block small ones under FIFO."""
    rng = random.Random(seed)
    return [(i * 15.0, rng.choice([1, 1, 2, 4]), rng.uniform(30, 400)) for i in range(n)]


def fill_store(tmp_path: Path, runs: list[tuple[float, int, float, float, float]]) -> None:
    """Write finished jobs into the state dir's store: (submit, gpus, first start, finish, _) on a clock
    that ends about an hour ago (inside the twin's window)."""
    (tmp_path / "state").mkdir(exist_ok=True)
    clock = [0.0]
    store = Store(tmp_path / "state" / "jobs.db", clock=lambda: clock[0])
    base = time.time() - 3600 - max(r[3] for r in runs)
    ids = []
    for submit, gpus, _start, _finish, _ in runs:
        clock[0] = base + submit
        ids.append(store.submit(["sleep", "1"], gpus=gpus, gpu_models=["A100-80GB"], user="u"))
    events = []
    for jid, (_submit, _gpus, start, finish, _) in zip(ids, runs, strict=True):
        events += [(base + start, 0, jid), (base + finish, 1, jid)]
    for t, kind, jid in sorted(events):
        clock[0] = t
        if kind == 0:
            store.mark_running(jid, Allocation("gpu-a100-01", ("x",)), None, None)
        else:
            store.mark_finished(jid, 0)
    store.close()


def test_the_twin_reproduces_a_history_the_simulator_made(tmp_path: Path) -> None:
    """A history that IS a simulator run of FIFO on the live pools: the twin's FIFO row equals what happened."""
    from rlsched.cluster.job import Job
    from rlsched.scenario import build_market
    from rlsched.service.served_policy import heuristic
    from rlsched.sim import Engine

    write_twin_spec(tmp_path)
    with service(tmp_path) as svc:
        svc.inventory.ensure()
        from rlsched.service.twin import live_pools

        pools = live_pools(svc.policy.spec, svc.inventory.nodes, time.time())
        jobs = [Job(str(i), s, d, num_gpus=g, gpu_models=frozenset({"A100-80GB"}))
                for i, (s, g, d) in enumerate(congested_jobs())]
        engine = Engine(pools, jobs, build_market("default", pools))
        engine.run(heuristic("fifo", {}))
        runs = [(r.job.submit_time, r.job.num_gpus, r.first_start, r.finish_time, 0.0)
                for r in sorted(engine.runs.values(), key=lambda r: r.job.submit_time)]
        fill_store(tmp_path, runs)
        result = svc.twin.run_once()
        assert result.jobs == len(jobs) and result.served == "fifo"
        assert result.actual.mean_jct_s > 0
        assert abs(result.simulator_error()) < 0.01, (result.rows["fifo"], result.actual)
        assert {"sjf", "weighted-priority", "fair-share"} <= set(result.rows)
        text = generate_latest(svc.registry).decode()
        assert 'rlsched_twin_mean_jct_seconds{policy="fifo"}' in text
        assert 'rlsched_twin_mean_jct_seconds{policy="actual"}' in text
        assert "rlsched_twin_simulator_error_ratio" in text
        assert svc.twin.advice is not None and svc.twin.advice.action == "none"  # adapt = "off"


def _history(tmp_path: Path) -> None:
    # the real times do not matter for the counterfactuals: each job ran 10 s after its submission
    fill_store(tmp_path, [(s, g, s + 10, s + 10 + d, 0.0) for s, g, d in congested_jobs()])


def test_switch_needs_two_consecutive_wins_and_is_audited(tmp_path: Path) -> None:
    write_twin_spec(tmp_path, adapt="switch", twin='twin {\n    margin = 0.05\n  }')
    _history(tmp_path)
    with service(tmp_path) as svc:
        try:
            first = svc.twin.run_once()
            best = first.best()
            assert best != "fifo" and first.vs_served(best) <= 0.95
            assert svc.policy.decl.scheduler == "fifo" and svc.twin.advice is not None
            assert svc.twin.advice.wins == 1 and svc.twin.advice.action == "none"
            svc.twin.run_once()
            assert svc.policy.decl.scheduler == best and svc.twin.advice.action == "switch"
            switches = svc.store.audit(event=AuditEvent.POLICY_SWITCH)
            assert switches and "digital twin" in switches[-1].reason and best in switches[-1].reason
            assert "fifo" in switches[-1].extra["previous"]
            third = svc.twin.run_once()
            assert third.served == best and svc.twin.advice.action == "none"
        finally:
            kill_jobs(svc)


def test_recommend_audits_and_keeps_the_served_policy(tmp_path: Path) -> None:
    write_twin_spec(tmp_path, adapt="recommend")
    _history(tmp_path)
    with service(tmp_path) as svc:
        svc.twin.run_once()
        svc.twin.run_once()
        assert svc.policy.decl.scheduler == "fifo"
        advice = svc.store.audit(event=AuditEvent.TWIN_ADVICE)
        assert len(advice) == 1 and advice[0].extra["action"] == "recommend"
        assert "consecutive replays" in advice[0].reason


def _result(served: float, best: float) -> TwinResult:
    rows = {"fifo": PolicyOutcome("fifo", served, 1, 0, 0, 10), "sjf": PolicyOutcome("sjf", best, 1, 0, 0, 10)}
    return TwinResult("fifo", rows, PolicyOutcome("actual", served, 1, None, 0, 10), 10, 7, 0, 0)


def test_hysteresis_counts_only_consecutive_wins_by_the_margin() -> None:
    h = Hysteresis()
    assert h.observe(_result(100, 90), 0.05)[2] == 1
    assert h.observe(_result(100, 97), 0.05)[2] == 0  # won by less than the margin: start again
    assert h.observe(_result(100, 90), 0.05)[2] == 1
    assert h.observe(_result(100, 90), 0.05)[2] == 2


def test_a_policy_that_finishes_fewer_jobs_is_never_best() -> None:
    r = _result(100, 50)
    r.rows["sjf"] = PolicyOutcome("sjf", 50, 1, 0, 0, 9)
    assert r.best() == "fifo" and math.isclose(r.simulator_error(), 0.0)


def test_the_gate_judges_learned_candidates_only(tmp_path: Path) -> None:
    assert gate_refusal("sjf", "sjf") is None
    why = gate_refusal("rl:missing", str(tmp_path / "missing"))
    assert why is not None and "cannot be read" in why


@pytest.mark.parametrize("bad", ['adapt = "always"', 'adapt = "off"\n  twin {\n    every = "5s"\n  }'])
def test_bad_adapt_settings_are_spec_errors(tmp_path: Path, bad: str) -> None:
    from rlsched.spec import load_spec
    from rlsched.spec.model import SpecError

    (tmp_path / "pool.hcl").write_text(TWIN_SPEC % {"scheduler": "fifo", "model": "", "adapt": bad})
    with pytest.raises(SpecError) as err:
        load_spec([tmp_path / "pool.hcl"])
    assert "pool.hcl:" in str(err.value)


def test_the_service_replays_on_its_schedule_outside_the_scheduling_lock(tmp_path: Path) -> None:
    import dataclasses
    import threading

    from rlsched.spec.model import TwinDecl

    write_twin_spec(tmp_path)
    _history(tmp_path)
    with service(tmp_path) as svc:
        # the HCL minimum is a minute; the loop itself takes any period
        svc.policy.decl = dataclasses.replace(svc.policy.decl, twin=TwinDecl(every_s=0.05))
        stopping = threading.Event()
        held_during_replay: list[bool] = []
        replay = svc.twin.run_once

        def watched() -> TwinResult:
            # RLock._is_owned: whether this thread holds the scheduling lock while it replays
            held_during_replay.append(svc.lock._is_owned())  # type: ignore[attr-defined]
            return replay()

        svc.twin.run_once = watched  # type: ignore[method-assign]
        thread = threading.Thread(target=svc.twin.loop, args=(stopping,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while svc.twin.last is None and time.monotonic() < deadline:
            time.sleep(0.05)
        stopping.set()
        thread.join(10)
        assert svc.twin.last is not None and held_during_replay and not any(held_during_replay)
        assert not thread.is_alive()


def test_plan_shows_adapt_and_twin_only_when_set(tmp_path: Path) -> None:
    from rlsched.plan.diff import _policy_attributes
    from rlsched.spec import load_spec

    write_twin_spec(tmp_path, adapt="off")
    plain = load_spec([tmp_path / "pool.hcl"]).policies["default"]
    assert "adapt" not in _policy_attributes(plain) and "twin" not in _policy_attributes(plain)
    write_twin_spec(tmp_path, adapt="recommend", twin='twin {\n    every = "2h"\n  }')
    attrs = _policy_attributes(load_spec([tmp_path / "pool.hcl"]).policies["default"])
    assert attrs["adapt"] == "recommend" and attrs["twin"]["every_s"] == 7200
