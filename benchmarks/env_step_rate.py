"""Steps per second of ``rlsched/GpuPool-v0`` under random masked actions, on one core.

An RL run is bounded by how fast the environment steps, so this measures the
unwrapped :class:`~rlsched.envs.GpuPoolEnv` driven by uniformly random *legal*
actions (sampled from :meth:`action_masks`, as an untrained MaskablePPO would),
over whole episodes of the bundled default scenario (or ``--scenario``). For
reference it also replays the very same engine calls (``advance`` / ``apply``
with the decoded decisions) on a bare :class:`~rlsched.sim.engine.Engine`, which
is the floor no codec can beat. Target: >= 20,000 env steps/s.

Prints a markdown table row (median of ``--repeat`` runs) and the exact command::

    python benchmarks/env_step_rate.py --repeat 5   # pins itself to core 0
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from rlsched.envs import GpuPoolEnv
from rlsched.sim.engine import Engine


def run_env(env: GpuPoolEnv, seed: int, max_steps: int, record: bool) -> tuple[int, float, list[Any], Engine]:
    """One episode (or ``max_steps``) of random masked actions; returns steps, seconds, engine calls."""
    calls: list[Any] = []
    rng = np.random.default_rng(seed)
    u = rng.random(max_steps)
    env.reset(seed=seed)
    eng = env.engine
    if record:
        adv, app = eng.advance, eng.apply

        def advance() -> bool:
            calls.append(None)
            return adv()

        def apply(d: Any) -> str | None:
            calls.append(d)
            return app(d)

        eng.advance = advance  # type: ignore[method-assign]
        eng.apply = apply  # type: ignore[method-assign]
    steps = 0
    t0 = time.perf_counter()
    for i in range(max_steps):
        legal = np.flatnonzero(env.action_masks())
        a = legal[int(u[i] * len(legal))]
        _, _, term, trunc, _ = env.step(a)
        steps += 1
        if term or trunc:
            break
    return steps, time.perf_counter() - t0, calls, eng


def replay_engine(env: GpuPoolEnv, eng: Engine, calls: list[Any]) -> float:
    """Seconds a bare engine takes for the same calls (reference floor)."""
    sc = env.scenario
    fresh = Engine(sc.pools, eng.jobs, sc.market, replace(sc.sim, seed=eng.config.seed))
    fresh.advance()  # the env's reset advances once before recording starts
    t0 = time.perf_counter()
    for c in calls:
        if c is None:
            fresh.advance()
        else:
            fresh.apply(c)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=None, help="scenario path or bundled:NAME (default: bundled default)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-steps", type=int, default=200_000, help="cap per run (one episode otherwise)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=0, help="pin to this core (-1 = do not pin)")
    args = ap.parse_args(argv)
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})  # one core, as one env of a vectorised run gets
    env = GpuPoolEnv(args.scenario)
    env_rates, eng_rates, steps_seen = [], [], []
    for r in range(args.repeat):
        steps, secs, _, _ = run_env(env, args.seed + r, args.max_steps, record=False)
        env_rates.append(steps / secs)
        steps_seen.append(steps)
        # Same seed again, recording the engine calls (recording costs time, so it is not the timed run).
        steps2, _, calls, eng = run_env(env, args.seed + r, args.max_steps, record=True)
        eng_rates.append(steps2 / replay_engine(env, eng, calls))
    env_med = statistics.median(env_rates)
    eng_med = statistics.median(eng_rates)
    cmd = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    print(f"| scenario | steps/run | env steps/s (median of {args.repeat}) | engine-only replay steps/s "
          "| env share of time |")
    print("|---|---|---|---|---|")
    share = 1.0 - env_med / eng_med if eng_med > 0 else float("nan")
    print(f"| {env.scenario.name} | {int(statistics.median(steps_seen))} | {env_med:,.0f} | {eng_med:,.0f} "
          f"| {share:.0%} |")
    print(f"\ncommand: {cmd}")
    print(f"runs: env {[round(x) for x in env_rates]}, engine {[round(x) for x in eng_rates]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
