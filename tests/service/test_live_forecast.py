"""The service feeds the served model's demand forecaster and hands its forecast to the policy."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlsched.cluster.model import ClusterState
from rlsched.runtime.job_request import JobRequest
from rlsched.service.live_forecast import LiveForecast, forecast_time
from tests.service import PY, service, until, write_spec

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke.yaml"


def _model(folder: Path, with_forecaster: bool) -> Path:
    torch = pytest.importorskip("torch")
    pytest.importorskip("sb3_contrib")
    from rlsched.envs.codec import ObservationCodec
    from rlsched.learned.ppo import PolicyModel
    from rlsched.learned.ppo_net import SlotScorer

    torch.manual_seed(0)
    codec = ObservationCodec()
    PolicyModel.save(folder, SlotScorer(codec.observation_space), codec, {"name": "t"})
    if with_forecaster:
        from rlsched.train.config import load_experiment
        from rlsched.train.forecast_fit import fit_forecasters, save_forecaster

        exp = load_experiment(SMOKE)
        save_forecaster(folder, fit_forecasters(exp)[exp.scenarios[0].name], 1800.0, exp.scenarios[0].name)
    return folder


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What every PPO decision point was handed: its time, forecast and horizon."""
    from rlsched.learned.ppo import PpoScheduler

    out: list[dict[str, Any]] = []
    orig = PpoScheduler.decide

    def decide(self: PpoScheduler, state: ClusterState) -> Iterator[Any]:
        out.append({"time": state.time, "forecast": dict(state.demand_forecast),
                    "horizon": state.demand_forecast_horizon_s})
        return orig(self, state)

    monkeypatch.setattr(PpoScheduler, "decide", decide)
    return out


def test_the_policy_sees_the_models_forecast(tmp_path: Path, seen: list[dict[str, Any]]) -> None:
    from rlsched.learned.ppo import load_policy_ref
    from rlsched.workload.forecast import FORECAST_KEYS

    _model(tmp_path / "model", with_forecaster=True)
    write_spec(tmp_path, scheduler="rl", model="model")
    with service(tmp_path) as svc:
        jobs = [svc.submit(JobRequest([PY, "-c", "pass"], gpus=g)) for g in (1, 2, 1)]
        until(svc, lambda: bool(seen), timeout=120.0)  # (a random-weight policy need not place them)
        assert svc.info()["primary_available"]
        live = svc.scheduling.forecast
        assert live is not None and live.observed == 3 and live.horizon_s == 1800.0
        records = [svc.store.get(j.id) for j in jobs]
    assert seen, "the PPO policy never decided"
    first = seen[0]
    assert set(first["forecast"]) == set(FORECAST_KEYS) and first["horizon"] == 1800.0
    assert first["forecast"]["*"] > 0.0
    # The same forecast as a fresh copy of the model's forecaster that observed the same three
    # submissions on the forecaster's clock (local wall-clock time, see rlsched.service.live_forecast).
    ref = load_policy_ref(str(tmp_path / "model")).forecast
    assert ref is not None
    fc = ref.new()
    origin = float(getattr(fc, "origin_epoch_s", 0.0))
    for rec in records:
        assert rec is not None
        fc.observe(rec.to_job(submit_time=forecast_time(rec.submitted_at, origin)))
    want = fc.predict(forecast_time(first["time"], origin), 1800.0)
    assert first["forecast"] == pytest.approx(want, rel=1e-12)


def test_a_model_without_forecaster_gets_none(tmp_path: Path, seen: list[dict[str, Any]]) -> None:
    _model(tmp_path / "model", with_forecaster=False)
    write_spec(tmp_path, scheduler="rl", model="model")
    with service(tmp_path) as svc:
        svc.submit(JobRequest([PY, "-c", "pass"], gpus=1))
        until(svc, lambda: bool(seen), timeout=120.0)
        assert svc.scheduling.forecast is None
    assert seen and all(s["forecast"] == {} and s["horizon"] == 0.0 for s in seen)


class _Counting:
    """A forecaster double: records what it observed and was asked."""

    origin_epoch_s = 3600.0

    def __init__(self) -> None:
        self.jobs: list[Any] = []
        self.asked: list[tuple[float, float]] = []

    def observe(self, job: Any) -> None:
        self.jobs.append(job)

    def predict(self, now: float, horizon_s: float) -> dict[str, float]:
        self.asked.append((now, horizon_s))
        return {"*": float(len(self.jobs))}


def _rec(seq: int, submitted_at: float) -> Any:
    from rlsched.runtime.store import JobRecord, JobState

    return JobRecord(id=f"j{seq}", seq=seq, argv=("x",), num_gpus=1, gpu_milli=1000, mig_profile=None,
                     gpu_models=(), priority=0, user="u", preemptible=False, deadline=None, state=JobState.QUEUED,
                     attempts=0, exit_code=None, submitted_at=submitted_at, started_at=None, finished_at=None,
                     allocation=None, pid=None, pid_start=None, log_path=None, cancel_requested=False, reason="",
                     idempotency_key=None)


def test_live_forecast_observes_each_submission_once_in_order() -> None:
    fc = _Counting()
    live = LiveForecast(SimpleNamespace(new=lambda: fc, horizon_s=900.0))
    now = 1_700_000_000.0
    old, a, b, c = _rec(1, now - 3 * 86400), _rec(2, now - 60), _rec(3, now - 30), _rec(4, now - 10)
    assert live.observe([b, old, a], since=now - 86400) == 2  # warm-up: the 3-day-old one is skipped
    assert live.observe([a, b, c]) == 1  # only the new one
    assert [j.job_id for j in fc.jobs] == ["j2", "j3", "j4"]
    assert [j.submit_time for j in fc.jobs] == [live.clock(r.submitted_at) for r in (a, b, c)]
    state = ClusterState([])
    live.publish(state, now)
    assert state.demand_forecast == {"*": 3.0} and state.demand_forecast_horizon_s == 900.0
    assert fc.asked == [(live.clock(now), 900.0)]


def test_forecast_time_is_local_wall_clock_minus_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    u = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    try:
        monkeypatch.setenv("TZ", "UTC")
        time.tzset()
        assert forecast_time(u) == u
        monkeypatch.setenv("TZ", "Etc/GMT-2")  # (POSIX sign: UTC+2)
        time.tzset()
        assert forecast_time(u) == u + 7200.0
        assert forecast_time(u, origin_epoch_s=1000.0) == u + 7200.0 - 1000.0
        assert (forecast_time(u) % 86400.0) // 3600.0 == 0.0  # 00:13 local: hour bucket 0 of the day
    finally:
        monkeypatch.undo()
        time.tzset()
