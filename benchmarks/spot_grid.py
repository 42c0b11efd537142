"""The training-side spot grid: where spot recipes, teachers and rules are chosen, never judged.

Issue 16 judges a spot model on families it never saw (``benchmarks/generalisation.py
--families spot``, window seeds 1000 and up, Philly from hour 1800). Choices made while building
a model - a teacher, a rule, a recipe - must be made elsewhere, or the benchmark stops being
unseen. This grid is that elsewhere: six families of 12 windows drawn from the *training* side
only, on the fleets of the spot families:

* five generated workloads (:mod:`rlsched.workload.generator`, seeds 500-511) under the generated
  markets (:mod:`rlsched.market.generator`, the same seeds): steady under ``mkt-cheap-stable`` and
  ``mkt-long-outages`` (A100-80GB), heavy-tail under ``mkt-expensive`` (H100), steady under
  ``mkt-regional`` (three spot pools of 4 nodes, H100), bursty under ``mkt-correlated-outages`` (H100);
* Philly's first 1,800 hours (the part the spot recipe trains on) under ``mkt-volatile`` draws
  (V100), which holds the burst of deadline jobs at hours 686-734.

Every window is replayed under the spot baselines, bare and behind the rules the model folder
(``--rules``, default ``models/spot``) is served with, its forecaster running for every
competitor as in the benchmark; then each ``--teacher`` (a codec-space teacher behind the same
rules, ``teacher:NAME+rules``) and, with ``--model``, the model (repeat it to replay several side by side,
``model:FOLDER`` each: one recipe's seeds differ on this grid by as much as the gaps it decides, so a recipe
is judged over several). Per family: cost relative to
on-demand-only (a mean of per-window ratios) and deadline misses (a total). The **best baseline**
is the cheapest of those with the fewest misses among the baselines alone - teachers and the
model are what is being chosen, so they never set the bar - and "misses over best" sums, over the
families, each row's misses beyond it. The row "hindsight pick among the baselines" is the family's
headroom for any policy that chooses among them: each window's cheapest baseline with no more misses
there than the best baseline, picked after the fact. A rule to adopt anything on this grid is written down
before its run (BENCHMARKS.md)::

    python benchmarks/spot_grid.py --model models/spot --teacher sjf-spot-first --jobs 2
    python benchmarks/spot_grid.py --teacher sjf-spot-first --teacher sjf-spot-reserve --no-baselines
    python benchmarks/spot_grid.py --model runs/seed0/model --model runs/seed1/model --jobs 2
    python benchmarks/spot_grid.py --recipe spot=models/spot,runs/s1/model --recipe reserve=runs/r0,runs/r1 --jobs 2

``--recipe NAME=FOLDER,FOLDER,...`` replays each folder (one per seed of the recipe) as ``model:NAME#K`` and adds
a second table: per recipe and family the mean over its seeds, the seed-mean and the worst seed of the grid mean,
and the seed-mean of the misses over best - what a rule that compares recipes rather than networks is written on.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

#: (name, workload, market, GPU model, spot nodes per market region): the grid's families
GRID = (
    ("cheap-stable", "gen:steady", "mkt-cheap-stable", "A100-80GB", 8),
    ("expensive", "gen:heavy-tail", "mkt-expensive", "H100-80GB", 8),
    ("long-outages", "gen:steady", "mkt-long-outages", "A100-80GB", 8),
    ("regional", "gen:steady", "mkt-regional", "H100-80GB", 4),
    ("correlated", "gen:bursty", "mkt-correlated-outages", "H100-80GB", 8),
    ("philly-volatile", "philly-early", "mkt-volatile", "V100-16GB", 8),
)
#: the grid's window seeds start here (the benchmark's start at 1000)
SEED0 = 500
CANDIDATE = "model"

_WORLDS: list[Any] = []
_RULES_REF = ""
#: competitor name -> model folder (``model``, or ``model:FOLDER`` when several are replayed)
_MODELS: dict[str, str] = {}
_LOADED: dict[str, Any] = {}


def _load(ref: str) -> Any:
    if ref not in _LOADED:
        from rlsched.learned.ppo import load_policy_ref

        _LOADED[ref] = load_policy_ref(ref)
    return _LOADED[ref]


def grid_worlds(windows: int, max_jobs: int, rules_ref: str, names: list[str] | None = None,
                seed0: int = SEED0) -> list[Any]:
    """The grid's worlds (``names``: a subset of its families), each with the rules folder's forecaster.

    ``seed0`` moves the window seeds, so a rule judged on windows seen while it was probed can be confirmed on
    fresh ones.
    """
    from rlsched.train.families import SpotFamily

    class TrainingSide(SpotFamily):
        """A spot family cut from the training side: seeds from ``seed0``, no window avoided."""

        def windows(self, count: int, max_jobs: int | None = None, avoid: Any = (), seed0: int = seed0) -> list[Any]:
            return super().windows(count, max_jobs, (), seed0=seed0)

    worlds: list[Any] = []
    for name, workload, market, gpu, spot_nodes in GRID:
        if names and name not in names:
            continue
        worlds += TrainingSide(name, "", workload, market, gpu, spot_nodes=spot_nodes).windows(windows, max_jobs)
    forecast = getattr(_load(rules_ref), "forecast", None)
    if forecast is not None:
        worlds = [replace(w, forecaster=forecast.forecaster, forecast_horizon_s=forecast.horizon_s) for w in worlds]
    return worlds


def model_names(refs: list[str]) -> dict[str, str]:
    """Competitor names for the model folders to replay: ``model`` for one; ``model:NAME`` for several (NAME the
    folder's name, or its path where two folders share a name), so seeds of one recipe sit side by side."""
    if len(refs) == 1:
        return {CANDIDATE: refs[0]}
    names = [Path(r).name for r in refs]
    return {f"{CANDIDATE}:{n if names.count(n) == 1 else r}": r for n, r in zip(names, refs, strict=True)}


def recipe_models(specs: list[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """``NAME=FOLDER,FOLDER,...`` per recipe -> (competitor name -> folder, recipe -> its competitors in order).

    A :class:`ValueError` names the first malformed spec (no ``=``, no name, no folder, a name used twice).
    """
    models: dict[str, str] = {}
    recipes: dict[str, list[str]] = {}
    for spec in specs:
        name, eq, folders = spec.partition("=")
        refs = [f.strip() for f in folders.split(",") if f.strip()]
        name = name.strip()
        if not eq or not name or not refs or name in recipes or any(c in name for c in ",:#"):
            raise ValueError(f"--recipe {spec!r}: expected NAME=FOLDER[,FOLDER...] with a new name "
                             "(no ',', ':' or '#')")
        recipes[name] = [f"{CANDIDATE}:{name}#{k}" for k in range(len(refs))]
        models.update(zip(recipes[name], refs, strict=True))
    return models, recipes


def summarise_recipes(summary: dict[str, Any], recipes: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Per recipe, from :func:`summarise`'s result: each family's cost averaged over the seeds, the seed-mean and
    worst seed of the grid mean cost, and the seed-mean of the misses over best (with every seed's own values)."""
    table, totals = summary["table"], summary["totals"]
    out: dict[str, dict[str, Any]] = {}
    for name, seeds in recipes.items():
        means = [totals[s]["mean_cost_vs_od"] for s in seeds]
        over = [totals[s]["misses_over_best"] for s in seeds]
        out[name] = {
            "seeds": len(seeds),
            "family": {f: statistics.fmean(table[f][s][0] for s in seeds) for f in table
                       if all(s in table[f] for s in seeds)},
            "mean": statistics.fmean(means), "worst": max(means), "seed_means": means,
            "misses_over_best": statistics.fmean(over), "seed_misses_over_best": over,
        }
    return out


def render_recipes(recipes: dict[str, dict[str, Any]]) -> str:
    """The recipes over their seeds as a markdown table: family seed-means, mean, worst seed, misses over best."""
    fams = list(next(iter(recipes.values()))["family"]) if recipes else []
    lines = ["| recipe (seeds) | " + " | ".join(fams) + " | seed-mean | worst seed | misses over best (seed-mean) |",
             "|---|" + "---:|" * (len(fams) + 3)]
    for name, r in recipes.items():
        cells = [f"{r['family'][f]:.3f}" if f in r["family"] else "-" for f in fams]
        seeds = ", ".join(f"{m:.3f}" for m in r["seed_means"])
        lines.append(f"| {name} ({r['seeds']}: {seeds}) | " + " | ".join(cells) +
                     f" | {r['mean']:.3f} | {r['worst']:.3f} | {r['misses_over_best']:.1f} |")
    return "\n".join(lines)


def _init(windows: int, max_jobs: int, rules_ref: str, models: dict[str, str], names: list[str] | None,
          seed0: int = SEED0) -> None:
    global _RULES_REF
    _RULES_REF = rules_ref
    _MODELS.clear()
    _MODELS.update(models)
    _WORLDS[:] = grid_worlds(windows, max_jobs, rules_ref, names, seed0)


def _replay(task: tuple[int, str]) -> tuple[int, str, dict[str, float]]:
    """Replay world ``i`` under competitor ``name`` (in a worker process)."""
    from rlsched.train.evaluate import run_world
    from rlsched.train.generalisation import SPOT_METRICS, competitor_scheduler

    i, name = task
    if name in _MODELS:
        sched = _load(_MODELS[name]).scheduler(name)
    else:
        sched = competitor_scheduler(name, lambda: _load(_RULES_REF))
    result = run_world(_WORLDS[i], sched).result()
    return i, name, {k: float(result[k]) for k in SPOT_METRICS}


def summarise(rows: dict[str, dict[str, dict[str, dict[str, float]]]]) -> dict[str, Any]:
    """``{family: {window: {competitor: metrics}}}`` -> per family and competitor ``(cost vs OD, misses)``,
    each family's best baseline and its headroom (``hindsight``: each window's cheapest baseline with no more
    misses there than the best, picked after the fact, as ``(cost vs OD, misses)``), and per competitor its
    mean cost and misses over best."""
    from rlsched.train.generalisation import (
        ONDEMAND_REFERENCE,
        TEACHER,
        best_spot_baseline,
        hindsight_picks,
        spot_totals,
    )

    def is_baseline(name: str) -> bool:
        return not name.startswith((CANDIDATE, TEACHER))

    table: dict[str, dict[str, tuple[float, int]]] = {}
    best: dict[str, tuple[str, float, int]] = {}
    hindsight: dict[str, tuple[float, int]] = {}
    for fam, wins in rows.items():
        names = sorted({n for row in wins.values() for n in row})
        per_name = {n: spot_totals(wins, [w for w in wins if n in wins[w]
                                          and wins[w][ONDEMAND_REFERENCE]["cost_usd"] > 0], n) for n in names}
        cells = {n: (t["cost_vs_od"], t["misses"]) for n, t in per_name.items()}
        table[fam] = cells
        base = [n for n in cells if is_baseline(n)]
        if base:
            b = best_spot_baseline({n: per_name[n] for n in base})
            best[fam] = (b, *cells[b])
            ws = [w for w in wins if all(n in wins[w] for n in base) and wins[w][ONDEMAND_REFERENCE]["cost_usd"] > 0]
            if ws:
                picks = hindsight_picks(wins, ws, base, b)
                hindsight[fam] = (
                    statistics.fmean(wins[w][n]["cost_usd"] / wins[w][ONDEMAND_REFERENCE]["cost_usd"]
                                     for w, n in zip(ws, picks, strict=True)),
                    int(sum(wins[w][n]["deadline_misses"] for w, n in zip(ws, picks, strict=True))))
    everyone = sorted({n for cells in table.values() for n in cells}, key=lambda n: (not is_baseline(n), n))
    totals = {}
    for n in everyone:
        fams = [f for f in table if n in table[f]]
        over = sum(max(0, table[f][n][1] - best[f][2]) for f in fams if f in best)
        totals[n] = {"mean_cost_vs_od": statistics.fmean(table[f][n][0] for f in fams), "misses_over_best": over}
    return {"table": table, "best": best, "hindsight": hindsight, "totals": totals, "order": everyone}


def render(summary: dict[str, Any]) -> str:
    """The grid as a markdown table: cost vs on-demand-only (misses) per family, mean, misses over best."""
    table, best = summary["table"], summary["best"]
    fams = list(table)
    lines = ["| competitor | " + " | ".join(fams) + " | mean | misses over best |",
             "|---|" + "---:|" * (len(fams) + 2)]
    if best:
        lines.append("| best baseline | " + " | ".join(
            f"{best[f][1]:.3f} ({best[f][2]})" if f in best else "-" for f in fams) + " | | |")
    hindsight = summary.get("hindsight") or {}
    if hindsight:
        lines.append("| hindsight pick among the baselines | " + " | ".join(
            f"{hindsight[f][0]:.3f} ({hindsight[f][1]})" if f in hindsight else "-" for f in fams) + " | | |")
    for n in summary["order"]:
        cells = [f"{table[f][n][0]:.3f} ({table[f][n][1]})" if n in table[f] else "-" for f in fams]
        t = summary["totals"][n]
        over = t["misses_over_best"] if best else "-"
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {t['mean_cost_vs_od']:.3f} | {over} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", action="append", default=[],
                    help="a spot model folder to replay (repeatable: seeds of a recipe side by side; omit: baselines "
                         "and teachers)")
    ap.add_argument("--recipe", action="append", default=[], metavar="NAME=FOLDER,FOLDER",
                    help="a recipe's seeds, one folder each (repeatable): replayed as model:NAME#K and summarised "
                         "over the seeds in a second table")
    ap.add_argument("--rules", default="models/spot",
                    help="the model folder whose served rules and forecaster every competitor runs with")
    ap.add_argument("--teacher", action="append", default=[], help="a codec-space teacher to replay (repeatable)")
    ap.add_argument("--no-baselines", action="store_true", help="replay only the on-demand reference, teachers, model")
    ap.add_argument("--families", default="", help="comma-separated subset of the grid's families")
    ap.add_argument("--windows", type=int, default=12, help="windows per family")
    ap.add_argument("--max-jobs", type=int, default=800, help="jobs per window at most")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--seed0", type=int, default=SEED0,
                    help=f"the first window seed (default {SEED0}; another confirms a rule on windows it was not "
                         "probed on)")
    ap.add_argument("--json", default=None, help="write every replay's metrics to this JSON file")
    args = ap.parse_args(argv)

    from rlsched.envs.teacher_actions import acting_teachers
    from rlsched.errors import RlschedError
    from rlsched.train.generalisation import ON_DEMAND_ONLY, ONDEMAND_REFERENCE, RULED, SPOT_BASELINES, TEACHER

    names = [n.strip() for n in args.families.split(",") if n.strip()]
    known = [g[0] for g in GRID]
    bad = [n for n in names if n not in known] + [t for t in args.teacher if t not in acting_teachers()]
    if bad or args.windows < 1 or args.max_jobs < 2 or args.jobs < 1:
        what = f"unknown family or teacher {bad[0]!r} (families: {', '.join(known)}; teachers: " \
               f"{', '.join(acting_teachers())})" if bad else "--windows and --jobs must be >= 1, --max-jobs >= 2"
        print(f"error: {what}", file=sys.stderr)
        return 1
    try:
        recipe_folders, recipes = recipe_models(args.recipe)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        rules = _load(args.rules)
        if not rules.new_rules():
            raise RlschedError(f"{args.rules} is served without rules: the grid compares behind a model's rules")
        for ref in [*args.model, *recipe_folders.values()]:
            _load(ref)
    except (RlschedError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    worlds = grid_worlds(args.windows, args.max_jobs, args.rules, names or None, args.seed0)
    competitors = [ONDEMAND_REFERENCE] if args.no_baselines else \
        [*SPOT_BASELINES, *(b + RULED for b in SPOT_BASELINES if b not in ON_DEMAND_ONLY)]
    models = {**(model_names(args.model) if args.model else {}), **recipe_folders}
    competitors += [TEACHER + t + RULED for t in args.teacher] + list(models)
    tasks = [(i, n) for i in range(len(worlds)) for n in competitors]
    print(f"{len(worlds)} windows x {len(competitors)} competitors on {args.jobs} process(es)", file=sys.stderr)
    t0 = time.perf_counter()
    rows: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    init = (args.windows, args.max_jobs, args.rules, models, names or None, args.seed0)
    if args.jobs > 1:
        # spawned, not forked: this process has loaded a torch model, whose thread pools a fork would copy
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=spawn, initializer=_init, initargs=init) as pool:
            results = list(pool.map(_replay, tasks, chunksize=1))
    else:
        _init(*init)
        results = [_replay(t) for t in tasks]
    for i, n, metrics in results:
        rows.setdefault(worlds[i].label.split("/")[0], {}).setdefault(worlds[i].label, {})[n] = metrics
    wall = time.perf_counter() - t0
    summary = summarise(rows)
    print(render(summary))
    if recipes:
        print("\nRecipes over their seeds (cost vs on-demand-only, means over the seeds):\n")
        print(render_recipes(summarise_recipes(summary, recipes)))
    args_text = "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    print(f"\nCommand: `python benchmarks/spot_grid.py{args_text}` ({len(tasks)} replays in {wall:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
