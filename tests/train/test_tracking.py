"""Experiment tracking: URIs, metric namespacing, params, runs - on the embedded SQLite store.

No server needed: these use the default ``sqlite:///<cwd>/mlruns.db`` store in a
scratch directory (the server-backed paths are covered in ``test_registry.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlsched.train.tracking import (
    DEFAULT_ARTIFACTS,
    TrackingError,
    as_number,
    eval_metrics,
    flatten_params,
    metric_key,
    tracking_uri,
)


def test_tracking_uri_env_or_embedded_sqlite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri() == f"sqlite:///{tmp_path.resolve() / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert tracking_uri() == "http://mlflow.internal:5000"


def test_sb3_keys_are_namespaced() -> None:
    assert metric_key("rollout/ep_rew_mean") == "charts/episodic_return"
    assert metric_key("rollout/ep_len_mean") == "charts/episodic_length"
    assert metric_key("time/fps") == "charts/SPS"
    assert metric_key("time/total_timesteps") == "charts/total_timesteps"
    assert metric_key("train/value_loss") == "losses/value_loss"
    assert metric_key("train/approx_kl") == "losses/approx_kl"
    assert metric_key("train/learning_rate") == "charts/learning_rate"
    assert metric_key("eval/mean_reward") == "eval/mean_reward"
    assert metric_key("custom") == "custom"


def test_numbers_and_params() -> None:
    assert as_number(3) == 3.0 and as_number(np.float32(0.5)) == 0.5 and as_number(np.array(2.0)) == 2.0
    assert as_number("x") is None and as_number(True) is None and as_number(np.bool_(True)) is None
    assert as_number(np.zeros(3)) is None and as_number(None) is None
    flat = flatten_params({"ppo": {"gamma": 0.99, "net": {"hidden": 64}}, "seed": 1, "tags": ["a", "b"],
                           "empty": {}, "none": None})
    assert flat == {"ppo.gamma": "0.99", "ppo.net.hidden": "64", "seed": "1", "tags": "['a', 'b']",
                    "empty": "{}", "none": ""}
    assert len(flatten_params({"long": "x" * 10_000})["long"]) == 6000
    assert eval_metrics({"weighted-priority": {"mean_jct_s": 10.0, "label": "x", "bad": float("nan")},
                         "ppo:models/a b": {"cost_usd": 2}}) == {
        "eval/weighted-priority/mean_jct_s": 10.0, "eval/ppo:models/a b/cost_usd": 2.0}


@pytest.fixture
def local_store(quiet_mlflow: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The embedded default store, in a scratch directory."""
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_writer_logs_sb3_records_under_namespaced_keys(local_store: Path) -> None:
    pytest.importorskip("stable_baselines3")
    from mlflow import MlflowClient
    from stable_baselines3.common.logger import KVWriter, Logger

    from rlsched.train.tracking import MlflowWriter, start_run

    with start_run("rlsched-test", run_name="writer", params={"ppo": {"gamma": 0.99}}, tags={"k": "v"}) as run:
        writer = MlflowWriter()
        assert isinstance(writer, KVWriter)
        logger = Logger(folder=None, output_formats=[writer])
        for step, rew in ((100, 1.5), (200, 2.5)):
            logger.record("rollout/ep_rew_mean", rew)
            logger.record("train/value_loss", 0.25)
            logger.record("time/fps", 420)
            logger.record("train/note", "not a number")
            logger.record("train/hidden", 7.0, exclude="mlflow")
            logger.dump(step)
        run_id = run.info.run_id
    client = MlflowClient()
    data = client.get_run(run_id).data
    assert data.params == {"ppo.gamma": "0.99"} and data.tags["k"] == "v"
    assert set(data.metrics) == {"charts/episodic_return", "losses/value_loss", "charts/SPS"}
    hist = client.get_metric_history(run_id, "charts/episodic_return")
    assert [(m.step, m.value) for m in sorted(hist, key=lambda m: m.step)] == [(100, 1.5), (200, 2.5)]
    assert client.get_run(run_id).info.status == "FINISHED"
    # the embedded store keeps artifacts beside the database
    exp = client.get_experiment_by_name("rlsched-test")
    assert exp is not None and exp.artifact_location.endswith(DEFAULT_ARTIFACTS)
    assert (local_store / "mlruns.db").exists()


def test_tracker_lifecycle_eval_and_failure_status(local_store: Path) -> None:
    from mlflow import MlflowClient

    from rlsched.train.tracking import Tracker, log_eval

    tracker = Tracker("rlsched-test", run_name="ok", params={"a": {"b": 1}})
    tracker.log_eval({"ppo": {"mean_jct_s": 100.0}, "weighted-priority": {"mean_jct_s": 200.0}}, step=5)
    tracker.log_metrics({"bc/agreement": 0.9, "skip": "text"}, step=0)
    tracker.close()
    tracker.close()  # idempotent
    client = MlflowClient()
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {"eval/ppo/mean_jct_s": 100.0, "eval/weighted-priority/mean_jct_s": 200.0,
                                "bc/agreement": 0.9}

    failing = Tracker("rlsched-test", run_name="boom")
    with pytest.raises(RuntimeError):
        try:
            raise RuntimeError("training crashed")
        finally:
            failing.close()
    assert client.get_run(failing.run_id).info.status == "FAILED"
    with pytest.raises(TrackingError, match="needs an MLflow run"):
        log_eval({"ppo": {"mean_jct_s": 1.0}})


def test_server_down_start_run_fails_in_seconds(quiet_mlflow: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import time

    from rlsched.train.tracking import Tracker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(TrackingError, match=r"not reachable.*unset MLFLOW_TRACKING_URI"):
        Tracker("rlsched-test")
    assert time.monotonic() - t0 < 60.0  # not MLflow's minutes of retries (a guard, not a speed target)


def test_importing_tracking_registry_and_cli_is_light() -> None:
    code = ("import sys, rlsched.train.tracking, rlsched.train.registry, rlsched.cli.registry_cmd; "
            "print(sorted(m for m in ('mlflow', 'torch', 'stable_baselines3') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
