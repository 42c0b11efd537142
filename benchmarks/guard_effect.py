"""What the serving rules add: a model served with and without its deadline guard and consolidation.

Replays the evaluation and holdout windows of an experiment (default
``experiments/spot.yaml``) under one model folder (default ``models/spot``) served with
each variant of the rules in front of it (:mod:`rlsched.policies.rules`), and the
on-demand-only reference (``ondemand-autoscale``) per window, and prints per-window
means of cost relative to the reference, mean JCT relative to it and deadline misses,
with the exact command. Variants (``--variants``, comma-separated):

* ``none`` - the network alone (``PpoScheduler(model, use_rules=False)``);
* ``model`` - the rules saved with the model (``deadline_guard.json``,
  ``consolidate.json``), as served;
* ``guard`` - the model's deadline guard only (its consolidation, if any, left out);
* ``margin=F`` / ``margin=F+preempt`` - a guard with that margin fraction (5 min floor),
  without / with preemption, whatever the model was trained with;
* ``V+consolidate`` - variant ``V`` with default node consolidation added.

    python benchmarks/guard_effect.py --variants none,margin=0.25,model

To measure an older model, check its folder out (e.g. ``git worktree add /tmp/a <commit>``)
and pass ``--model /tmp/a/models/spot``.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def scheduler(model: Any, variant: str) -> Any:
    """The model served with one variant of its rules (see the module docstring)."""
    from rlsched.learned.ppo import PpoScheduler
    from rlsched.policies.rules.consolidate import Consolidator
    from rlsched.policies.rules.deadline_guard import DeadlineGuard

    base, plus = variant, False
    if variant.endswith("+consolidate"):
        base, plus = variant[: -len("+consolidate")], True
    sched = PpoScheduler(model, name=variant, use_rules=False)
    if base == "model":
        sched.rules = model.new_rules()
    elif base == "guard":
        sched.rules = [r for r in model.new_rules() if isinstance(r, DeadlineGuard)]
    elif base.startswith("margin="):
        frac, _, flag = base[len("margin="):].partition("+")
        if flag not in ("", "preempt"):
            raise ValueError(f"unknown variant {variant!r}")
        sched.rules = [DeadlineGuard(margin_frac=float(frac), preempt=flag == "preempt")]
    elif base != "none":
        raise ValueError(f"unknown variant {variant!r} (none, model, guard, margin=F, margin=F+preempt, "
                         "each optionally +consolidate)")
    if plus and not any(isinstance(r, Consolidator) for r in sched.rules):
        sched.rules.append(Consolidator())
    return sched


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default=str(ROOT / "experiments" / "spot.yaml"))
    ap.add_argument("--model", default=str(ROOT / "models" / "spot"))
    ap.add_argument("--variants", default="none,model")
    ap.add_argument("--max-windows", type=int, default=0, help="only the first N windows of each set (0 = all)")
    args = ap.parse_args(argv)

    from rlsched.errors import RlschedError
    from rlsched.learned.ppo import load_policy_ref
    from rlsched.policies import make_policy
    from rlsched.train.config import load_experiment
    from rlsched.train.evaluate import ONDEMAND_REFERENCE, run_world
    from rlsched.train.forecast_fit import attach, fit_forecasters
    from rlsched.train.registry import download_model
    from rlsched.train.worlds import evaluation_worlds

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    try:
        exp = load_experiment(args.experiment)
        model = load_policy_ref(args.model, fetch=download_model)
        for v in variants:
            scheduler(model, v)
        fitted = fit_forecasters(exp)
        sets = [("evaluation", attach(exp, evaluation_worlds(exp.scenarios, exp.eval_max_jobs), fitted))]
        if exp.holdout:
            sets.append(("holdout", attach(exp, evaluation_worlds(exp.holdout, exp.eval_max_jobs), fitted,
                                           holdout=True)))
    except (RlschedError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("| windows | variant | cost vs on-demand | mean JCT vs on-demand | deadline misses per window |")
    print("|---|---|---:|---:|---:|")
    for label, worlds in sets:
        if args.max_windows > 0:
            worlds = worlds[: args.max_windows]
        refs = [run_world(w, make_policy(ONDEMAND_REFERENCE)).result() for w in worlds]
        for v in variants:
            cost, jct, miss = [], [], []
            for w, ref in zip(worlds, refs, strict=True):
                r = run_world(w, scheduler(model, v)).result()
                cost.append(r["cost_usd"] / ref["cost_usd"])
                jct.append(r["mean_jct_s"] / ref["mean_jct_s"])
                miss.append(r["deadline_misses"])
            print(f"| {label} ({len(worlds)}) | {v} | {statistics.fmean(cost):.3f} | {statistics.fmean(jct):.3f} | "
                  f"{statistics.fmean(miss):.2f} |", flush=True)
    args_text = "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    print(f"\nCommand: `python benchmarks/guard_effect.py{args_text}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
