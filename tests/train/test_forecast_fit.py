"""The training run's demand forecaster: fitted on training windows only, attached per world, saved and served."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.train.config import load_experiment
from rlsched.train.forecast_fit import (
    attach,
    error_markdown,
    error_metrics,
    fit_forecasters,
    forecast_error,
    save_forecaster,
    training_jobs,
)
from rlsched.train.worlds import evaluation_worlds, training_worlds
from rlsched.workload.forecast import SmoothedSeasonal

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke.yaml"


def test_fitted_on_the_training_window_only() -> None:
    exp = load_experiment(SMOKE)
    fitted = fit_forecasters(exp)
    entry = exp.scenarios[0]
    f = fitted[entry.name]
    assert isinstance(f, SmoothedSeasonal)
    a, b = entry.train_window_h  # type: ignore[misc]
    jobs, span = training_jobs(entry)
    assert span == (b - a) * 3600.0
    assert all(0.0 <= j.submit_time < span for j in jobs)
    assert f.fit_range == (0.0, span, sum(1 for j in jobs if j.num_gpus > 0))
    # evaluation windows lie after the training window, and nothing of them was fitted on
    for lo, _ in entry.eval_windows_h:
        assert lo >= b


def test_worlds_get_their_own_clock_and_fresh_copies() -> None:
    exp = load_experiment(SMOKE)
    fitted = fit_forecasters(exp)
    base = fitted[exp.scenarios[0].name]
    train = attach(exp, training_worlds(exp.scenarios), fitted)
    ev = attach(exp, evaluation_worlds(exp.scenarios, exp.eval_max_jobs), fitted)
    ho = attach(exp, evaluation_worlds(exp.holdout, exp.eval_max_jobs), fitted, holdout=True)
    assert all(w.forecaster is not None and w.forecaster is not base for w in train + ev + ho)
    assert train[0].forecaster.fit_range == base.fit_range  # type: ignore[attr-defined]
    # an evaluation window starting 20 h into the trace sees the profile 20 h later than time 0
    w = ev[0]
    assert w.forecaster.predict(0.0, 3600.0) == pytest.approx(  # type: ignore[attr-defined]
        base.shifted(0.0).predict(w.start_h * 3600.0, 3600.0))
    # the holdout window replays the same scenario as the training entry: shifted likewise
    assert ho[0].forecaster._phase == pytest.approx(base._phase + ho[0].start_h * 3600.0)  # type: ignore[attr-defined]
    # with forecast: none, nothing is fitted or attached
    off = load_experiment(_with(SMOKE, "forecast: {model: none}\n"))
    assert fit_forecasters(off) == {}


def _with(src: Path, extra: str) -> Path:
    import tempfile

    p = Path(tempfile.mkdtemp()) / "exp.yaml"
    p.write_text(src.read_text() + extra)
    return p


def test_training_env_observes_the_forecast() -> None:
    import math

    from rlsched.train.worlds import MultiWorldEnv

    exp = load_experiment(SMOKE)
    worlds = attach(exp, training_worlds(exp.scenarios), fit_forecasters(exp))
    env = MultiWorldEnv(worlds, window=exp.window, max_pools=exp.max_pools, episode_jobs=exp.episode_jobs)
    obs, _ = env.reset(seed=3)
    state = env.current.engine.state
    assert set(state.demand_forecast) >= {"*", "1"} and state.demand_forecast_horizon_s == 3600.0
    assert float(obs["globals"][6]) == pytest.approx(math.log1p(state.demand_forecast["*"]), rel=1e-5)
    first = env.current.engine.forecaster
    env.reset(seed=4)
    assert env.current.engine.forecaster is not first  # a fresh copy per episode


def test_error_report_against_seasonal_naive() -> None:
    exp = load_experiment(SMOKE)
    fitted = fit_forecasters(exp)
    rep = forecast_error(exp, evaluation_worlds(exp.scenarios, exp.eval_max_jobs), fitted)
    assert rep["model"] == "smoothed-seasonal" and rep["baseline"] == "seasonal-naive"
    assert rep["origins"] > 0 and len(rep["windows"]) == len(exp.scenarios[0].eval_windows_h)
    metrics = error_metrics(rep)
    for m in ("mae", "rmse", "smape"):
        assert f"forecast/smoothed-seasonal/{m}" in metrics and f"forecast/seasonal-naive/{m}" in metrics
    assert "MAE model / naive" in error_markdown(rep)


@pytest.fixture
def model_with_forecaster(tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    from rlsched.envs.codec import ObservationCodec
    from rlsched.learned.ppo import PolicyModel
    from rlsched.learned.ppo_net import SlotScorer

    exp = load_experiment(SMOKE)
    fitted = fit_forecasters(exp)
    codec = ObservationCodec()
    folder = PolicyModel.save(tmp_path / "m", SlotScorer(codec.observation_space), codec, {"name": "t"})
    save_forecaster(folder, fitted[exp.scenarios[0].name], 1800.0, exp.scenarios[0].name)
    return folder


def test_policy_ref_exposes_the_forecaster(model_with_forecaster: Path, tmp_path: Path) -> None:
    from rlsched.learned.ppo import ModelError, load_policy_ref, make_ppo_policy, policy_forecast

    model = load_policy_ref(str(model_with_forecaster))
    assert model.forecast is not None and model.forecast.horizon_s == 1800.0
    assert isinstance(model.forecast.forecaster, SmoothedSeasonal)
    a, b = model.forecast.new(), model.forecast.new()
    assert a is not b and a is not model.forecast.forecaster
    assert policy_forecast(make_ppo_policy(str(model_with_forecaster))) is not None
    (model_with_forecaster / "forecaster.json").write_text("{")
    with pytest.raises(ModelError, match=r"forecaster\.json: corrupted"):
        load_policy_ref(str(model_with_forecaster))
    (model_with_forecaster / "forecaster.json").unlink()
    assert load_policy_ref(str(model_with_forecaster)).forecast is None  # older models: as before


def test_simulate_runs_every_policy_with_the_models_forecaster(model_with_forecaster: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "rlsched", "simulate", "-q", "--max-jobs", "20", "--horizon", "7200",
           "-p", f"ppo:{model_with_forecaster}", "-p", "weighted-priority", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["forecast"] == {"model": "SmoothedSeasonal", "horizon_s": 1800.0, "fitted_on": "bundled-default"}
    plain = subprocess.run([*cmd[:4], "--max-jobs", "20", "--horizon", "7200", "-p", "weighted-priority",
                            "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(out.read_text())["forecast"] is None
