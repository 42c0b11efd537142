"""Smoke run of benchmarks/guard_latency.py on a small spot experiment of bundled data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_guard_latency_prints_a_row_and_its_command(run_benchmark: Callable[..., Any], spot_experiment: Path) -> None:
    pytest.importorskip("torch")
    proc = run_benchmark("guard_latency.py", "--experiment", str(spot_experiment))
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| deadline_guard | 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[2].replace(",", "")) > 100  # decision points of a 12 h window of ~260 jobs
    assert all(c.endswith("us") for c in cells[4:])
    assert f"Command: `python benchmarks/guard_latency.py --experiment {spot_experiment}`" in proc.stdout


def test_a_model_without_a_guard_is_refused(run_benchmark: Callable[..., Any], spot_experiment: Path) -> None:
    pytest.importorskip("torch")
    proc = run_benchmark("guard_latency.py", "--experiment", str(spot_experiment),
                         "--model", str(ROOT / "models" / "scorer"))
    assert proc.returncode == 1 and "has no deadline guard" in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_trace_is_one_line(run_benchmark: Callable[..., Any], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: t\nscenarios:\n  - name: a\n    scenario: {cluster: '1x8xA100-80GB', workload: "
                   "[{path: " + str(tmp_path / "missing.csv") + "}]}\n    train_window_h: [0, 1]\n"
                   "    eval_windows_h: [[2, 3]]\n")
    proc = run_benchmark("guard_latency.py", "--experiment", str(exp))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "missing.csv" in proc.stderr and "file not found" in proc.stderr
