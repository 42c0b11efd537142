"""Smoke run of benchmarks/spot_grid.py: the training-side grid's table, and what sets its bar."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spot_grid", ROOT / "benchmarks" / "spot_grid.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_grid_table_has_every_baseline_the_teacher_and_the_model(run_benchmark: Callable[..., Any]) -> None:
    pytest.importorskip("torch")
    if not (ROOT / "models" / "spot" / "policy.pt").exists():
        pytest.skip("models/spot is not in this checkout")
    proc = run_benchmark("spot_grid.py", "--families", "cheap-stable", "--windows", "1", "--max-jobs", "60",
                         "--teacher", "sjf-spot-first", "--model", "models/spot")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert {"best baseline", "hindsight pick among the baselines", "ondemand-autoscale", "spot-greedy+rules",
            "uniform-progress+rules", "teacher:sjf-spot-first+rules", "model"} <= set(rows)
    assert "| 1.000 (" in rows["ondemand-autoscale"]  # the reference, against itself
    assert "Command: `python benchmarks/spot_grid.py --families cheap-stable" in proc.stdout


def test_seed0_moves_the_grid_to_other_windows() -> None:
    if not (ROOT / "models" / "spot" / "policy.pt").exists():
        pytest.skip("models/spot is not in this checkout")
    mod = _module()
    rules = str(ROOT / "models" / "spot")
    default = mod.grid_worlds(2, 60, rules, ["cheap-stable"])
    moved = mod.grid_worlds(2, 60, rules, ["cheap-stable"], seed0=524)
    assert [w.label for w in default] == [w.label for w in mod.grid_worlds(2, 60, rules, ["cheap-stable"], seed0=500)]
    assert len(moved) == 2 and {w.label for w in moved}.isdisjoint(w.label for w in default)


def test_teachers_and_the_model_never_set_the_bar() -> None:
    mod = _module()

    def m(cost: float, misses: int) -> dict[str, float]:
        return {"cost_usd": cost, "deadline_misses": misses, "lost_gpu_hours": 0.0}

    rows = {"fam": {"fam/w1": {"ondemand-autoscale": m(100.0, 9), "spot-greedy+rules": m(60.0, 2),
                               "uniform-progress+rules": m(70.0, 1), "teacher:sjf-spot-first+rules": m(50.0, 0),
                               "model": m(40.0, 4)},
                    "fam/w2": {"ondemand-autoscale": m(100.0, 0), "spot-greedy+rules": m(60.0, 0),
                               "uniform-progress+rules": m(80.0, 0), "teacher:sjf-spot-first+rules": m(50.0, 0),
                               "model": m(40.0, 0)}}}
    s = mod.summarise(rows)
    assert s["best"]["fam"] == ("uniform-progress+rules", 0.75, 1)  # fewest misses among baselines, then cost
    assert s["totals"]["model"] == {"mean_cost_vs_od": 0.4, "misses_over_best": 3}
    assert s["totals"]["teacher:sjf-spot-first+rules"]["misses_over_best"] == 0
    # the headroom: per window the cheapest baseline missing no more than the best there (never a teacher)
    assert s["hindsight"]["fam"] == (pytest.approx(0.65), 1)
    table = mod.render(s)
    assert "| best baseline | 0.750 (1) | | |" in table and "| model | 0.400 (4) | 0.400 | 3 |" in table
    assert "| hindsight pick among the baselines | 0.650 (1) | | |" in table


@pytest.mark.parametrize(("args", "message"), [
    (["--families", "calm"], "unknown family or teacher 'calm'"),
    (["--teacher", "sjf-spot-last"], "unknown family or teacher 'sjf-spot-last'"),
    (["--windows", "0"], "--windows and --jobs must be >= 1"),
])
def test_bad_input_is_one_line(run_benchmark: Callable[..., Any], args: list[str], message: str) -> None:
    proc = run_benchmark("spot_grid.py", *args)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_several_models_sit_side_by_side_and_never_set_the_bar() -> None:
    mod = _module()
    assert mod.model_names(["runs/a/model"]) == {"model": "runs/a/model"}
    assert mod.model_names(["runs/seed0", "runs/seed1"]) == {"model:seed0": "runs/seed0", "model:seed1": "runs/seed1"}
    # two folders of one name are told apart by their paths
    assert mod.model_names(["a/model", "b/model"]) == {"model:a/model": "a/model", "model:b/model": "b/model"}

    def m(cost: float, misses: int) -> dict[str, float]:
        return {"cost_usd": cost, "deadline_misses": misses, "lost_gpu_hours": 0.0}

    rows = {"fam": {"fam/w1": {"ondemand-autoscale": m(100.0, 9), "spot-greedy+rules": m(60.0, 2),
                               "model:seed0": m(30.0, 0), "model:seed1": m(50.0, 1)}}}
    s = mod.summarise(rows)
    assert s["best"]["fam"] == ("spot-greedy+rules", 0.6, 2)
    assert s["totals"]["model:seed0"]["mean_cost_vs_od"] == 0.3 and "| model:seed1 | 0.500 (1) |" in mod.render(s)


def test_recipes_are_judged_over_their_seeds() -> None:
    mod = _module()
    models, recipes = mod.recipe_models(["spot=models/spot, runs/s1", "reserve=runs/r0"])
    assert models == {"model:spot#0": "models/spot", "model:spot#1": "runs/s1", "model:reserve#0": "runs/r0"}
    assert recipes == {"spot": ["model:spot#0", "model:spot#1"], "reserve": ["model:reserve#0"]}

    def m(cost: float, misses: int) -> dict[str, float]:
        return {"cost_usd": cost, "deadline_misses": misses, "lost_gpu_hours": 0.0}

    rows = {"a": {"a/w1": {"ondemand-autoscale": m(100.0, 2), "spot-greedy+rules": m(60.0, 1),
                           "model:spot#0": m(50.0, 1), "model:spot#1": m(70.0, 3), "model:reserve#0": m(55.0, 0)}},
            "b": {"b/w1": {"ondemand-autoscale": m(100.0, 0), "spot-greedy+rules": m(40.0, 0),
                           "model:spot#0": m(30.0, 0), "model:spot#1": m(50.0, 2), "model:reserve#0": m(45.0, 0)}}}
    s = mod.summarise(rows)
    assert s["best"]["a"][0] == "spot-greedy+rules"  # seeds never set the bar
    r = mod.summarise_recipes(s, recipes)
    # seed 0: 0.5 and 0.3 (mean 0.4, no misses over best); seed 1: 0.7 and 0.5 (mean 0.6, 2 + 2 over best)
    assert r["spot"]["family"] == {"a": pytest.approx(0.6), "b": pytest.approx(0.4)}
    assert r["spot"]["mean"] == pytest.approx(0.5) and r["spot"]["worst"] == pytest.approx(0.6)
    assert r["spot"]["misses_over_best"] == 2.0 and r["spot"]["seed_misses_over_best"] == [0, 4]
    assert r["reserve"]["worst"] == r["reserve"]["mean"] == pytest.approx(0.5)
    table = mod.render_recipes(r)
    assert "| spot (2: 0.400, 0.600) | 0.600 | 0.400 | 0.500 | 0.600 | 2.0 |" in table


@pytest.mark.parametrize("spec", ["spot", "=models/spot", "spot=", "a:b=models/spot"])
def test_a_malformed_recipe_is_one_line(run_benchmark: Callable[..., Any], spec: str) -> None:
    proc = run_benchmark("spot_grid.py", "--recipe", spec)
    assert proc.returncode == 1 and "expected NAME=FOLDER[,FOLDER...]" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_recipe_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="with a new name"):
        _module().recipe_models(["s=a", "s=b"])
