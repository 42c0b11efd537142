"""``rlsched train`` on a ``selector:`` experiment, end to end through a real MLflow server.

Trains a tiny heuristic selector, registers it, serves it back by alias in ``rlsched simulate``
and through the pyfunc, resumes from its checkpoint, and refuses bad ``selector:`` keys in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXPERIMENT = """
name: selector-smoke
scenarios:
  - name: bundled-default
    scenario: bundled:default
    train_window_h: [0, 12]
    eval_windows_h: [[20, 30]]
selector: {{candidates: [weighted-priority, sjf], hold_s: 1800, episode_jobs: 80,
           label_count: 8, label_every: 1, label_horizon_s: 3600, label_epochs: 2, margin: 0.05}}
eval_max_jobs: 120
n_envs: 2
total_steps: {steps}
ppo: {{n_steps: 64, batch_size: 64, n_epochs: 2}}
bc: {{steps: 0}}
checkpoint_every_steps: 128
forecast: {{model: none}}
gate: {{families: [gen-tiny-fleet], windows: 1, max_jobs: 100}}
mlflow: {{experiment: selector-tests, registered_model: {name}}}
output: {out}
"""


def rl(*args: str, env: dict[str, str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlsched", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout)


def _experiment(tmp_path: Path, name: str, steps: int = 256, **replace: str) -> Path:
    text = EXPERIMENT.format(steps=steps, name=name, out=tmp_path / "model")
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "selector.yaml"
    path.write_text(text)
    return path


def test_selector_trains_registers_serves_and_resumes(registry: str, model_name: str, tmp_path: Path) -> None:
    env = dict(os.environ, MLFLOW_TRACKING_URI=registry, RLSCHED_MODEL_CACHE=str(tmp_path / "cache"))
    exp = _experiment(tmp_path, model_name)
    proc = rl("train", str(exp), "-q", "--run-dir", str(tmp_path / "run"), env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "selector over weighted-priority, sjf: one choice per 1800 s" in proc.stdout
    assert "labelling 8 states" in proc.stdout and "cloned the labels" in proc.stdout
    assert (tmp_path / "run" / "selector_labels.npz").exists()
    assert f"registered {model_name} version 1 (alias challenger)" in proc.stdout
    folder = tmp_path / "model"
    assert {"selector.json", "card.json", "MODEL_CARD.md"} <= {p.name for p in folder.iterdir()}
    card = json.loads((folder / "card.json").read_text())
    assert card["steps"] >= 256 and card["mlflow"]["version"] == 1
    assert {"ppo", "weighted-priority", "sjf", "fair-share"} <= set(card["metrics"]["eval"])
    assert card["selector"]["candidates"] == ["weighted-priority", "sjf"]
    # the labels' safest candidate takes the unsure choices, and the folder serves it so
    assert "safest candidate on the labels (mildest worst state): " in proc.stdout
    default = card["selector"]["default"]
    assert default in ("weighted-priority", "sjf") and card["selector"]["margin"] == 0.05
    assert f"go to {default}" in proc.stdout
    doc = json.loads((folder / "selector.json").read_text())
    assert (doc["default"], doc["margin"]) == (default, 0.05)
    assert card["behaviour_cloning"]["teacher"] == "selector-labels"
    assert card["behaviour_cloning"]["selector/labels"] == 8.0
    choices = card["selector"]["choices"]
    assert choices and all(set(c) <= {"weighted-priority", "sjf"} and sum(c.values()) > 0 for c in choices.values())
    assert "gen-tiny-fleet" in card["metrics"]["families"]["summary"]
    md = (folder / "MODEL_CARD.md").read_text()
    assert "promotion gate:" in md
    assert f"- unsure choices go to {default}, the labels' safest candidate: another is chosen only with 0.05" in md
    # a selector is served behind no action record: its card says what the fleets offered, not what is masked
    assert "- training fleets offered (a selector acts only through its heuristics" in md and "actions.json" not in md

    # served back from the registry by alias, like any model
    out = rl("simulate", "--policy", f"ppo:models:/{model_name}@challenger", "--policy", "sjf", "--max-jobs", "60",
             "--json", str(tmp_path / "sim.json"), env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    sim = json.loads((tmp_path / "sim.json").read_text())
    names = [r["policy"] for r in (sim["results"] if isinstance(sim, dict) and "results" in sim else sim)]
    assert f"ppo:models:/{model_name}@challenger" in names

    # the registered pyfunc answers regime features with candidate indices
    import mlflow

    from rlsched.envs.regime import REGIME_FEATURES

    pyfunc = mlflow.pyfunc.load_model(f"models:/{model_name}@challenger")
    picks = pyfunc.predict([[0.0] * len(REGIME_FEATURES), [3.0] * len(REGIME_FEATURES)])
    assert len(picks) == 2 and set(int(p) for p in picks) <= {0, 1}

    # resume: a longer total continues from the checkpoint instead of starting over
    longer = _experiment(tmp_path, model_name, steps=384)
    proc = rl("train", str(longer), "-q", "--no-track", "--resume", "--run-dir", str(tmp_path / "run"), env=env,
              cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from step-" in proc.stdout
    assert json.loads((folder / "selector.json").read_text())["default"] == default  # from the cached labels
    assert json.loads((folder / "card.json").read_text())["steps"] >= 384

    # a fresh run in the same run dir reuses the labels; its card counts what they cost and says so
    proc = rl("train", str(exp), "-q", "--no-track", "--run-dir", str(tmp_path / "run"), env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reusing 8 labelled states" in proc.stdout
    again = json.loads((folder / "card.json").read_text())
    bc = again["behaviour_cloning"]
    assert bc["selector/labels_reused"] == 1.0 and card["behaviour_cloning"]["selector/labels_reused"] == 0.0
    assert again["wall_s"] >= bc["selector/label_wall_s"] > 0
    md_again = (folder / "MODEL_CARD.md").read_text()
    assert "s of labelling, reused from an earlier run's `selector_labels.npz`)" in md_again
    assert "reused from an earlier run" not in md

    # a resumed run whose run dir lost its labels cannot know the safe default: one line, before any training
    (tmp_path / "run" / "selector_labels.npz").unlink()
    proc = rl("train", str(_experiment(tmp_path, model_name, steps=512)), "-q", "--no-track", "--resume",
              "--run-dir", str(tmp_path / "run"), env=env, cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "selector.default: auto needs this run's labels" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("old", "new", "message"), [
    ("candidates: [weighted-priority, sjf]", "candidates: [weighted-priority, shortest]", "unknown policy 'shortest'"),
    ("candidates: [weighted-priority, sjf]", "candidates: [sjf]", "at least two"),
    ("candidates: [weighted-priority, sjf]", "candidates: [sjf, sjf]", "each heuristic once"),
    ("hold_s: 1800", "hold_s: 0", "hold_s must be > 0"),
    ("hold_s: 1800", "hold: 1800", "hold"),
    ("label_horizon_s: 3600", "label_horizon_s: 600", "label_horizon_s must be >= hold_s"),
    ("label_count: 8", "label_count: -1", "label_count must be >= 0"),
    ("label_count: 8", "label_count: 8, label_rounds: -1", "label_rounds >= 0"),
    ("margin: 0.05", "margin: 1.5", "selector.margin: a number in [0, 1)"),
    ("margin: 0.05", "margin: wide", "selector.margin: a number in [0, 1)"),
    ("margin: 0.05", "margin: 0.05, default: fifo", "selector.default: 'auto' or one of the candidates"),
    ("label_count: 8", "label_count: 0", "with label_count 0 name a candidate"),
])
def test_bad_selector_keys_are_one_line_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    exp = _experiment(tmp_path, "unused", **{old: new})
    proc = rl("train", str(exp), "-q", "--no-track", "--run-dir", str(tmp_path / "run"), env=dict(os.environ),
              cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "model").exists()
