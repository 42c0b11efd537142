"""``rlsched train experiments/smoke.yaml`` end to end through a real MLflow server.

Trains (one minute), registers a version, loads it back by alias, runs it in
``rlsched simulate``, resumes from a checkpoint, and refuses a bad experiment
without leaving registry entries behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def rl(*args: str, env: dict[str, str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlsched", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout)


@pytest.fixture
def smoke_exp(tmp_path: Path, model_name: str) -> Path:
    text = (ROOT / "experiments" / "smoke.yaml").read_text()
    text = text.replace("output: ../runs/smoke/model", f"output: {tmp_path / 'model'}")
    text += f"mlflow: {{experiment: smoke-tests, registered_model: {model_name}}}\n"
    text += "serve_rules:\n  deadline_guard: {trust_deadline: true}\n"  # served, not trained (checked below)
    exp = tmp_path / "smoke.yaml"
    exp.write_text(text)
    return exp


def test_smoke_train_registers_loads_and_simulates(registry: str, smoke_exp: Path, model_name: str,
                                                   tmp_path: Path) -> None:
    env = dict(os.environ, MLFLOW_TRACKING_URI=registry, RLSCHED_MODEL_CACHE=str(tmp_path / "cache"))
    proc = rl("train", str(smoke_exp), "-q", "--run-dir", str(tmp_path / "run"), env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"registered {model_name} version 1 (alias challenger)" in proc.stdout
    card = json.loads((tmp_path / "model" / "card.json").read_text())
    assert card["mlflow"]["version"] == 1
    assert set(card["metrics"]["eval"]) >= {"ppo", "weighted-priority", "fifo", "sjf", "tiresias", "best-fit",
                                             "fgd", "fair-share", "spot-fallback"}
    assert card["metrics"]["holdout"] is not None
    # trained behind a deadline guard, so every heuristic is also measured behind that guard: a gain must be the
    # network's, not the rule's
    assert {"weighted-priority+rules", "sjf+rules", "spot-fallback+rules"} <= set(card["metrics"]["eval"])
    assert (tmp_path / "model" / "MODEL_CARD.md").read_text().startswith("# Model card: smoke")
    # the demand forecaster: fitted on the training window, saved, scored against seasonal-naive
    assert (tmp_path / "model" / "forecaster.json").exists()
    # the action kinds its training fleet (the bundled hybrid one) offered, for masking when served
    actions = json.loads((tmp_path / "model" / "actions.json").read_text())
    assert actions["place"] == ["ondemand", "onprem", "spot"] and actions["reconfigure"] == ["onprem"]
    assert "trained actions: place: ondemand,onprem,spot; reconfigure: onprem" in proc.stdout
    assert "- trained actions (`actions.json`" in (tmp_path / "model" / "MODEL_CARD.md").read_text()
    fc = card["forecast"]
    assert fc["model"] == "smoothed-seasonal" and fc["file"] == "forecaster.json"
    assert fc["fitted_on"]["bundled-default"]["fit_range_s"][1] <= 12 * 3600.0  # the training window [0, 12] h
    assert fc["error"]["origins"] > 0 and {"mae", "rmse", "smape"} <= set(fc["error"]["mean"]["model"])
    assert "Demand forecast on the evaluation windows" in (tmp_path / "model" / "MODEL_CARD.md").read_text()
    assert "Demand forecast on the evaluation windows" in proc.stdout
    import mlflow

    metrics = mlflow.MlflowClient(registry).get_run(card["mlflow"]["run_id"]).data.metrics
    assert {"forecast/smoothed-seasonal/mae", "forecast/seasonal-naive/mae", "forecast/smoothed-seasonal/rmse"} \
        <= set(metrics)

    # the workload-family gate ran on the saved policy; its verdict is in the card, the model card and the
    # registered version's tag, which promote reads
    fam = card["metrics"]["families"]
    assert fam["exposure"] == {"gen-tiny-fleet": "unseen"} and fam["summary"]["gen-tiny-fleet"]["windows"] == 1
    assert "model_vs_best" in fam["summary"]["gen-tiny-fleet"]
    assert "### Workload families" in (tmp_path / "model" / "MODEL_CARD.md").read_text()
    assert "- promotion gate: " in proc.stdout
    # registry_uri too: an in-process MLflow test earlier in the session may have left a global registry URI
    tags = mlflow.MlflowClient(tracking_uri=registry, registry_uri=registry).get_model_version(model_name, "1").tags
    assert json.loads(tags["family_gate"])["summary"]["gen-tiny-fleet"]["model_vs_best"] == \
        fam["summary"]["gen-tiny-fleet"]["model_vs_best"]

    out = tmp_path / "sim.json"
    sim = rl("simulate", "-q", "--max-jobs", "80", "--horizon", "43200", "-p", f"ppo:models:/{model_name}@challenger",
             "-p", "weighted-priority", "--json", str(out), env=env, cwd=tmp_path)
    assert sim.returncode == 0, sim.stderr
    results = json.loads(out.read_text())["results"]
    assert results[0]["policy"] == f"ppo:models:/{model_name}@challenger"
    assert results[0]["refused_decisions"] == 0
    assert json.loads(out.read_text())["forecast"]["fitted_on"] == "bundled-default"  # the model's forecaster ran
    # the deadline guard it trained with travels with it through the registry
    assert card["deadline_guard"]["margin_frac"] == 0.25
    assert "- deadline guard:" in (tmp_path / "model" / "MODEL_CARD.md").read_text()
    assert list((tmp_path / "cache").rglob("deadline_guard.json")), "the registry's copy lost deadline_guard.json"
    # ... as served: with the experiment's serve_rules, which its training did not have
    copied = json.loads(next((tmp_path / "cache").rglob("deadline_guard.json")).read_text())
    assert copied["trust_deadline"] is True and card["deadline_guard"]["trust_deadline"] is True
    assert card["trained_rules"]["deadline_guard"]["trust_deadline"] is False
    assert "- served, not trained, with:" in (tmp_path / "model" / "MODEL_CARD.md").read_text()

    # --resume continues from the last checkpoint rather than starting over
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step-*.zip"))
    assert ckpts, "training wrote no checkpoint"
    again = rl("train", str(smoke_exp), "-q", "--resume", "--no-track", "--run-dir", str(tmp_path / "run"),
               "--total-steps", "1536", env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resumed from step-" in again.stdout
    # ... and its card still names the teacher cloned before the checkpoint (the family gate replays it)
    resumed = json.loads((tmp_path / "model" / "card.json").read_text())
    assert resumed["behaviour_cloning"] == {"teacher": card["behaviour_cloning"]["teacher"], "bc/resumed": 1.0}
    # ... and says it resumed, and from which checkpoint: its wall time is not the network's training time
    assert resumed["resumed_from"] == ckpts[-1].name and resumed["command"].endswith(" --resume")
    assert f"it resumed from `{ckpts[-1].name}`" in (tmp_path / "model" / "MODEL_CARD.md").read_text()
    assert card["resumed_from"] is None


def test_bad_experiment_is_one_line_and_registers_nothing(tmp_path: Path, model_name: str) -> None:
    # A real SQLite registry of its own (the shared server fixture is not needed to see "nothing registered").
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    env = dict(os.environ, MLFLOW_TRACKING_URI=registry)
    exp = tmp_path / "bad.yaml"
    shutil.copy(ROOT / "experiments" / "smoke.yaml", exp)
    exp.write_text(exp.read_text().replace("total_steps:", "totl_steps:") +
                   f"mlflow: {{registered_model: {model_name}}}\n")
    proc = rl("train", str(exp), "-q", env=env, cwd=tmp_path)
    assert proc.returncode == 1
    assert "did you mean 'total_steps'" in proc.stderr and "Traceback" not in proc.stderr
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=registry, registry_uri=registry)  # not a global left by another test
    assert not client.search_registered_models(filter_string=f"name = '{model_name}'")


def test_tracking_server_down_is_a_clear_error(tmp_path: Path) -> None:
    env = dict(os.environ, MLFLOW_TRACKING_URI="http://127.0.0.1:9")
    proc = rl("train", str(ROOT / "experiments" / "smoke.yaml"), "-q", "--run-dir", str(tmp_path / "run"),
              env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "127.0.0.1:9" in proc.stderr
