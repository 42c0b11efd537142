"""Per-decision latency of a trained policy (encode + forward + mask + decode), p50/p99.

Measured inside ``rlsched simulate``'s loop on the bundled default scenario: each
decision of :class:`~rlsched.learned.ppo.PpoScheduler` is timed, and the
weighted-priority heuristic's decision passes are timed for reference.

    python benchmarks/policy_latency.py models/scorer
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np


class Timed:
    """Wraps a scheduler and records how long each decision (each yielded item) takes.

    ``samples`` holds one entry per ``next()`` (each yielded decision, plus the final
    one that ends the decision point); ``point_samples`` one per decision point: the
    sum of that point's ``next()`` times, i.e. ``decide()`` consumed until exhausted,
    without the time the caller spends applying the decisions.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.samples: list[float] = []
        self.point_samples: list[float] = []
        self.point_decisions: list[int] = []

    def reset(self, state: Any) -> None:
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset(state)

    def decide(self, state: Any) -> Any:
        t0 = time.perf_counter()
        it = iter(self.inner.decide(state))
        total, count = time.perf_counter() - t0, 0
        while True:
            t0 = time.perf_counter()
            try:
                d = next(it)
            except StopIteration:
                dt = time.perf_counter() - t0
                self.samples.append(dt)
                self.point_samples.append(total + dt)
                self.point_decisions.append(count)
                return
            dt = time.perf_counter() - t0
            self.samples.append(dt)
            total, count = total + dt, count + 1
            yield d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--jobs", type=int, default=1500)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from rlsched.learned.ppo import PolicyModel, PpoScheduler
    from rlsched.policies import make_policy
    from rlsched.scenario import load_scenario
    from rlsched.sim import Engine

    sc = load_scenario()
    print("| policy | decisions timed | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    for sched in (PpoScheduler(PolicyModel.load(args.model)), make_policy("weighted-priority")):
        timed = Timed(sched)
        Engine(sc.pools, sc.jobs[: args.jobs], sc.market, sc.sim).run(timed)
        s = np.array(timed.samples) * 1e3
        print(f"| {sched.name} | {len(s):,} | {np.percentile(s, 50):.3f} | {np.percentile(s, 99):.3f} |")


if __name__ == "__main__":
    main()
