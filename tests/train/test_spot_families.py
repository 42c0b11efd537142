"""Spot families: windows on hybrid fleets, the spot summary, the spot gate rule and exposure."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlsched.train.families import FamilyError, exposure, is_spot_model, resolve
from rlsched.train.generalisation import (
    CANDIDATE,
    SPOT_BASELINES,
    FamilyReport,
    evaluate_families,
    family_checks,
    spot_table,
    summarise_spot,
    verdict,
)

ROOT = Path(__file__).resolve().parents[2]


def _card(name: str) -> dict[str, Any]:
    return dict(json.loads((ROOT / "models" / name / "card.json").read_text()))


def _row(cost: float, misses: int, lost: float = 0.0, jct: float = 100.0) -> dict[str, float]:
    return {"cost_usd": cost, "deadline_misses": misses, "lost_gpu_hours": lost, "mean_jct_s": jct}


def test_a_spot_family_replays_every_spot_baseline_on_tiny_windows() -> None:
    fams = resolve(["spot-regional", "spot-cheap-stable"])
    rep = evaluate_families(fams, None, windows=2, max_jobs=40)
    for key in ("spot-regional", "spot-cheap-stable"):
        s = rep.summaries[key]
        assert s["kind"] == "spot" and s["windows"] == 2 and rep.exposure[key] == "unseen"
        assert set(s["baselines"]) == set(SPOT_BASELINES)
        assert s["baselines"]["ondemand-autoscale"]["cost_vs_od"] == pytest.approx(1.0)
        fewest = min(b["misses"] for b in s["baselines"].values())
        assert s["best_misses"] == fewest  # the best baseline has the fewest misses ...
        assert s["best_cost_vs_od"] == min(b["cost_vs_od"] for b in s["baselines"].values()
                                           if b["misses"] == fewest)  # ... and is the cheapest of those
        assert s["cheapest_cost_vs_od"] <= s["best_cost_vs_od"]
    world = next(iter(rep.spot_windows["spot-regional"]))
    assert world.startswith("spot-regional/seed1000") and not rep.windows  # no on-prem rows
    table = spot_table(rep)
    assert "| spot-regional | unseen | 2 |" in table and "model" not in table


def test_the_regional_family_runs_one_spot_pool_per_region() -> None:
    (fam,) = resolve(["spot-regional"])
    (w,) = fam.windows(1, 30)
    spot = [p for p in w.scenario.pools if p.kind.value == "spot"]
    assert [p.region for p in spot] == ["region-a", "region-b", "region-c"]
    assert all(j.preemptible and j.deadline is not None for j in w.scenario.jobs)


def test_best_is_the_cheapest_of_the_fewest_misses_and_the_gate_refuses_more_misses() -> None:
    per_window = {
        "w1": {"ondemand-autoscale": _row(100, 2), "spot-greedy": _row(30, 3, 9.0), "spot-fallback": _row(50, 1, 2.0),
               "uniform-progress": _row(60, 1, 1.0), CANDIDATE: _row(40, 2, 5.0)},
        "w2": {"ondemand-autoscale": _row(200, 0), "spot-greedy": _row(40, 1, 4.0), "spot-fallback": _row(80, 0, 1.0),
               "uniform-progress": _row(100, 0, 0.0), CANDIDATE: _row(60, 0, 1.0)},
    }
    s = summarise_spot(per_window)
    assert s["cheapest"] == "spot-greedy" and s["best"] == "spot-fallback"  # 1 miss beats cheaper 4 misses
    assert (s["best_misses"], s["best_lost_gpu_h"]) == (1, 3.0)
    assert s["model_misses"] == 2 and s["model_cost_vs_od"] == pytest.approx((0.4 + 0.3) / 2)
    assert s["model_cost_vs_best"] == pytest.approx((40 / 50 + 60 / 80) / 2)  # a mean of per-window ratios
    checks = family_checks({"spot-x": s}, {"spot-x": "unseen"})
    assert len(checks) == 1 and not checks[0][0]
    assert "candidate 2 deadline misses NOT <= 1 of the best baseline (spot-fallback)" in checks[0][1]
    lines = verdict({"spot-x": s}, {"spot-x": "unseen"})
    assert any(line.startswith("spot: no more deadline misses") and "FAIL" in line for line in lines)
    # as few misses as the best baseline: the gate passes, seen families never count
    ok = {**s, "model_misses": 1}
    assert [passed for passed, _ in family_checks({"spot-x": ok}, {"spot-x": "unseen"})] == [True]
    assert not family_checks({"spot-x": s}, {"spot-x": "trained"})[0][0]  # nothing unseen judged
    # a spot model judged only on on-prem families is refused: nothing shows it keeps deadlines
    onprem = {"gen-light": {"windows": 2, "best": "sjf", "model_vs_best": 0.99}}
    checks = family_checks(onprem, {"gen-light": "unseen"}, spot_model=True)
    assert [ok for ok, _ in checks] == [True, False] and "no unseen spot family" in checks[1][1]


def test_the_spot_headroom_is_a_hindsight_pick_that_misses_no_more_than_the_best() -> None:
    per_window = {
        # the cheapest here misses more than the best: the pick is the cheaper of the punctual ones
        "w1": {"ondemand-autoscale": _row(100, 0), "spot-greedy": _row(30, 2), "spot-fallback": _row(50, 0),
               "uniform-progress": _row(45, 0)},
        # here the cheapest misses nothing, so it is the pick
        "w2": {"ondemand-autoscale": _row(100, 0), "spot-greedy": _row(40, 0), "spot-fallback": _row(60, 0),
               "uniform-progress": _row(70, 0)},
    }
    s = summarise_spot(per_window)
    assert (s["best"], s["cheapest"]) == ("spot-fallback", "spot-greedy")  # 0 misses, 2 misses
    assert s["hindsight_cost_vs_best"] == pytest.approx((45 / 50 + 40 / 60) / 2)
    assert s["hindsight_cost_vs_cheapest"] == pytest.approx((45 / 30 + 40 / 40) / 2)
    # no per-window pick that keeps the best's deadlines is as cheap as the cheapest: the verdict says so
    lines = verdict({"spot-x": {**s, "model_misses": 0, "model_lost_gpu_h": 0.0, "model_cost_vs_od": 0.5}},
                    {"spot-x": "unseen"})
    assert lines[-1].endswith("is cheaper than the cheapest baseline on 0 of 1")
    row = next(line for line in spot_table(FamilyReport({"spot-x": s}, {"spot-x": "unseen"})).splitlines()
               if line.startswith("| spot-x"))
    assert row.endswith(f"| {s['hindsight_cost_vs_best']:.3f} / {s['hindsight_cost_vs_cheapest']:.3f} |")
    # where the cheapest keeps deadlines in every window, the pick is at least as cheap as it
    cheap = summarise_spot({w: {**r, "spot-greedy": _row(r["spot-greedy"]["cost_usd"], 0)}
                            for w, r in per_window.items()})
    assert cheap["hindsight_cost_vs_cheapest"] == pytest.approx(1.0) and cheap["best"] == "spot-greedy"


def test_the_gate_tag_keeps_the_spot_rule() -> None:
    from rlsched.train.registry import card_families, family_gate_checks, family_tag

    s = summarise_spot({"w": {"ondemand-autoscale": _row(10, 0), "spot-greedy": _row(3, 0),
                              CANDIDATE: _row(2, 4)}})
    fam = {"summary": {"spot-x": {**s, "baselines": {}}}, "exposure": {"spot-x": "unseen"}, "spot_model": True}
    back = json.loads(family_tag(fam))
    assert back["spot_model"] is True and back["summary"]["spot-x"]["model_misses"] == 4
    checks = family_gate_checks(back)
    assert len(checks) == 1 and not checks[0].ok and "4 deadline misses NOT <= 0" in checks[0].text
    card = {"deadline_guard": {"margin_frac": 0.25}, "metrics": {"families": fam}}
    assert card_families(card)["spot_model"] is True  # type: ignore[index]


def test_spot_models_and_what_they_have_seen_come_from_the_card() -> None:
    spot, default = _card("spot"), _card("default")
    assert is_spot_model(spot) and not is_spot_model(default)
    assert is_spot_model({"training_worlds": ["x/spot:0-4x8xH100-80GB,ondemand:0-4x8xH100-80GB@0.4/train"]})
    status = {f.name: exposure(spot, f)[0] for f in resolve(["spot"])}
    assert status["spot-real-aws-v100-2020"] == "trained"  # philly-hybrid-v100: AWS 2020, observed lifetimes
    assert status["spot-real-gcp-h100-us-east1"] == "tuned"  # only a holdout scenario buys there
    assert status["spot-real-gcp-a100-us-central1"] == "unseen"  # it trained on A100s in europe-west1 only
    assert status["spot-volatile"] == "unseen" and exposure(spot, resolve(["spot-volatile"])[0])[1]  # spans avoided
    assert exposure({**spot, "market_families": ["mkt-volatile"]}, resolve(["spot-volatile"])[0])[0] == "trained"
    # an on-prem model has bought no spot: the default market's A100 prices are unseen by it
    assert exposure(default, resolve(["spot-real-gcp-a100-us-central1"])[0])[0] == "unseen"


def test_groups_and_unknown_names() -> None:
    spot = resolve(["spot"])
    assert spot and all(f.kind == "spot" and f.name.startswith("spot-") for f in spot)
    assert not any(f.kind == "spot" for f in resolve(["all"]))  # all = the on-prem families
    with pytest.raises(FamilyError, match=r"unknown family 'spot-regionl' \(did you mean 'spot-regional'\?\)"):
        resolve(["spot-regionl"])


def test_a_ruled_spot_model_meets_the_spot_baselines_behind_the_same_rules() -> None:
    rep = evaluate_families(resolve(["spot-cheap-stable"]), str(ROOT / "models" / "spot"), card=_card("spot"),
                            windows=1, max_jobs=40)
    row = next(iter(rep.spot_windows["spot-cheap-stable"].values()))
    ruled = {n for n in row if n.endswith("+rules")}
    # on-demand-only: bare; the network's teacher and every other spot teacher join, behind the same rules
    assert ruled == {"spot-greedy+rules", "spot-fallback+rules", "uniform-progress+rules",
                     "teacher:sjf-spot-first+rules", "teacher:sjf-spot-reserve+rules"}
    s = rep.summaries["spot-cheap-stable"]
    assert CANDIDATE in row and "model_misses" in s and set(s["baselines"]) == set(SPOT_BASELINES) | ruled
    assert "| spot-cheap-stable | unseen | 1 |" in spot_table(rep) and "model cost vs OD" in spot_table(rep)


def test_the_teacher_row_is_the_teacher_replayed_behind_the_models_served_rules() -> None:
    from rlsched.learned.ppo import load_policy_ref
    from rlsched.train.evaluate import run_world
    from rlsched.train.teacher import TeacherScheduler

    fam = resolve(["spot-cheap-stable"])
    rep = evaluate_families(fam, str(ROOT / "models" / "spot"), card=_card("spot"), windows=1, max_jobs=60)
    label, row = next(iter(rep.spot_windows["spot-cheap-stable"].items()))
    model = load_policy_ref(str(ROOT / "models" / "spot"))
    assert model.rule_params["deadline_guard"]["trust_deadline"] is True  # served, not trained, parameters
    world = next(w for w in fam[0].windows(1, 60) if w.label == label)
    assert model.forecast is not None
    world = replace(world, forecaster=model.forecast.forecaster, forecast_horizon_s=model.forecast.horizon_s)
    mine = run_world(world, TeacherScheduler("sjf-spot-first", 16, 4, rules=model.rule_params)).result()
    assert row["teacher:sjf-spot-first+rules"] == {k: float(mine[k]) for k in row[CANDIDATE]}
    assert "teacher:sjf-spot-first+rules" in rep.summaries["spot-cheap-stable"]["baselines"]


def test_only_teachers_of_their_own_join_the_baselines() -> None:
    from rlsched.train.generalisation import cloned_teacher, competitors, teacher_baselines

    def card(teacher: str | None) -> dict[str, Any]:
        return {"behaviour_cloning": {"teacher": teacher}} if teacher else {}

    assert cloned_teacher(card("sjf-spot-first")) == "sjf-spot-first"
    # registered heuristics already have their own row; pickers, follow teachers and selector labels are not one
    for other in ("sjf", "weighted-priority", "best-follow", "lookahead", "follow:sjf", "selector-labels", None):
        assert cloned_teacher(card(other)) is None
    assert cloned_teacher({"behaviour_cloning": None}) is None
    # an anchored model's teacher is the one it acts as before any training (cloned or not)
    assert cloned_teacher({"anchor": "sjf-spot-first", "behaviour_cloning": None}) == "sjf-spot-first"
    assert cloned_teacher({"anchor": "sjf", **card("sjf-spot-first")}) is None
    assert competitors(True, "m", True, ["sjf-spot-first"])[-2:] == ["teacher:sjf-spot-first+rules", CANDIDATE]
    assert competitors(True, "m", False, ["sjf-spot-first"])[-2:] == ["teacher:sjf-spot-first", CANDIDATE]
    assert not any(n.startswith("teacher:") for n in competitors(False, "m", True, ["sjf-spot-first"]))
    assert not any(n.startswith("teacher:") for n in competitors(True, None, False, ["sjf-spot-first"]))
    # a model of one spot teacher faces every spot teacher, its own first; another teacher only itself
    assert teacher_baselines(card("sjf-spot-first")) == ["sjf-spot-first", "sjf-spot-reserve"]
    assert teacher_baselines({"anchor": "sjf-spot-reserve"}) == ["sjf-spot-reserve", "sjf-spot-first"]
    assert teacher_baselines(card("sjf")) == []
    assert competitors(True, "m", True, teacher_baselines(card("sjf-spot-first")))[-3:] == [
        "teacher:sjf-spot-first+rules", "teacher:sjf-spot-reserve+rules", CANDIDATE]


def test_generated_market_worlds_keep_the_jobs_and_fleet_under_drawn_markets() -> None:
    from dataclasses import replace

    from rlsched.train.families import generated_market_training_worlds, trained_market_families

    base = resolve(["spot-cheap-stable"])[0].windows(2, 60)
    base = [replace(w, label=f"hybrid/{i}/train") for i, w in enumerate(base)]
    onprem = resolve(["gen-light"])[0].windows(1, 60)[0]
    worlds = generated_market_training_worlds([onprem, *base], 4, seed=7, exclude=["mkt-volatile"])
    assert len(worlds) == 4
    assert [w.label.split("@")[0] for w in worlds] == ["hybrid/0", "hybrid/1", "hybrid/0", "hybrid/1"]
    for i, w in enumerate(worlds):
        src = base[0] if w.label.startswith("hybrid/0") else base[1]
        assert w.scenario.jobs == src.scenario.jobs and w.scenario.pools == src.scenario.pools
        assert f"@random-market{7 + i}[" in w.label and w.label.endswith("/train")
        w.scenario.market.check_pools(w.scenario.pools)
    # every draw is its own market, and the same seed draws the same one again
    probe = 3600.0 * 5
    spot = next(p for p in base[0].scenario.pools if p.kind.value == "spot")
    prices = {round(w.scenario.market.price(spot, probe), 6) for w in worlds}
    assert len(prices) > 1
    again = generated_market_training_worlds(base, 4, seed=7, exclude=["mkt-volatile"])
    assert [w.scenario.market.price(spot, probe) for w in again] == [w.scenario.market.price(spot, probe)
                                                                      for w in worlds]
    # only a fleet of one spot and one on-demand pool can take a drawn market
    with pytest.raises(FamilyError, match="no training world has a hybrid fleet"):
        generated_market_training_worlds([onprem], 2)
    assert trained_market_families(["mkt-volatile"]) == ["mkt-cheap-stable", "mkt-expensive",
                                                         "mkt-correlated-outages", "mkt-long-outages"]


def test_a_card_trained_on_generated_markets_counts_their_kinds_as_trained() -> None:
    from rlsched.envs.trained_actions import TrainedActions
    from rlsched.train.config import load_experiment
    from rlsched.train.model_card import CardFacts, build_card

    exp = load_experiment(ROOT / "experiments" / "spot-markets.yaml")
    assert exp.generated_markets is not None
    ev = {"summary": {}, "relative": {}, "worlds": []}
    card = build_card(exp, CardFacts("sig", ["w0"], 1, 1.0, {}, ev, None, TrainedActions.unrestricted("test"), None))
    assert card["market_families"] == ["mkt-cheap-stable", "mkt-expensive", "mkt-long-outages"]
    assert card["generated_markets"] == {"count": 12, "seed": 0, "exclude": ["mkt-volatile", "mkt-correlated-outages"]}
    assert build_card(load_experiment(ROOT / "experiments" / "spot.yaml"),
                      CardFacts("sig", ["w0"], 1, 1.0, {}, ev, None, TrainedActions.unrestricted("t"), None)
                      )["market_families"] == []
    card = {**_card("spot"), "market_families": card["market_families"]}
    assert exposure(card, resolve(["spot-cheap-stable"])[0])[0] == "trained"
    assert exposure(card, resolve(["spot-volatile"])[0])[0] == "unseen"
    assert exposure(card, resolve(["spot-regional"])[0])[0] == "unseen"


def test_generated_markets_without_a_hybrid_fleet_are_refused_before_the_forecaster_is_fitted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from rlsched.train import run_steps
    from rlsched.train.config import load_experiment

    exp = load_experiment(ROOT / "experiments" / "spot-markets.yaml")
    onprem = load_experiment(ROOT / "experiments" / "selector.yaml")
    exp = replace(exp, scenarios=onprem.scenarios[:1], holdout=[])

    def no_fit(_exp: object) -> dict[str, object]:
        raise AssertionError("the forecaster was fitted before the fleet was checked")

    monkeypatch.setattr(run_steps, "fit_forecasters", no_fit)
    with pytest.raises(FamilyError, match="no training world has a hybrid fleet"):
        run_steps.prepare_worlds(exp, lambda _: None)


def _spot_windows(model: list[float], greedy: list[tuple[float, int]]) -> dict[str, dict[str, dict[str, float]]]:
    """Windows with on-demand-only at 100, spot-fallback at 60 without misses, spot-greedy as given."""
    return {f"w{i}": {"ondemand-autoscale": _row(100, 0), "spot-fallback": _row(60, 0),
                      "spot-greedy": _row(g, miss), CANDIDATE: _row(m, 0)}
            for i, (m, (g, miss)) in enumerate(zip(model, greedy, strict=True))}


def test_the_spot_interval_follows_the_windows_spread() -> None:
    steady = summarise_spot(_spot_windows([66.0] * 6, [(50.0, 1)] * 6))
    assert steady["best"] == "spot-fallback"
    assert steady["model_cost_vs_best_lo"] == pytest.approx(1.1) == steady["model_cost_vs_best_hi"]
    noisy = summarise_spot(_spot_windows([42.0, 90.0, 48.0, 75.0, 54.0, 66.0], [(50.0, 1)] * 6))
    assert noisy["model_cost_vs_best_lo"] < 1.0 < noisy["model_cost_vs_best"] < noisy["model_cost_vs_best_hi"]
    assert noisy["model_cost_vs_best_lo"] >= 0.7 and noisy["model_cost_vs_best_hi"] <= 1.5


def test_the_spot_interval_re_picks_the_best_baseline_in_every_resample() -> None:
    # spot-greedy misses a deadline in one window of six: resamples without that window make the cheaper
    # spot-greedy the best baseline (fewest misses, then cheapest), and the model, at spot-fallback's
    # cost, is then 1.2x it. Held fixed at spot-fallback the interval would be 1.00-1.00
    s = summarise_spot(_spot_windows([60.0] * 6, [(50.0, 0)] * 5 + [(50.0, 1)]))
    assert s["best"] == "spot-fallback" and s["model_cost_vs_best"] == pytest.approx(1.0)
    assert s["model_cost_vs_best_lo"] == pytest.approx(1.0) and s["model_cost_vs_best_hi"] == pytest.approx(1.2)


def test_the_spot_table_shows_the_interval() -> None:

    s = summarise_spot(_spot_windows([42.0, 90.0, 48.0, 75.0], [(50.0, 1)] * 4))
    table = spot_table(FamilyReport({"spot-x": s}, {"spot-x": "unseen"})).splitlines()
    assert "| model cost vs best (range) | 95% interval |" in table[0]
    assert f"| {s['model_cost_vs_best_lo']:.3f}-{s['model_cost_vs_best_hi']:.3f} |" in table[2]
    assert table[0].count("|") == table[1].count("|") == table[2].count("|")


def test_the_tables_of_a_judgement_show_what_was_judged() -> None:
    """A spot-only judgement (a spot model's card, its gate) prints the spot table and its caption and no
    empty on-prem table; an on-prem one only the on-prem table; a mixed one both."""
    from rlsched.train.generalisation import SPOT_CAPTION, FamilyReport, family_tables, summarise

    spot = summarise_spot(_spot_windows([42.0, 90.0], [(50.0, 1)] * 2))
    onprem = summarise({"w1": {"weighted-priority": 10.0, "sjf": 8.0, CANDIDATE: 9.0},
                        "w2": {"weighted-priority": 12.0, "sjf": 9.0, CANDIDATE: 9.0}})
    only_spot = FamilyReport({"spot-x": spot}, {"spot-x": "unseen"}, spot_windows={"spot-x": {"w": {}}})
    text = family_tables(only_spot)
    assert "| best heuristic |" not in text and "| best baseline |" in text and SPOT_CAPTION in text
    only_onprem = FamilyReport({"gen-x": onprem}, {"gen-x": "unseen"}, windows={"gen-x": {"w1": {}}})
    text = family_tables(only_onprem)
    assert "| best heuristic |" in text and "| best baseline |" not in text and SPOT_CAPTION not in text
    both = FamilyReport({"gen-x": onprem, "spot-x": spot}, {"gen-x": "unseen", "spot-x": "unseen"},
                        windows={"gen-x": {"w1": {}}}, spot_windows={"spot-x": {"w": {}}})
    text = family_tables(both)
    assert text.index("| best heuristic |") < text.index("| best baseline |") < text.index(SPOT_CAPTION)


def test_the_gate_rules_name_what_each_kind_of_family_is_judged_by() -> None:
    from rlsched.train.generalisation import gate_rules

    assert gate_rules(["generator", "trace"]) == "<= 1.02x the best heuristic on every unseen family"
    assert gate_rules(["spot"]) == "no more deadline misses than the best baseline on every unseen spot family"
    assert gate_rules(["trace", "spot"]).split("; ") == [gate_rules(["trace"]), gate_rules(["spot"])]
