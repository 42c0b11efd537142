"""The model folder a training run writes: the gate judges the folder as it will be served."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlsched.envs.trained_actions import TrainedActions
from rlsched.scenario import load_scenario
from rlsched.train import trainer
from rlsched.train.config import load_experiment
from rlsched.train.run_steps import codec_of

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("reused", [False, True])
def test_the_gate_sees_the_runs_own_forecaster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               reused: bool) -> None:
    """Spot families replay every competitor with the model's forecaster: a gate run before the forecaster
    is written judged a fresh folder without one and a reused folder with the previous run's."""
    pytest.importorskip("torch")
    from rlsched.learned.ppo_net import SlotScorer
    from rlsched.workload.forecast import make_forecaster

    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    out = tmp_path / "model"
    out.mkdir()
    if reused:
        (out / "forecaster.json").write_text('{"stale": true}\n')
    seen: list[str] = []

    def gate(exp: Any, folder: Path, card: dict[str, Any], log: Any, *, ray: str | None = None) -> str:
        seen.append((folder / "forecaster.json").read_text())
        return ""

    monkeypatch.setattr(trainer, "family_gate", gate)
    monkeypatch.setattr(trainer, "model_card_markdown", lambda card, table: "")
    net = SlotScorer(codec_of(exp).observation_space)
    forecaster = make_forecaster("smoothed-seasonal")
    forecaster.fit(load_scenario().jobs[:200])
    run = SimpleNamespace(exp=exp, log=lambda msg: None, ray=None,
                          worlds=SimpleNamespace(fitted={exp.scenarios[0].name: forecaster},
                                                 trained_actions=TrainedActions.unrestricted("test")))
    model = SimpleNamespace(policy=SimpleNamespace(features_extractor=net))
    trainer.SlotTrainingRun.export(run, out, model, {}, "")  # type: ignore[arg-type]
    assert len(seen) == 1 and "stale" not in seen[0] and '"fitted_on": "bundled-default"' in seen[0]
