"""Smoke run of benchmarks/guard_latency.py on one evaluation window of the spot experiment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the spot experiment replays the real Philly trace from the shared data folder beside the checkout
PHILLY = ROOT.parent / "shared" / "data" / "philly-2017" / "philly_jobs.csv"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "guard_latency.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_guard_latency_prints_a_row_and_its_command() -> None:
    pytest.importorskip("torch")
    if not (ROOT / "models" / "spot" / "deadline_guard.json").exists():
        pytest.skip("models/spot with its guard is not in this checkout")
    if not PHILLY.exists():
        pytest.skip(f"{PHILLY} is not beside this checkout")
    proc = _run("--max-windows", "1")
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[1].replace(",", "")) > 100  # decision points of a 1000-job window
    assert all(c.endswith("us") for c in cells[3:])
    assert "Command: `python benchmarks/guard_latency.py --max-windows 1`" in proc.stdout


def test_a_model_without_a_guard_is_refused() -> None:
    pytest.importorskip("torch")
    proc = _run("--model", str(ROOT / "models" / "default"), "--max-windows", "1")
    assert proc.returncode == 1 and "has no deadline guard" in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_trace_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: t\nscenarios:\n  - name: a\n    scenario: {cluster: '1x8xA100-80GB', workload: "
                   "[{path: " + str(tmp_path / "missing.csv") + "}]}\n    train_window_h: [0, 1]\n"
                   "    eval_windows_h: [[2, 3]]\n")
    proc = _run("--experiment", str(exp), "--model", str(ROOT / "models" / "spot"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "missing.csv" in proc.stderr and "file not found" in proc.stderr
