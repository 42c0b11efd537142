"""Full-trace replay time and peak memory of the simulator under weighted-priority.

Workloads of 10k, 100k and 1M jobs are bootstrap-resampled from the real Philly 2017
job table (durations and GPU counts drawn jointly from real jobs, Poisson arrivals)
at a fixed offered load on a fixed 60 x 8 V100 fleet, so run time should grow
linearly with the number of jobs. Each size runs in its own process so that peak
RSS is that size's alone. Prints a markdown table (median of --repeat runs).

    python benchmarks/replay.py --sizes 10000 100000 1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHILLY = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "philly-2017" / "philly_jobs.csv"
CLUSTER = "60x8xV100-16GB"


def make_jobs(n: int, load: float, seed: int) -> list:
    import numpy as np

    from rlsched.cluster import Job
    from rlsched.workload import read_philly

    real = [j for j in read_philly(str(PHILLY)).jobs if j.num_gpus <= 64]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(real), n)
    gpus = 60 * 8
    mean_demand = float(np.mean([real[i].duration * real[i].num_gpus for i in idx]))
    rate = load * gpus / mean_demand  # arrivals per second
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    return [Job(str(k), float(t[k]), real[i].duration, real[i].num_gpus, user=real[i].user)
            for k, i in enumerate(idx)]


def one(n: int, load: float, seed: int) -> dict:
    from rlsched.cluster import parse_cluster
    from rlsched.policies import make_policy
    from rlsched.sim import Engine

    jobs = make_jobs(n, load, seed)
    t0 = time.perf_counter()
    engine = Engine(parse_cluster(CLUSTER), jobs)
    report = engine.run(make_policy("weighted-priority"))
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"jobs": n, "wall_s": wall, "peak_rss_mib": rss, "completed": report.jobs_completed,
            "events": report.sim_events, "utilization": report.gpu_utilization}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.load, 0)))
        return
    print(f"| jobs | replay wall s (median of {args.repeat}) | jobs/s | peak RSS MiB | utilisation |")
    print("|---:|---:|---:|---:|---:|")
    for n in args.sizes:
        runs = []
        for _ in range(args.repeat):
            out = subprocess.run([sys.executable, __file__, "--one", str(n), "--load", str(args.load)],
                                 check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        wall = statistics.median(r["wall_s"] for r in runs)
        rss = statistics.median(r["peak_rss_mib"] for r in runs)
        print(f"| {n:,} | {wall:.2f} | {n / wall:,.0f} | {rss:,.0f} | {runs[0]['utilization']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
