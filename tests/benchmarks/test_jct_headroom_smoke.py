"""Smoke run of benchmarks/jct_headroom.py on the smoke experiment (bundled data only)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def test_rows_per_variant_and_the_oracle_bound_is_no_worse(run_benchmark: Callable[..., Any]) -> None:
    proc = run_benchmark("jct_headroom.py", "--experiment", str(ROOT / "experiments" / "smoke.yaml"),
                         "--preemptible", "all", "--variants", "weighted-priority,sjf,sjf+oracle,sjf+preempt=10")
    assert proc.returncode == 0, proc.stderr
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in proc.stdout.splitlines() if line.startswith("| ")
                                          and not line.startswith("| variant"))}
    assert list(rows) == ["weighted-priority", "sjf", "sjf+oracle", "sjf+preempt=10"]
    assert float(rows["weighted-priority"][1]) == 1.0  # the reference against itself
    assert float(rows["sjf+oracle"][1]) <= float(rows["sjf"][1]) + 1e-9  # true durations never order worse here
    assert float(rows["sjf"][3]) == 0.0  # no preemption without the rule
    assert "Command: `python benchmarks/jct_headroom.py --experiment" in proc.stdout


def test_a_bad_variant_is_one_line(run_benchmark: Callable[..., Any]) -> None:
    proc = run_benchmark("jct_headroom.py", "--variants", "sjf+preempt=ten")
    assert proc.returncode == 1 and "bad variant 'sjf+preempt=ten'" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_benchmark("jct_headroom.py", "--variants", "sjf+psychic")
    assert proc.returncode == 1 and "unknown variant modifier 'psychic'" in proc.stderr
