"""Smoke run of benchmarks/tiresias_sensitivity.py on the bundled 3-day Philly sample."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SMALL = ("--trace", "rlsched/data/traces/philly-3day.csv", "--windows", "2", "--length-h", "24",
         "--cluster", "2x8xV100-16GB", "--loads", "1.0")


def _rows(stdout: str) -> dict[str, list[str]]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0].strip("`")] = cells
    return out


def test_one_row_per_variant_against_the_baseline(run_benchmark: Callable[..., Any]) -> None:
    proc = run_benchmark("tiresias_sensitivity.py", *SMALL, "--variants", "tiresias;tiresias:preempt=0;fifo")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert list(rows) == ["weighted-priority", "tiresias", "tiresias:preempt=0", "fifo"]
    assert float(rows["weighted-priority"][1]) == 1.0
    # Without preemption no job returns to the queue: Tiresias' order is weighted-priority's here.
    assert float(rows["tiresias:preempt=0"][1]) == 1.0
    assert float(rows["tiresias"][5].replace(",", "")) > 0  # it preempts (every job declared preemptible)
    assert "2 cases (2 windows of 24 h x loads 1.0)" in proc.stdout


def test_timing_reports_medians_and_the_ratio(run_benchmark: Callable[..., Any]) -> None:
    proc = run_benchmark("tiresias_sensitivity.py", "--trace", "rlsched/data/traces/philly-3day.csv", "--timing",
                         "--repeat", "1", "--timing-jobs", "300")
    assert proc.returncode == 0, proc.stderr
    assert "| fifo |" in proc.stdout and "| tiresias |" in proc.stdout
    assert "Tiresias / FIFO: median wall time" in proc.stdout


def test_bad_input_is_one_line(run_benchmark: Callable[..., Any]) -> None:
    proc = run_benchmark("tiresias_sensitivity.py", *SMALL, "--variants", "tiresias:thresholds=x")
    assert proc.returncode == 1 and "bad parameters for policy 'tiresias'" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_benchmark("tiresias_sensitivity.py", *SMALL, "--variants", "tiresias:promote_knob=-1")
    assert proc.returncode == 1 and "promote_knob must be >= 0" in proc.stderr
    assert "Traceback" not in proc.stderr
