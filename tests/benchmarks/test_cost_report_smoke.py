"""Smoke run of benchmarks/cost_report.py: every table it prints, with a trained policy in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    # 2 periods x (reference + 2 baselines + ppo) in the table, and 2 target-check rows
    assert len(rows) == 2 * 4 + 2, out
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
