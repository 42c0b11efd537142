"""Smoke run of benchmarks/cost_report.py: every table it prints, with a trained policy in it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_cost_report_prints_rows_summary_and_target_check() -> None:
    pytest.importorskip("torch")
    model = ROOT / "models" / "scorer"
    if not (model / "policy.pt").exists():
        pytest.skip("models/scorer is not in this checkout")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cost_report.py"), "--jobs", "60", "--periods",
         "aws-v100-2020,gcp-h100-2025-03", "--workloads", "philly", "--policies", "spot-greedy,uniform-progress",
         "--ppo", str(model)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("Command: `python benchmarks/cost_report.py --jobs 60"), out[:200]
    rows = [line for line in out.splitlines() if line.startswith(("| aws-v100-2020 | philly", "| gcp-h100-2025-03"))]
    # 2 periods x (reference + 2 baselines + ppo) in the table (models/scorer has no rules and no teacher of its
    # own), 2 target-check rows and 2 rows against the baselines
    assert len(rows) == 2 * 4 + 2 + 2, out
    ref = next(line for line in rows if "| ondemand-autoscale |" in line)
    assert "| 1.00 | 1.00 |" in ref
    assert "Summary over every period" in out and "Target check for ppo:" in out


def test_unknown_period_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cost_report.py"), "--periods", "gcp-2019"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "unknown periods ['gcp-2019']" in proc.stderr


def test_baselines_behind_rules_and_an_unknown_rule() -> None:
    base = [sys.executable, str(ROOT / "benchmarks" / "cost_report.py"), "--jobs", "40", "--periods",
            "gcp-h100-2025-03", "--workloads", "openb", "--policies", "spot-greedy"]
    proc = subprocess.run([*base, "--baseline-rules", "consolidate"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "The spot baselines run behind `consolidate`" in proc.stdout
    assert "| gcp-h100-2025-03 | openb | spot-greedy |" in proc.stdout
    proc = subprocess.run([*base, "--baseline-rules", "consolidation"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 2 and "--baseline-rules: unknown rule(s) ['consolidation']" in proc.stderr


def _load_report() -> Any:
    spec = importlib.util.spec_from_file_location("cost_report", ROOT / "benchmarks" / "cost_report.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cost_report", mod)  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_a_ruled_model_meets_every_spot_baseline_behind_its_served_rules_and_its_teacher() -> None:
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cost_report.py"), "--jobs", "60", "--periods", "gcp-h100-2025-03",
         "--workloads", "philly", "--policies", "spot-greedy,ondemand-static", "--ppo", "models/spot"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    names = [line.split(" | ")[2] for line in out.splitlines() if line.startswith("| gcp-h100-2025-03 | philly | ")
             and line.count(" | ") > 8]
    # the on-demand-only rows stay bare (as in the family benchmark); the teacher comes from the card, and
    # a model of a spot teacher meets every spot teacher
    assert names[:4] == ["ondemand-autoscale", "spot-greedy", "ondemand-static", "spot-greedy+rules"], names
    assert sorted(names[4:-1]) == ["teacher:sjf-spot-first+rules", "teacher:sjf-spot-reserve+rules"], names
    assert names[-1] == "**ppo:models/spot**"
    assert "`NAME+rules`: the baseline behind the rules `ppo:models/spot` is served with (consolidate, " \
           "deadline_guard)." in out
    check = out.split("Against the baselines")[1]
    row = next(line for line in check.splitlines() if line.startswith("| gcp-h100-2025-03 | philly |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-1] in ("**yes**", "no") and cells[2].endswith(")") and cells[4].endswith(")")


def test_the_check_picks_the_best_and_the_cheapest_as_the_family_benchmark_does() -> None:
    mod = _load_report()

    def row(name: str, cost: float, misses: int, lost: float = 0.0) -> Any:
        # the fields of rlsched.sim.metrics.Report the check reads
        rep = SimpleNamespace(policy=name, cost_usd=cost, deadline_misses=misses, lost_gpu_hours=lost,
                              mean_jct_s=100.0)
        return mod.Row("p", "w", rep)

    rows = [row("ondemand-autoscale", 100.0, 9), row("spot-greedy", 40.0, 2), row("spot-greedy+rules", 50.0, 0, 1.0),
            row("ppo:m", 45.0, 0, 0.5)]
    line = mod.baseline_check(rows, "ppo:m").splitlines()[-1]
    # cheapest: spot-greedy (0.40); best: the cheapest of those with the fewest misses (spot-greedy+rules)
    assert line == ("| p | w | spot-greedy (0.40) | 1.125 no | spot-greedy+rules (0, 1.0) | 0 yes | 0.5 yes | no |")
    rows[-1] = row("ppo:m", 39.0, 0, 1.0)
    assert mod.baseline_check(rows, "ppo:m").splitlines()[-1].endswith("| 0 yes | 1.0 yes | **yes** |")


def test_a_model_that_cannot_be_loaded_is_one_line_and_exit_2(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "cost_report.py")
    proc = subprocess.run([sys.executable, script, "--ppo", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --ppo ") and proc.stderr.count("\n") == 1, \
        proc.stderr
