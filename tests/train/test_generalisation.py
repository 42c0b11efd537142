"""The benchmark's arithmetic: the headroom figures that say why a target is out of reach."""

from __future__ import annotations

import pytest

from rlsched.train.generalisation import BOUND, CANDIDATE, summarise, verdict

#: two windows in which a different heuristic wins each; SJF is the family's best on average
WINDOWS = {
    "w1": {"weighted-priority": 100.0, "sjf": 80.0, "fair-share": 90.0, BOUND: 60.0, CANDIDATE: 80.0},
    "w2": {"weighted-priority": 100.0, "sjf": 110.0, "fair-share": 120.0, BOUND: 99.0, CANDIDATE: 100.0},
}


def test_headroom_is_the_hindsight_pick_and_the_bound_against_the_family_best() -> None:
    s = summarise(WINDOWS)
    assert s["best"] == "sjf"  # 0.95x weighted-priority on average, against 1.0 and 1.05
    # w1: sjf is that window's best (1.0); w2: weighted-priority beats sjf (100 / 110)
    assert s["hindsight_vs_best"] == pytest.approx((1.0 + 100 / 110) / 2)
    assert s["bound_vs_best"] == pytest.approx((60 / 80 + 99 / 110) / 2)
    assert s["model_vs_best"] == pytest.approx((1.0 + 100 / 110) / 2)


def test_the_verdict_names_the_families_with_room_for_the_095_target() -> None:
    roomy = summarise(WINDOWS)
    tight = summarise({w: {**row, BOUND: row["sjf"] * 0.99, "weighted-priority": row["sjf"] * 1.01}
                       for w, row in WINDOWS.items()})
    assert tight["hindsight_vs_best"] == pytest.approx(1.0) and tight["bound_vs_best"] == pytest.approx(0.99)
    lines = verdict({"gen-a": roomy, "gen-b": tight}, {"gen-a": "unseen", "gen-b": "unseen"})
    half = next(line for line in lines if "0.95x best heuristic on at least half" in line)
    assert half.endswith("headroom to 0.95x (hindsight pick or bound <= 0.95x the best) on 1 of 2 (gen-a)")
