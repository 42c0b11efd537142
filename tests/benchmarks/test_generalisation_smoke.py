"""Smoke run of benchmarks/generalisation.py: generated families, the shipped model, tiny windows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlsched.train.generalisation import OVERRULED

ROOT = Path(__file__).resolve().parents[2]


def _rows(stdout: str) -> dict[str, list[str]]:
    """The family table's rows (the first row per family; per-window rows follow it)."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        if line.startswith(("| gen-", "| philly")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.setdefault(cells[0], cells)
    return rows


def test_a_row_per_family_with_the_best_heuristic_and_a_verdict(run_benchmark: Callable[..., Any],
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    proc = run_benchmark("generalisation.py", "--model", str(ROOT / "models" / "default"),
                         "--families", "gen-bursty,gen-overload", "--windows", "2", "--max-jobs", "150",
                         "--per-window", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert {"gen-bursty", "gen-overload"} <= set(rows)
    data = json.loads(out.read_text())
    for fam in ("gen-bursty", "gen-overload"):  # kinds the shipped selector never trained on
        s = data["summary"][fam]
        assert s["windows"] == 2 and data["exposure"][fam] == "unseen"
        # the best heuristic is the minimum of the heuristics' own ratios, never worse than weighted-priority
        assert s["best_vs_wp"] == min(s["heuristics_vs_wp"].values()) <= 1.0
        windows = data["windows"][fam]
        ratios = [row["model"] / row[s["best"]] for row in windows.values()]
        assert abs(s["model_vs_best"] - sum(ratios) / len(ratios)) < 1e-9  # a mean of per-window ratios
        assert rows[fam][3] == s["best"]
        lo, hi = s["model_vs_best_lo"], s["model_vs_best_hi"]  # the bootstrap interval brackets the mean
        assert lo <= s["model_vs_best"] + 1e-12 and s["model_vs_best"] <= hi + 1e-12
        # the selector's hourly choices, summed over the windows, are reported and printed per family
        # (with the choices its safe default overruled kept apart: what the network preferred instead)
        candidates = {"weighted-priority", "sjf", "fair-share", "best-fit"}
        counts = data["choices"][fam]
        chosen = {h: c for h, c in counts.items() if not h.startswith(OVERRULED)}
        overruled = {h.removeprefix(OVERRULED) for h in counts if h.startswith(OVERRULED)}
        assert set(chosen) <= candidates and overruled <= candidates and sum(chosen.values()) >= 2
        assert any(line.startswith(f"- {fam}: ") and f"of {sum(chosen.values()):,} choices" in line
                   for line in proc.stdout.splitlines())
    assert "model <= 1.00x best heuristic on every unseen family:" in proc.stdout
    assert "Command: `python benchmarks/generalisation.py --model" in proc.stdout


def test_unknown_family_and_bad_model_are_one_line(run_benchmark: Callable[..., Any], tmp_path: Path) -> None:
    proc = run_benchmark("generalisation.py", "--families", "gen-burst")
    assert proc.returncode == 1 and "unknown family 'gen-burst' (did you mean 'gen-bursty'?)" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_benchmark("generalisation.py", "--model", str(tmp_path), "--families", "gen-light")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stderr.startswith("error: ")


def test_a_model_with_rules_is_measured_against_heuristics_behind_the_same_rules(
        run_benchmark: Callable[..., Any], tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    proc = run_benchmark("generalisation.py", "--model", str(ROOT / "models" / "spot"), "--families",
                         "gen-tiny-fleet", "--windows", "1", "--max-jobs", "80", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    s = json.loads(out.read_text())["summary"]["gen-tiny-fleet"]
    bare = {"weighted-priority", "fifo", "sjf", "best-fit", "fgd", "fair-share", "tiresias"}
    assert set(s["heuristics_vs_wp"]) == bare | {f"{h}+rules" for h in bare}
    assert s["best_vs_wp"] == min(s["heuristics_vs_wp"].values())


def test_a_model_without_rules_meets_bare_heuristics_only(tmp_path: Path) -> None:
    from rlsched.train.families import resolve
    from rlsched.train.generalisation import evaluate_families

    rep = evaluate_families(resolve(["gen-tiny-fleet"]), str(ROOT / "models" / "default"), windows=1, max_jobs=60)
    row = next(iter(rep.windows["gen-tiny-fleet"].values()))
    assert not any(name.endswith("+rules") for name in row) and "model" in row
