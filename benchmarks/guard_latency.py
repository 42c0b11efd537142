"""Time the deadline guard's scan (and any other rule's) per decision point while the spot policy replays real windows.

The guard (``rlsched/policies/rules/deadline_guard.py``) looks at every queued deadline job at
every decision point, so its cost grows with the queue; node consolidation
(``rlsched/policies/rules/consolidate.py``) scans each elastic pool's nodes. This replays the
evaluation windows of an experiment (default ``experiments/spot.yaml``: Philly jobs,
every one with a deadline, on spot + on-demand fleets) under a model folder that
carries a guard (default ``models/spot``), and times each rule's part of each decision
point: the ``next()`` calls of its ``decide`` generator, each yielded decision applied
by the engine in between (apply time excluded), as in serving. Prints, per rule,
p50/p99/max per decision point, overall and at the longest queues, and the exact command.

    python benchmarks/guard_latency.py
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


class TimedGuard:
    """Wraps a guard: times each ``next()`` of its ``decide`` and records the queue length."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.times_us: list[float] = []
        self.queues: list[int] = []

    def reset(self, state: Any) -> None:
        self.inner.reset(state)

    def decide(self, state: Any) -> Iterator[Any]:
        gen = self.inner.decide(state)
        spent = 0
        queued = len(state.queue)
        while True:
            t0 = time.perf_counter_ns()
            try:
                d = next(gen)
            except StopIteration:
                spent += time.perf_counter_ns() - t0
                break
            spent += time.perf_counter_ns() - t0
            yield d
        self.times_us.append(spent / 1e3)
        self.queues.append(queued)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default=str(ROOT / "experiments" / "spot.yaml"))
    ap.add_argument("--model", default=str(ROOT / "models" / "spot"))
    ap.add_argument("--max-windows", type=int, default=0, help="replay only the first N windows (0 = all)")
    args = ap.parse_args(argv)

    from rlsched.errors import RlschedError
    from rlsched.learned.ppo import PpoScheduler, load_policy_ref
    from rlsched.policies.rules import RULES
    from rlsched.train.config import load_experiment
    from rlsched.train.evaluate import run_world
    from rlsched.train.forecast_fit import attach, fit_forecasters
    from rlsched.train.registry import download_model
    from rlsched.train.worlds import evaluation_worlds

    try:
        exp = load_experiment(args.experiment)
        model = load_policy_ref(args.model, fetch=download_model)
        if model.guard_params is None:
            print(f"{args.model}: the model has no deadline guard (deadline_guard.json)", file=sys.stderr)
            return 1
        worlds = attach(exp, evaluation_worlds(exp.scenarios, exp.eval_max_jobs), fit_forecasters(exp))
    except RlschedError as exc:  # a missing trace (../shared/data), a bad model folder, ...
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.max_windows > 0:
        worlds = worlds[: args.max_windows]
    names = [n for n in RULES if n in model.rule_params]
    times: dict[str, list[float]] = {n: [] for n in names}
    queues: dict[str, list[int]] = {n: [] for n in names}
    for w in worlds:
        sched = PpoScheduler(model)
        timed = [TimedGuard(r) for r in sched.rules]  # in acting order, as new_rules() builds them
        sched.rules = list(timed)
        run_world(w, sched)
        for n, rule in zip(names, timed, strict=True):
            times[n] += rule.times_us
            queues[n] += rule.queues
    print("| rule | windows | decision points | queue p50 / p99 / max | p50 | p99 | max | "
          "p50 at the top 1% of queues |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for n in names:
        t, q = np.array(times[n]), np.array(queues[n])
        top = t[q >= np.percentile(q, 99)]
        print(f"| {n} | {len(worlds)} | {len(t):,} | {np.median(q):.0f} / {np.percentile(q, 99):.0f} / {q.max()} | "
              f"{np.percentile(t, 50):.1f} us | {np.percentile(t, 99):.1f} us | {t.max():.0f} us | "
              f"{np.median(top):.1f} us |")
    args_text = "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    print(f"\nCommand: `python benchmarks/guard_latency.py{args_text}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
