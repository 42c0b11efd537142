"""Smoke run of benchmarks/decision_latency.py (one tiny configuration, a few seconds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_decision_latency_quick_prints_a_table() -> None:
    pytest.importorskip("torch")
    if not (ROOT / "models" / "scorer" / "policy.pt").exists():
        pytest.skip("models/scorer is not in this checkout")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "decision_latency.py"), "--quick", "--nodes", "1", "--queues", "10"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| ppo+guard", "| weighted"))]
    assert len(rows) == 2 and "| 8 | 10 |" in rows[0], proc.stdout
    assert "fallback decisions 0" in proc.stdout, proc.stdout
