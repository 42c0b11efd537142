"""Smoke run of benchmarks/guard_effect.py: one window per set, every kind of variant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT.parent / "shared" / "data" / "philly-2017" / "philly_jobs.csv"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "guard_effect.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_variants_print_one_row_each_per_window_set() -> None:
    pytest.importorskip("torch")
    if not (ROOT / "models" / "spot" / "deadline_guard.json").exists():
        pytest.skip("models/spot with its guard is not in this checkout")
    if not PHILLY.exists():
        pytest.skip(f"{PHILLY} is not beside this checkout")
    proc = _run("--max-windows", "1", "--variants", "none,model,margin=0.25+preempt")
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| evaluation (1)", "| holdout (1)"))]
    assert [r.split("|")[2].strip() for r in rows] == ["none", "model", "margin=0.25+preempt"] * 2
    assert "Command: `python benchmarks/guard_effect.py --max-windows 1" in proc.stdout


def test_an_unknown_variant_is_one_line() -> None:
    pytest.importorskip("torch")
    proc = _run("--variants", "margin=0.25+migrate")
    assert proc.returncode == 1 and "unknown variant 'margin=0.25+migrate'" in proc.stderr
    assert "Traceback" not in proc.stderr
