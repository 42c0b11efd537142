"""Cost report of the spot/on-demand baselines (issue 6, part 5).

Replays two real workloads on a hybrid spot + on-demand cluster under every cost
baseline, for two periods of the bundled (real, GCP us-central1) price series, and
prints a markdown table for BENCHMARKS.md: cost and mean JCT relative to
``ondemand-autoscale`` (the on-demand-only reference), deadline misses, lost
GPU-hours and restarts. The exact command is printed above the table so the numbers
can be reproduced.

Workloads (every job preemptible, i.e. allowed on spot):

* ``philly``: the first N jobs of the bundled Philly 3-day window, deadline =
  submit + ``--deadline-factor`` x duration;
* ``openb``: the first N pods of the bundled Alibaba openb sample, no deadlines.

Periods: ``--market-offset`` values (seconds into the bundled series). The defaults
read H100-80GB at 0 s (June 2024: spot $7.80 vs on-demand $11.06 per GPU-hour, spot
at 71% of on-demand) and at 24.7e6 s (March 2025: spot $2.55 vs $11.06, 23%). Spot
reclaims follow the bundled preemption model (AWS Spot Advisor hazard for H100).

Run from the repository root::

    python benchmarks/cost_report.py                  # defaults: 1000 jobs per workload (~25 s)
    python benchmarks/cost_report.py --jobs 500 --periods 0,6687880,24700000
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass

from rlsched.cluster.spec import parse_cluster
from rlsched.market import default_market
from rlsched.policies import make_policy
from rlsched.scenario import apply_workload_options, load_jobs
from rlsched.sim import Engine
from rlsched.sim.engine import SimConfig
from rlsched.sim.metrics import Report

REFERENCE = "ondemand-autoscale"
POLICIES = ("ondemand-static", "ondemand-autoscale", "spot-greedy", "spot-fallback", "uniform-progress")
WORKLOADS = {
    "philly": "bundled:philly-3day.csv",
    "openb": "bundled:openb-default-1500.csv",
}


@dataclass
class Row:
    period: str
    workload: str
    report: Report


def _load_policies() -> None:
    """Register the baselines even where ``base._load_builtin`` does not import them yet."""
    import rlsched.policies.spot
    import rlsched.policies.uniform_progress  # noqa: F401


def run(args: argparse.Namespace) -> list[Row]:
    """Every (period, workload, policy) run, in that order."""
    _load_policies()
    pools = parse_cluster(args.cluster)
    rows: list[Row] = []
    for offset in args.periods:
        market = default_market(offset)
        market.check_pools(pools)
        for wl in args.workloads:
            raw, _ = load_jobs([{"path": WORKLOADS[wl], "max_jobs": args.jobs}], None)
            jobs = apply_workload_options(
                raw, pools, load_factor=args.load_factor, preemptible="all",
                deadline_factor=args.deadline_factor if wl == "philly" else None,
            )
            for name in args.policies:
                t0 = time.perf_counter()
                engine = Engine(pools, jobs, market, SimConfig(seed=args.seed))
                report = engine.run(make_policy(name))
                print(f"  {offset:>10.0f}s {wl:7s} {name:20s} {time.perf_counter() - t0:6.1f}s", file=sys.stderr)
                rows.append(Row(f"{offset:.0f}", wl, report))
    return rows


def table(rows: list[Row]) -> str:
    """Markdown table; cost and JCT are relative to the reference of the same period and workload."""
    ref = {(r.period, r.workload): r.report for r in rows if r.report.policy == REFERENCE}
    out = [
        "| market offset (s) | workload | policy | cost (USD) | cost vs on-demand | mean JCT vs on-demand "
        "| deadline misses | lost GPU-h | restarts | spot share of cost |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rep = r.report
        base = ref.get((r.period, r.workload))
        cost_rel = f"{rep.cost_usd / base.cost_usd:.2f}" if base and base.cost_usd > 0 else "n/a"
        jct_rel = f"{rep.mean_jct_s / base.mean_jct_s:.2f}" if base and base.mean_jct_s > 0 else "n/a"
        spot_share = rep.cost_spot_usd / rep.cost_usd if rep.cost_usd > 0 else 0.0
        misses = str(rep.deadline_misses) if r.workload == "philly" else "-"
        out.append(
            f"| {r.period} | {r.workload} | {rep.policy} | {rep.cost_usd:,.0f} | {cost_rel} | {jct_rel} "
            f"| {misses} | {rep.lost_gpu_hours:.1f} | {rep.restarts} | {spot_share:.0%} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000, help="jobs per workload (first N of the bundled sample)")
    ap.add_argument("--periods", default="0,24700000",
                    help="comma-separated market offsets in seconds (one price period each)")
    ap.add_argument("--workloads", default="philly,openb", help=f"comma-separated, of {','.join(WORKLOADS)}")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policy names")
    ap.add_argument("--cluster", default="spot:0-8x8xH100-80GB,ondemand:0-8x8xH100-80GB")
    ap.add_argument("--deadline-factor", type=float, default=3.0, help="philly: deadline = submit + X x duration")
    ap.add_argument("--load-factor", type=float, default=None, help="rescale arrivals to this load")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.periods = [float(x) for x in args.periods.split(",") if x]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.policies = [p for p in args.policies.split(",") if p]
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workloads {unknown}; known: {sorted(WORKLOADS)}")
    if REFERENCE not in args.policies:
        args.policies.insert(0, REFERENCE)
    cmd = "python benchmarks/cost_report.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    rows = run(args)
    print(f"Command: `{cmd.strip()}`\n")
    print(f"Cluster `{args.cluster}`, bundled market (GCP us-central1 H100/A100 series), seed {args.seed}, "
          f"{args.jobs} jobs per workload, all preemptible; philly deadlines = submit + "
          f"{args.deadline_factor:g} x duration; cost and JCT relative to {REFERENCE} (on-demand only).\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
