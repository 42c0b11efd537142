"""Smoke run of benchmarks/guard_effect.py on a small spot experiment of bundled data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def test_variants_print_one_row_each_and_the_guard_does_not_add_misses(
        run_benchmark: Callable[..., Any], spot_experiment: Path) -> None:
    pytest.importorskip("torch")
    proc = run_benchmark("guard_effect.py", "--experiment", str(spot_experiment),
                         "--variants", "none,model,margin=0.25+preempt")
    assert proc.returncode == 0, proc.stderr
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith(("| evaluation (1)", "| holdout (1)"))]
    assert [r[1] for r in rows] == ["none", "model", "margin=0.25+preempt"] * 2
    for block in (rows[:3], rows[3:]):
        misses = {r[1]: float(r[4]) for r in block}
        assert misses["model"] <= misses["none"]  # the model's own guard (with preemption) only removes misses
    assert "Command: `python benchmarks/guard_effect.py --experiment" in proc.stdout


def test_an_unknown_variant_is_one_line(run_benchmark: Callable[..., Any]) -> None:
    pytest.importorskip("torch")
    proc = run_benchmark("guard_effect.py", "--variants", "margin=0.25+migrate")
    assert proc.returncode == 1 and "unknown variant 'margin=0.25+migrate'" in proc.stderr
    assert "Traceback" not in proc.stderr
