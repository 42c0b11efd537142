"""Decision latency of the service's scheduler: PPO behind the fallback guard vs the heuristic.

What is measured: a *decision point* is one call of ``decide(state)``, consumed
until exhausted (every yielded decision applied to the simulator state in
between, apply time excluded) - what the scheduler service does on every
arrival/completion. Timed with ``Timed`` from ``policy_latency.py``: "point"
columns per decision point; "per-decision" columns per yielded decision (one
placement), i.e. the ``next()`` that produced it - what the service's
decision-latency histogram observes. A point's time is the sum of its
decisions' plus the final ``next()`` that ends it. For each cluster size and
queue length:

* the state is built the way the simulator builds it: ``Engine`` over
  ``parse_cluster("<N>x8xA100-80GB")`` (ready on-prem nodes), filled by the
  weighted-priority heuristic with long-running jobs until only ~1/16 of the GPUs
  (at least one) are free, then ``QUEUE`` jobs are queued (1/2/4/8 GPUs, mixed
  priorities and durations, submitted over the last hour) - a busy cluster in
  steady state, where a decision point places a few jobs and then waits;
* ``--states`` such snapshots (different seeds) are pickled once; every sample
  unpickles one (untimed), calls ``reset`` (untimed, so each sample starts with
  cold per-scheduler caches: pessimistic) and times the decision point;
* ``--warmup`` samples are discarded, then ``--repeats`` repeats of ``--samples``
  samples each; the table shows the median over repeats of each repeat's p50/p99.

Schedulers: (a) ``FallbackScheduler(PpoScheduler(models/scorer), weighted-priority)``
with the default guard (50 ms budget; the fallback count is printed so a run where
the guard stepped in is visible), (b) ``weighted-priority`` alone. The PPO forward
pass is the numpy one ``PpoScheduler`` serves with (``--inference torch``: the torch
module instead, one thread by default, ``--threads``).

    python benchmarks/decision_latency.py            # full table (a few minutes)
    python benchmarks/decision_latency.py --quick    # smoke run (seconds)
    python benchmarks/decision_latency.py --inference torch   # the torch forward, for comparison
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_latency import Timed

ROOT = Path(__file__).resolve().parent.parent
GPUS_PER_NODE = 8
MODEL = "A100-80GB"


def build_state(nodes: int, queued: int, seed: int) -> bytes:
    """A pickled :class:`~rlsched.sim.Engine` at a steady-state decision point (see the module doc)."""
    from rlsched.cluster.job import Job
    from rlsched.cluster.model import JobRun
    from rlsched.cluster.shorthand import parse_cluster
    from rlsched.policies import make_policy
    from rlsched.sim import Engine

    rng = np.random.default_rng(seed)
    eng = Engine(parse_cluster(f"{nodes}x{GPUS_PER_NODE}x{MODEL}"), [])
    st = eng.state
    now = eng.now
    total = nodes * GPUS_PER_NODE
    free_target = max(1, total // 16)
    # Fill: long jobs of 1-8 GPUs, placed by the heuristic, until free_target GPUs are left.
    busy, k = 0, 0
    while busy < total - free_target:
        n = int(min(rng.choice([1, 1, 2, 4, 8]), total - free_target - busy))
        job = Job(f"fill-{k}", now - 7200.0 + k, float(rng.uniform(3600, 36000)), num_gpus=n,
                  priority=int(rng.integers(0, 3)), user=f"u{k % 7}")
        st.note_arrival(job, now)
        st.enqueue(JobRun(job=job, enqueued_at=now))
        busy, k = busy + n, k + 1
    wp = make_policy("weighted-priority")
    for d in wp.decide(st):
        eng.apply(d)
    for jid in list(st.queue):  # fillers that found no room (fragmentation) are not part of the queue
        st.dequeue(jid)
    # The queue the decision point sees.
    sizes = rng.choice([1, 2, 4, 8], size=queued, p=[0.5, 0.2, 0.15, 0.15])
    submits = np.sort(now - rng.uniform(0, 3600, size=queued))
    for i in range(queued):
        job = Job(f"q-{i}", float(submits[i]), float(rng.lognormal(8.0, 1.2)), num_gpus=int(sizes[i]),
                  priority=int(rng.integers(0, 3)), user=f"u{i % 11}", preemptible=bool(rng.random() < 0.3))
        st.note_arrival(job, now)
        st.enqueue(JobRun(job=job, enqueued_at=now))
    return pickle.dumps(eng)


def make_schedulers(model_dir: Path, inference: str = "numpy") -> dict[str, Any]:
    from rlsched.learned.ppo import PolicyModel, PpoScheduler
    from rlsched.policies import make_policy
    from rlsched.runtime.fallback import FallbackScheduler

    model = PolicyModel.load(model_dir)
    if inference == "torch":
        model.numpy_net = None  # the torch forward (the reference; what served before the numpy path)
    return {
        "ppo+guard": FallbackScheduler(PpoScheduler(model), make_policy("weighted-priority")),
        "weighted-priority": make_policy("weighted-priority"),
    }


def sample(sched: Any, snapshot: bytes) -> tuple[float, int, list[float]]:
    """(seconds, decisions, seconds of each decision) of one decision point on a fresh copy of ``snapshot``.

    A decision's time is that of the ``next()`` that yielded it (what the service's
    decision-latency histogram observes); the point's time adds the final ``next()``
    that ends the point (the policy's last look at the state, when it chooses to wait).
    """
    eng = pickle.loads(snapshot)
    reset = getattr(sched, "reset", None)
    if callable(reset):
        reset(eng.state)
    timed = Timed(sched)
    for d in timed.decide(eng.state):
        eng.apply(d)
    return timed.point_samples[-1], timed.point_decisions[-1], timed.samples[:-1]


def measure(sched: Any, snapshots: list[bytes], warmup: int, repeats: int, samples: int) -> dict[str, float]:
    for i in range(warmup):
        sample(sched, snapshots[i % len(snapshots)])
    p50s, p99s, decisions, d50s, d99s = [], [], [], [], []
    for _ in range(repeats):
        gc.collect()
        xs: list[float] = []
        ds: list[float] = []
        for i in range(samples):
            dt, n, each = sample(sched, snapshots[i % len(snapshots)])
            xs.append(dt * 1e3)
            ds.extend(x * 1e3 for x in each)
            decisions.append(n)
        p50s.append(float(np.percentile(xs, 50)))
        p99s.append(float(np.percentile(xs, 99)))
        if ds:
            d50s.append(float(np.percentile(ds, 50)))
            d99s.append(float(np.percentile(ds, 99)))
    nan = float("nan")
    return {"p50": statistics.median(p50s), "p99": statistics.median(p99s),
            "p99_min": min(p99s), "p99_max": max(p99s), "decisions": float(np.mean(decisions)),
            "d50": statistics.median(d50s) if d50s else nan, "d99": statistics.median(d99s) if d99s else nan}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "scorer"))
    ap.add_argument("--queues", default=None, help="queued jobs, comma-separated (default 10,100,1000)")
    ap.add_argument("--nodes", default=None, help="nodes of 8 A100s, comma-separated (default 1,8,64)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--samples", type=int, default=100, help="decision points per repeat")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--states", type=int, default=5, help="distinct snapshots (seeds) per configuration")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--inference", choices=("numpy", "torch"), default="numpy",
                    help="PPO forward pass: numpy (what PpoScheduler serves with) or the torch module")
    ap.add_argument("--quick", action="store_true", help="smoke run: 10/100 jobs on 8/64 GPUs, few samples")
    args = ap.parse_args(argv)
    if args.quick:
        args.queues, args.nodes = args.queues or "10,100", args.nodes or "1,8"
        args.repeats, args.samples, args.warmup, args.states = 2, 10, 2, 2
    args.queues, args.nodes = args.queues or "10,100,1000", args.nodes or "1,8,64"
    import torch

    torch.set_num_threads(args.threads)
    scheds = make_schedulers(Path(args.model), args.inference)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"point = decide() at one decision point consumed until exhausted (apply excluded); "
          f"per-decision = one yielded decision (one next()); "
          f"median over {args.repeats} repeats x {args.samples} samples (+{args.warmup} warm-up), "
          f"{args.states} snapshots; PPO inference {args.inference}; torch threads={args.threads}; "
          f"load average at start {load:.2f} "
          f"on {os.cpu_count()} CPUs")
    print()
    print("| scheduler | GPUs | queued jobs | point p50 ms | point p99 ms | point p99 range over repeats | "
          "decisions per point | per-decision p50 ms | per-decision p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    t_start = time.perf_counter()
    for nodes in (int(x) for x in args.nodes.split(",")):
        for queued in (int(x) for x in args.queues.split(",")):
            snaps = [build_state(nodes, queued, seed) for seed in range(args.states)]
            for label, sched in scheds.items():
                r = measure(sched, snaps, args.warmup, args.repeats, args.samples)
                print(f"| {label} | {nodes * GPUS_PER_NODE} | {queued:,} | {r['p50']:.3f} | {r['p99']:.3f} | "
                      f"{r['p99_min']:.3f}-{r['p99_max']:.3f} | {r['decisions']:.1f} | {r['d50']:.3f} | "
                      f"{r['d99']:.3f} |", flush=True)
    guard = scheds["ppo+guard"]
    print()
    print(f"guard: primary decisions {guard.primary_decisions}, fallback decisions {guard.fallback_decisions}, "
          f"fallbacks by reason {guard.fallbacks_by_reason or '{}'}; "
          f"load average at end {os.getloadavg()[0]:.2f}; wall {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
