"""The model card built from an experiment and what its training measured (no training here)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlsched.envs.trained_actions import TrainedActions
from rlsched.train.config import load_experiment
from rlsched.train.model_card import CardFacts, build_card, forecast_card, model_card_markdown

ROOT = Path(__file__).resolve().parents[2]


def _evaluation(ppo_jct: float) -> dict[str, Any]:
    summary = {"ppo": {"mean_jct_s": ppo_jct, "deadline_misses": 0.0},
               "weighted-priority": {"mean_jct_s": 100.0, "deadline_misses": 0.0},
               "sjf": {"mean_jct_s": 80.0, "deadline_misses": 0.0}}
    return {"summary": summary, "relative": {"ppo": {"jct_vs_weighted_priority": ppo_jct / 100.0}},
            "worlds": [{"world": "w0"}]}


def _facts(**changes: Any) -> CardFacts:
    base: dict[str, Any] = {
        "observation_signature": "sig-1", "training_worlds": [f"w{i}" for i in range(8)], "steps": 1024,
        "wall_s": 12.345, "bc_stats": {}, "ev": _evaluation(90.0), "ho": None,
        "trained_actions": TrainedActions.unrestricted("test"), "forecast": None,
    }
    base.update(changes)
    return CardFacts(**base)


def test_card_holds_the_run_and_its_results() -> None:
    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    card = build_card(exp, _facts())
    assert list(card)[:4] == ["name", "description", "observation_signature", "experiment"]
    assert (card["name"], card["steps"], card["wall_s"], card["seed"]) == ("smoke", 1024, 12.3, exp.seed)
    assert card["metrics"]["eval"]["ppo"]["mean_jct_s"] == 90.0 and card["metrics"]["holdout"] is None
    assert card["behaviour_cloning"] is None and card["forecast"] is None
    assert card["deadline_guard"] == exp.rule_params()["deadline_guard"]
    assert card["command"] == f"rlsched train {exp.source}"
    json.dumps(card)  # card.json is written from it
    cloned = build_card(exp, _facts(bc_stats={"bc/agreement_after": 0.9}))
    assert cloned["behaviour_cloning"] == {"teacher": exp.bc.teacher, "bc/agreement_after": 0.9}


def test_forecast_section_names_where_each_forecaster_was_fitted() -> None:
    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")

    class Fitted:
        fit_range = (0.0, 43200.0)

    window = {"origins": 3, "mean_actual": 1.5, "forecaster": {"mae": 1.0}, "baseline": {"mae": 2.0}}
    report = {"baseline": "seasonal-naive", "step_s": 600.0, "origins": 3, "mean": {"model": {"mae": 1.0}},
              "windows": {"a": window, "b": {"origins": 0}}}
    fc = forecast_card(exp, {"bundled-default": Fitted()}, report)
    assert fc["saved"] == "bundled-default" and fc["file"] == "forecaster.json"
    assert fc["fitted_on"]["bundled-default"] == {"train_window_h": exp.scenarios[0].train_window_h,
                                                  "fit_range_s": (0.0, 43200.0)}
    assert fc["error"]["windows"] == {"a": {"origins": 3, "mean_actual": 1.5, "model": {"mae": 1.0},
                                            "baseline": {"mae": 2.0}}, "b": {"origins": 0}}


def test_markdown_names_the_heuristics_that_still_win_and_the_rules() -> None:
    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    text = model_card_markdown(build_card(exp, _facts()), "TABLE")
    assert text.startswith("# Model card: smoke\n")
    assert "- training worlds: 8 (w0, w1, w2, w3, w4, w5, ...)" in text
    assert "Heuristics that still beat it on mean JCT: sjf." in text
    assert "- deadline guard: " in text and text.endswith("TABLE\n")


def test_card_records_serving_only_rule_changes_and_the_trained_rules() -> None:
    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    plain = build_card(exp, _facts())
    assert plain["serve_rules"] is None and plain["trained_rules"] is None
    assert "served, not trained" not in model_card_markdown(plain, "")
    served = replace(exp, serve_rules={"deadline_guard": {"trust_deadline": True}})
    card = build_card(served, _facts())
    assert card["deadline_guard"]["trust_deadline"] is True  # the folder's rules are the served ones
    assert card["trained_rules"]["deadline_guard"]["trust_deadline"] is False
    assert card["serve_rules"] == {"deadline_guard": {"trust_deadline": True}}
    text = model_card_markdown(card, "")
    assert "- served, not trained, with: {'deadline_guard': {'trust_deadline': True}}" in text
    # the rule's own line shows the served parameters and says which of them the network never trained behind
    guard = next(line for line in text.splitlines() if line.startswith("- deadline guard: "))
    assert "'trust_deadline': True" in guard and guard.endswith(
        "`deadline_guard.json`); trained with trust_deadline=False, served with trust_deadline=True")
    assert text.count("; trained with ") == 1  # only the rule serving changes says so


def test_an_anchored_network_says_which_teacher_it_starts_as() -> None:
    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    plain = build_card(exp, _facts())
    assert plain["anchor"] is None and "anchored to" not in model_card_markdown(plain, "")
    card = build_card(replace(exp, anchor="sjf"), _facts())
    assert card["anchor"] == "sjf"
    assert "- anchored to: `sjf` (the network adds a fixed weight times that teacher's legal choice" \
        in model_card_markdown(card, "")


def test_a_spot_card_leads_with_money_and_deadlines() -> None:
    # a spot model is bought to save money within deadlines: its card says that before its JCT
    root = ROOT / "models"
    spot = model_card_markdown(json.loads((root / "spot" / "card.json").read_text()), "")
    assert spot.index("Against on-demand-only capacity") < spot.index("On the evaluation windows the policy's mean JCT")
    assert spot.index("Cheaper than it with no more deadline misses") < spot.index("Heuristics that still beat it")
    onprem = model_card_markdown(json.loads((root / "default" / "card.json").read_text()), "")
    assert "Against on-demand-only capacity" not in onprem and "On the evaluation windows" in onprem
