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


def _windows(model: list[float], sjf: list[float]) -> dict[str, dict[str, float]]:
    """Windows with weighted-priority at 100 and the given SJF and candidate mean JCTs."""
    return {f"w{i}": {"weighted-priority": 100.0, "sjf": s, CANDIDATE: m}
            for i, (m, s) in enumerate(zip(model, sjf, strict=True))}


def test_the_interval_is_wide_for_noisy_windows_and_narrow_for_steady_ones() -> None:
    steady = summarise(_windows([103.0] * 8, [100.0] * 8))
    assert steady["model_vs_best_lo"] == pytest.approx(1.03) and steady["model_vs_best_hi"] == pytest.approx(1.03)
    noisy = summarise(_windows([90.0, 130.0, 95.0, 120.0, 88.0, 125.0, 100.0, 110.0], [100.0] * 8))
    assert noisy["model_vs_best_lo"] < 1.0 < noisy["model_vs_best"] < noisy["model_vs_best_hi"]
    assert noisy["model_vs_best_lo"] >= 0.88 and noisy["model_vs_best_hi"] <= 1.30


def test_the_interval_re_picks_the_best_heuristic_in_every_resample() -> None:
    # sjf beats weighted-priority in half the windows and loses in the other half: which one is the
    # family's best depends on the windows drawn (a third of the resamples pick weighted-priority), and
    # the candidate (tied with weighted-priority) is 1.00x or 1.08x and more depending on it. Held fixed
    # at sjf, resamples of mostly sjf's bad windows would show the candidate at 0.83x-1.0x against a
    # heuristic that is not the best in them: never below 1.00x is the re-pick's doing
    s = summarise(_windows([100.0] * 6, [75.0, 75.0, 75.0, 120.0, 120.0, 120.0]))
    assert s["best"] == "sjf" and s["model_vs_best"] == pytest.approx((3 * 100 / 75 + 3 * 100 / 120) / 6)
    assert s["model_vs_best_lo"] == pytest.approx(1.0)  # resamples where weighted-priority is the best
    assert s["model_vs_best_hi"] > s["model_vs_best"]


def test_the_verdict_says_where_a_loss_is_beyond_the_windows_luck() -> None:
    clear = summarise(_windows([110.0, 112.0, 108.0, 111.0], [100.0] * 4))
    luck = summarise(_windows([90.0, 130.0, 95.0, 105.0], [100.0] * 4))
    line = verdict({"gen-a": clear, "gen-b": luck}, {"gen-a": "unseen", "gen-b": "unseen"})[0]
    assert line.endswith("(worse on gen-a, gen-b; 95% interval wholly above 1.00x on gen-a)")


def test_the_table_shows_the_interval() -> None:
    from rlsched.train.generalisation import FamilyReport, family_table

    s = summarise(_windows([110.0, 112.0, 108.0, 111.0], [100.0] * 4))
    table = family_table(FamilyReport({"gen-a": s}, {"gen-a": "unseen"}))
    assert "| 95% interval |" in table.splitlines()[0]
    assert f"| {s['model_vs_best_lo']:.3f}-{s['model_vs_best_hi']:.3f} |" in table.splitlines()[2]


def test_choice_lines_give_each_family_its_shares_most_first() -> None:
    from rlsched.train.generalisation import FamilyReport, choice_lines

    report = FamilyReport(exposure={"gen-a": "unseen", "gen-b": "unseen", "gen-c": "trained"},
                          choices={"gen-a": {"best-fit": 22, "sjf": 78}, "gen-c": {"sjf": 998, "fair-share": 2}})
    assert choice_lines(report) == ["gen-a: sjf 78%, best-fit 22% of 100 choices",
                                    "gen-c: sjf 100%, fair-share <1% of 1,000 choices"]
    assert choice_lines(report, ["gen-c", "gen-a"])[0].startswith("gen-c: ")
    # a selector with a safe default also says how many choices were the default's because the network was unsure
    from rlsched.train.generalisation import OVERRULED

    report.choices["gen-a"] = {"sjf": 90, "best-fit": 10, OVERRULED + "best-fit": 30, OVERRULED + "fair-share": 5}
    assert choice_lines(report, ["gen-a"]) == [
        "gen-a: sjf 90%, best-fit 10% of 100 choices; 35 of them unsure, given to the default (the network "
        "preferred best-fit 30, fair-share 5)"]


def test_local_processes_start_workers_only_for_replays_that_repay_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from rlsched.train import generalisation as g

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    per = g.REPLAYS_PER_PROCESS
    assert [g.local_processes(n) for n in (0, per - 1, per, 3 * per, 100 * per)] == [1, 1, 1, 3, 8]
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    assert g.local_processes(100 * per) == 2


def test_spawned_workers_replay_what_this_process_replays() -> None:
    from pathlib import Path

    from rlsched.train.families import resolve
    from rlsched.train.generalisation import evaluate_families

    fams = resolve(["gen-tiny-fleet"])
    model = str(Path(__file__).resolve().parents[2] / "models" / "default")
    here = evaluate_families(fams, model, windows=2, max_jobs=60)
    pooled = evaluate_families(fams, model, windows=2, max_jobs=60, processes=2)
    assert pooled.windows == here.windows and pooled.summaries == here.summaries
    assert pooled.choices == here.choices and sum(here.choices["gen-tiny-fleet"].values()) >= 1
