"""How much mean JCT job ordering and preemption can gain: schedulers, bounds and rules side by side.

Replays an experiment's windows (default ``experiments/default.yaml``'s evaluation
windows) under each variant and prints mean JCT relative to weighted-priority (the
ratio of the mean over windows, as the model card computes it), the per-window range,
restarts and lost GPU-hours per window, with the exact command. A variant is::

    NAME[+oracle][+preempt=F[/G]]

* ``NAME`` - a registered heuristic (``sjf``, ``tiresias``, ...), ``ppo`` (``--model``
  served with the rules saved with it) or ``ppo-bare`` (the network alone);
* ``+oracle`` - every scheduler and rule is told TRUE durations (a bound, not a
  scheduler: ``sjf+oracle`` is the model card's ``sjf-oracle-bound``);
* ``+preempt=F[/G]`` - long-job preemption (:mod:`rlsched.policies.rules.preempt_long`) in
  front, with ``factor`` F and ``min_gain_gpu_s`` G (default 3600).
  ``sjf+oracle+preempt=1.2/120`` approximates shortest-remaining-first with
  preemption on true durations, the bound for ordering plus suspension.

``--windows training`` replays 48 h windows cut every 150 h from the first scenario's
*training* window instead (where the rule's factor was chosen). The rule suspends only
``preemptible`` jobs; ``--preemptible all`` declares every job of the windows so (as a
scenario's ``preemptible: all`` does), which Philly's canonical table does not::

    python benchmarks/jct_headroom.py --preemptible all --variants weighted-priority,sjf,sjf+oracle,sjf+preempt=10
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def parse_variant(text: str) -> tuple[str, bool, tuple[float, float] | None]:
    """``(name, oracle, (factor, min_gain) or None)`` of a variant (see the module docstring)."""
    name, *mods = text.split("+")
    oracle, preempt = False, None
    for m in mods:
        if m == "oracle":
            oracle = True
        elif m.startswith("preempt="):
            f, _, g = m[len("preempt="):].partition("/")
            try:
                preempt = (float(f), float(g) if g else 3600.0)
            except ValueError:
                raise ValueError(f"bad variant {text!r}: preempt=F[/G] takes numbers") from None
        else:
            raise ValueError(f"unknown variant modifier {m!r} in {text!r} (oracle, preempt=F[/G])")
    return name, oracle, preempt


def scheduler(text: str, model_ref: str) -> Any:
    """A fresh scheduler for one variant."""
    from rlsched.policies import make_policy
    from rlsched.policies.rules import RuledScheduler
    from rlsched.policies.rules.preempt_long import LongJobPreemption

    name, _, preempt = parse_variant(text)
    if name in ("ppo", "ppo-bare"):
        from rlsched.learned.ppo import PpoScheduler, load_policy_ref
        from rlsched.train.registry import download_model

        inner: Any = PpoScheduler(load_policy_ref(model_ref, fetch=download_model), name=name, use_rules=name == "ppo")
    else:
        inner = make_policy(name)
    if preempt is None:
        return inner
    return RuledScheduler(inner, [LongJobPreemption(factor=preempt[0], min_gain_gpu_s=preempt[1])])


def worlds_for(exp: Any, which: str, preemptible: str = "trace") -> list[Any]:
    """The windows to replay (evaluation, holdout, or 48 h cuts of the training window).

    ``preemptible``: ``trace`` keeps each job's flag, ``all`` / ``none`` overrides it.
    """
    worlds = _worlds(exp, which)
    if preemptible == "trace":
        return worlds
    flag = preemptible == "all"
    return [replace(w, scenario=replace(w.scenario, jobs=[replace(j, preemptible=flag) for j in w.scenario.jobs]))
            for w in worlds]


def _worlds(exp: Any, which: str) -> list[Any]:
    from rlsched.train.forecast_fit import attach, fit_forecasters
    from rlsched.train.worlds import evaluation_worlds

    fitted = fit_forecasters(exp)
    if which == "holdout":
        return attach(exp, evaluation_worlds(exp.holdout, exp.eval_max_jobs), fitted, holdout=True)
    if which == "training":
        entry = exp.scenarios[0]
        lo, hi = entry.train_window_h
        starts = range(int(lo) + 100, int(hi) - 48, 150)
        entry = replace(entry, eval_windows_h=tuple((float(s), float(s + 48)) for s in starts))
        return attach(exp, evaluation_worlds((entry,), exp.eval_max_jobs), fitted)
    return attach(exp, evaluation_worlds(exp.scenarios, exp.eval_max_jobs), fitted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default=str(ROOT / "experiments" / "default.yaml"))
    ap.add_argument("--model", default=str(ROOT / "models" / "scorer"), help="the folder `ppo` variants serve")
    ap.add_argument("--variants", default="weighted-priority,sjf,sjf+oracle,sjf+oracle+preempt=1.2/120,"
                                          "sjf+preempt=2/0,sjf+preempt=10,ppo")
    ap.add_argument("--windows", choices=("evaluation", "holdout", "training"), default="evaluation")
    ap.add_argument("--max-windows", type=int, default=0, help="only the first N windows (0 = all)")
    ap.add_argument("--repeat", type=int, default=1, help="replay each variant N times; wall time is the median")
    ap.add_argument("--preemptible", choices=("trace", "all", "none"), default="trace",
                    help="keep each job's preemptible flag, or declare every job preemptible / not")
    args = ap.parse_args(argv)

    from rlsched.errors import RlschedError
    from rlsched.train.config import load_experiment
    from rlsched.train.evaluate import run_world

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    try:
        exp = load_experiment(args.experiment)
        for v in variants:
            scheduler(v, args.model)
        worlds = worlds_for(exp, args.windows, args.preemptible)
    except (RlschedError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.max_windows > 0:
        worlds = worlds[: args.max_windows]
    if not worlds:
        print(f"error: {args.experiment} has no {args.windows} windows", file=sys.stderr)
        return 1
    base = [run_world(w, scheduler("weighted-priority", args.model)).result()["mean_jct_s"] for w in worlds]
    print(f"{len(worlds)} {args.windows} windows of {args.experiment} (preemptible: {args.preemptible})\n")
    print("| variant | mean JCT vs weighted-priority | per-window range | restarts / window | lost GPU-h / window "
          "| replay s (all windows) |")
    print("|---|---:|---:|---:|---:|---:|")
    for v in variants:
        _, oracle, _ = parse_variant(v)
        walls = []
        for _ in range(max(args.repeat, 1)):  # (replays are deterministic: every repeat gives the same results)
            jct, restarts, lost = [], [], []
            t0 = time.perf_counter()
            for w in worlds:
                r = run_world(w, scheduler(v, args.model), oracle_durations=oracle).result()
                jct.append(r["mean_jct_s"])
                restarts.append(r["restarts"])
                lost.append(r["lost_gpu_hours"])
            walls.append(time.perf_counter() - t0)
        ratios = [a / b for a, b in zip(jct, base, strict=True)]
        print(f"| {v} | {statistics.fmean(jct) / statistics.fmean(base):.3f} | {min(ratios):.2f}-{max(ratios):.2f} | "
              f"{statistics.fmean(restarts):.1f} | {statistics.fmean(lost):.2f} | {statistics.median(walls):.1f} |",
              flush=True)
    args_text = "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    print(f"\nCommand: `python benchmarks/jct_headroom.py{args_text}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
