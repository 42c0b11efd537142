"""Smoke run of benchmarks/held_capacity.py: rows whose held GPU-hours add up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_held_capacity_splits_held_hours() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "held_capacity.py"), "--jobs", "80", "--policies",
         "spot-greedy,spot-fallback"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| spot-greedy |", "| spot-fallback |"))]
    assert rows, proc.stdout
    for row in rows:
        cells = [c.strip().replace(",", "") for c in row.strip("|").split("|")]
        held, busy, idle_partly, empty, provisioning = (float(c) for c in cells[3:8])
        assert held > 0 and 0 <= busy <= held
        # full nodes idle nothing: all idle time is on partly used, empty or provisioning nodes
        assert abs(idle_partly + empty + provisioning - (held - busy)) <= 2  # cells are rounded
    assert "Command: `python benchmarks/held_capacity.py --jobs 80" in proc.stdout
