"""Shared pieces of the benchmark smoke tests: running a script, a small spot experiment."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: A spot experiment on bundled data only (runs on a clean clone without ../shared/data): the
#: bundled 3-day Philly sample, every job preemptible with deadline = submit + 3 x duration + 1 h,
#: on a small spot + on-demand A100 fleet; one 12 h evaluation and one 12 h holdout window.
SPOT_EXPERIMENT = """
name: bench-smoke
scenarios:
  - name: small-spot
    scenario: &world
      cluster: "spot:0-4x8xA100-80GB,ondemand:0-2x8xA100-80GB"
      workload: [{path: "bundled:philly-3day.csv"}]
      preemptible: all
      deadline_factor: 3
      deadline_slack_s: 3600
    train_window_h: [0, 6]
    eval_windows_h: [[12, 24]]
holdout:
  - name: small-spot-later   # the same world, a later window
    scenario: *world
    eval_windows_h: [[30, 42]]
eval_max_jobs: 200
"""


@pytest.fixture
def spot_experiment(tmp_path: Path) -> Path:
    """:data:`SPOT_EXPERIMENT` written to a file."""
    path = tmp_path / "bench-smoke.yaml"
    path.write_text(SPOT_EXPERIMENT)
    return path


@pytest.fixture
def run_benchmark() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``benchmarks/<script>`` with arguments; returns the finished process."""

    def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)

    return run
