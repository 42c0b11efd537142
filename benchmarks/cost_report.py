"""Cost report of spot economics (issue 6, part 5): every baseline and the PPO policy.

Replays two real workloads on an all-elastic spot + on-demand fleet under every cost
baseline and (with ``--ppo``) a trained policy, for real price periods, and prints a
markdown table for BENCHMARKS.md: cost and mean JCT relative to ``ondemand-autoscale``
(the on-demand-only reference), deadline misses, lost GPU-hours and restarts, then a
per-policy summary and a check of the issue's target for the PPO policy (<= 0.5x the
on-demand-only cost, <= 1.1x its mean JCT, no more deadline misses than Uniform
Progress). The exact command is printed above the table.

Workloads (every job preemptible, i.e. allowed on spot; deadline = submit +
``--deadline-factor`` x duration + ``--deadline-slack`` seconds; arrivals rescaled to
``--load-factor`` of the fleet's maximum GPUs):

* ``philly``: the first N jobs of the bundled Philly 3-day window (days 40-43);
* ``openb``: the first N pods of the bundled Alibaba openb sample.

Periods (``--periods``, names from :data:`PERIODS`), each a GPU model on a real market:

* ``gcp-h100-2024-06``: H100-80GB, GCP us-central1, June 2024 (spot at 71% of on-demand),
  Spot Advisor hazard for reclaims (rare);
* ``gcp-h100-2025-03``: the same market in March 2025 (spot at 23%);
* ``aws-v100-2020``: V100-16GB on the 2020 AWS us-east-1 p3 spot market (spot ~30% of the
  $3.06 list price) with the 2020 *observed* spot lifetimes - reclaims every few hours, so
  checkpoints, restarts and lost work are exercised.

The spot experiment (``experiments/spot.yaml``) trains on other Philly windows (hours 0-1800
of the full trace, not days 40-43 ... which lie inside it: see BENCHMARKS.md for what that
means) and other price periods; March 2025 is a period it never trained on.

Run from the repository root::

    python benchmarks/cost_report.py                         # baselines only (~30 s)
    python benchmarks/cost_report.py --ppo models/spot        # + the trained policy
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from rlsched.cluster.shorthand import parse_cluster
from rlsched.policies import make_policy
from rlsched.scenario import apply_workload_options, build_market, load_jobs
from rlsched.sim import Engine
from rlsched.sim.engine import SimConfig
from rlsched.sim.metrics import Report
from rlsched.train import generalisation as G

REFERENCE = "ondemand-autoscale"
#: never put behind --baseline-rules: the reference, and a fleet provisioned for the peak by definition
ON_DEMAND_ONLY = (REFERENCE, "ondemand-static")
UNIFORM_PROGRESS = "uniform-progress"
POLICIES = ("ondemand-static", "ondemand-autoscale", "spot-greedy", "spot-fallback", "uniform-progress")
WORKLOADS = {
    "philly": "bundled:philly-3day.csv",
    "openb": "bundled:openb-default-1500.csv",
}


@dataclass(frozen=True)
class Period:
    """A GPU model on a real market at one point of its history."""

    gpu: str
    offset_s: float
    preemption: str
    about: str


PERIODS: dict[str, Period] = {
    "gcp-h100-2024-06": Period("H100-80GB", 0.0, "advisor", "GCP us-central1 June 2024, spot 71% of on-demand"),
    "gcp-h100-2025-03": Period("H100-80GB", 24_700_000.0, "advisor",
                               "GCP us-central1 March 2025, spot 23% of on-demand"),
    "aws-v100-2020": Period("V100-16GB", 0.0, "observed",
                            "AWS us-east-1 Dec 2019, spot ~30% of list, observed 2020 lifetimes"),
}

#: the issue's target for the learned policy
TARGET_COST, TARGET_JCT = 0.5, 1.1


@dataclass
class Row:
    period: str
    workload: str
    report: Report


def _policy(name: str, baseline_rules: str = "", model: Any = None) -> Any:
    """A fresh scheduler for a row: the model, a baseline behind the model's rules or its teacher
    (``model``, loaded once), or a plain baseline (behind ``--baseline-rules`` if given)."""
    if name.startswith("ppo:"):
        return model.scheduler(name)
    if name.endswith(G.RULED) or name.startswith(G.TEACHER):
        return G.competitor_scheduler(name, lambda: model)
    policy = make_policy(name)
    if baseline_rules and name not in ON_DEMAND_ONLY:
        from rlsched.policies.rules import RuledScheduler, build_rules

        return RuledScheduler(policy, build_rules({r: {} for r in baseline_rules.split(",")}))
    return policy


def same_rule_rows(model: Any, policies: list[str]) -> list[str]:
    """The rows issue 16 puts beside a model: each spot baseline behind the model's served rules
    (``NAME+rules``; not the on-demand-only ones, as in the family benchmark), and the teachers of
    :func:`~rlsched.train.generalisation.teacher_baselines` (``teacher:NAME+rules``)."""
    ruled = bool(model.rule_params)
    names = [p + G.RULED for p in policies if ruled and p not in ON_DEMAND_ONLY and not p.startswith("ppo:")]
    names += [G.TEACHER + t + (G.RULED if ruled else "") for t in G.teacher_baselines(model.card)]
    return names


def run(args: argparse.Namespace, model: Any = None) -> list[Row]:
    """Every (period, workload, policy) run, in that order; ``model`` is ``--ppo``'s, loaded."""
    rows: list[Row] = []
    # Every policy of a run replays with the PPO model's demand forecaster (as simulate does).
    forecast = model.forecast if model is not None else None
    for pname in args.periods:
        period = PERIODS[pname]
        pools = parse_cluster(args.cluster.format(gpu=period.gpu))
        market = build_market({"offset_s": period.offset_s, "preemption": period.preemption}, pools)
        for wl in args.workloads:
            raw, _ = load_jobs([{"path": WORKLOADS[wl], "max_jobs": args.jobs}], None)
            jobs = apply_workload_options(
                raw, pools, load_factor=args.load_factor, preemptible="all",
                deadline_factor=args.deadline_factor, deadline_slack_s=args.deadline_slack,
            )
            for name in args.policies:
                t0 = time.perf_counter()
                engine = Engine(pools, jobs, market, SimConfig(seed=args.seed),
                                forecaster=forecast.new() if forecast else None,
                                forecast_horizon_s=forecast.horizon_s if forecast else 3600.0)
                report = engine.run(_policy(name, args.baseline_rules, model))
                report.policy = name
                print(f"  {pname:18s} {wl:7s} {name:20s} {time.perf_counter() - t0:6.1f}s", file=sys.stderr)
                rows.append(Row(pname, wl, report))
    return rows


def _ratios(rows: list[Row]) -> dict[tuple[str, str, str], tuple[float, float]]:
    ref = {(r.period, r.workload): r.report for r in rows if r.report.policy == REFERENCE}
    out = {}
    for r in rows:
        base = ref[(r.period, r.workload)]
        out[(r.period, r.workload, r.report.policy)] = (
            r.report.cost_usd / base.cost_usd if base.cost_usd > 0 else float("nan"),
            r.report.mean_jct_s / base.mean_jct_s if base.mean_jct_s > 0 else float("nan"),
        )
    return out


def table(rows: list[Row]) -> str:
    """Markdown table; cost and JCT are relative to the reference of the same period and workload."""
    ratios = _ratios(rows)
    out = [
        "| period | workload | policy | cost (USD) | cost vs on-demand | mean JCT vs on-demand "
        "| deadline misses | lost GPU-h | restarts | spot share of cost |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rep = r.report
        cost_rel, jct_rel = ratios[(r.period, r.workload, rep.policy)]
        spot_share = rep.cost_spot_usd / rep.cost_usd if rep.cost_usd > 0 else 0.0
        name = f"**{rep.policy}**" if rep.policy.startswith("ppo:") else rep.policy
        out.append(
            f"| {r.period} | {r.workload} | {name} | {rep.cost_usd:,.0f} | {cost_rel:.2f} | {jct_rel:.2f} "
            f"| {rep.deadline_misses} | {rep.lost_gpu_hours:.1f} | {rep.restarts} | {spot_share:.0%} |"
        )
    return "\n".join(out)


def summary(rows: list[Row]) -> str:
    """Per policy: mean cost and JCT ratios over every (period, workload), total misses and lost work."""
    ratios = _ratios(rows)
    names = list(dict.fromkeys(r.report.policy for r in rows))
    out = ["| policy | mean cost vs on-demand | mean JCT vs on-demand | deadline misses (total) "
           "| lost GPU-h (total) | restarts (total) |", "|---|---:|---:|---:|---:|---:|"]
    for n in names:
        mine = [r for r in rows if r.report.policy == n]
        c = statistics.fmean(ratios[(r.period, r.workload, n)][0] for r in mine)
        j = statistics.fmean(ratios[(r.period, r.workload, n)][1] for r in mine)
        out.append(f"| {n} | {c:.2f} | {j:.2f} | {sum(r.report.deadline_misses for r in mine)} "
                   f"| {sum(r.report.lost_gpu_hours for r in mine):.1f} | {sum(r.report.restarts for r in mine)} |")
    return "\n".join(out)


def target_check(rows: list[Row], policy: str) -> str:
    """The issue's target, case by case, for one policy."""
    ratios = _ratios(rows)
    up = {(r.period, r.workload): r.report.deadline_misses for r in rows if r.report.policy == UNIFORM_PROGRESS}
    out = [f"| period | workload | cost <= {TARGET_COST} | JCT <= {TARGET_JCT} | misses <= uniform-progress | met |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        if r.report.policy != policy:
            continue
        c, j = ratios[(r.period, r.workload, policy)]
        m, ref = r.report.deadline_misses, up.get((r.period, r.workload))
        ok = (c <= TARGET_COST, j <= TARGET_JCT, ref is None or m <= ref)
        out.append(f"| {r.period} | {r.workload} | {c:.2f} {'yes' if ok[0] else 'no'} | {j:.2f} "
                   f"{'yes' if ok[1] else 'no'} | {m} vs {ref} {'yes' if ok[2] else 'no'} "
                   f"| {'**yes**' if all(ok) else 'no'} |")
    return "\n".join(out)


def baseline_check(rows: list[Row], policy: str) -> str:
    """Issue 16's spot target, case by case: against the best baseline (the cheapest of those with the
    fewest misses) no more deadline misses and lost GPU-hours, at a cost no higher than the cheapest
    baseline's. The baselines are every other row, the ones behind the model's rules and its teacher
    included - the picks of the family benchmark (:func:`rlsched.train.generalisation.summarise_spot`)."""
    out = ["| period | workload | cheapest baseline (cost vs on-demand) | policy cost vs cheapest "
           "| best baseline (misses, lost GPU-h) | policy misses | policy lost GPU-h | met |",
           "|---|---|---|---:|---|---:|---:|---|"]
    cases = list(dict.fromkeys((r.period, r.workload) for r in rows))
    for period, workload in cases:
        window = {(G.CANDIDATE if r.report.policy == policy else r.report.policy): {
            "cost_usd": r.report.cost_usd, "deadline_misses": float(r.report.deadline_misses),
            "lost_gpu_hours": r.report.lost_gpu_hours, "mean_jct_s": r.report.mean_jct_s,
        } for r in rows if (r.period, r.workload) == (period, workload)}
        if G.CANDIDATE not in window:
            continue
        s = G.summarise_spot({f"{period}/{workload}": window})
        if not s.get("windows"):
            continue
        mine = window[G.CANDIDATE]
        ok = (s["model_cost_vs_cheapest"] <= 1.0, s["model_misses"] <= s["best_misses"],
              mine["lost_gpu_hours"] <= s["best_lost_gpu_h"] + 1e-9)
        out.append(f"| {period} | {workload} | {s['cheapest']} ({s['cheapest_cost_vs_od']:.2f}) "
                   f"| {s['model_cost_vs_cheapest']:.3f} {'yes' if ok[0] else 'no'} "
                   f"| {s['best']} ({s['best_misses']}, {s['best_lost_gpu_h']:.1f}) "
                   f"| {s['model_misses']} {'yes' if ok[1] else 'no'} | {mine['lost_gpu_hours']:.1f} "
                   f"{'yes' if ok[2] else 'no'} | {'**yes**' if all(ok) else 'no'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000, help="jobs per workload (first N of the bundled sample)")
    ap.add_argument("--periods", default=",".join(PERIODS), help=f"comma-separated, of {','.join(PERIODS)}")
    ap.add_argument("--workloads", default="philly,openb", help=f"comma-separated, of {','.join(WORKLOADS)}")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policy names")
    ap.add_argument("--ppo", default=None, help="a trained model folder (or models:/ URI) to add as ppo:REF")
    ap.add_argument("--cluster", default="spot:0-8x8x{gpu},ondemand:0-8x8x{gpu}",
                    help="fleet; {gpu} is replaced by the period's GPU model")
    ap.add_argument("--deadline-factor", type=float, default=3.0, help="deadline = submit + X x duration + slack")
    ap.add_argument("--deadline-slack", type=float, default=3600.0, help="seconds added to every deadline")
    ap.add_argument("--load-factor", type=float, default=0.4,
                    help="rescale arrivals to this load of the fleet's maximum GPUs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-rules", default="",
                    help="comma-separated rules (e.g. consolidate) put in front of the spot baselines "
                         "(not the on-demand-only ones), with default parameters")
    args = ap.parse_args(argv)
    args.periods = [p for p in args.periods.split(",") if p]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.policies = [p for p in args.policies.split(",") if p]
    for kind, got, known in (("workloads", args.workloads, WORKLOADS), ("periods", args.periods, PERIODS)):
        unknown = [w for w in got if w not in known]
        if unknown:
            ap.error(f"unknown {kind} {unknown}; known: {sorted(known)}")
    if args.baseline_rules:
        from rlsched.policies.rules import build_rules

        try:
            build_rules({r: {} for r in args.baseline_rules.split(",")})
        except ValueError as exc:
            ap.error(f"--baseline-rules: {exc}")
    if REFERENCE not in args.policies:
        args.policies.insert(0, REFERENCE)
    model = None
    if args.ppo:
        from rlsched.errors import RlschedError
        from rlsched.learned.ppo import load_policy_ref
        from rlsched.train.registry import download_model

        try:
            model = load_policy_ref(args.ppo, fetch=download_model)
        except RlschedError as exc:
            print(f"error: --ppo {args.ppo}: {exc}", file=sys.stderr)
            return 2
        args.policies += same_rule_rows(model, args.policies)
        args.policies.append(f"ppo:{args.ppo}")
    cmd = "python benchmarks/cost_report.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    rows = run(args, model)
    print(f"Command: `{cmd.strip()}`\n")
    print(f"Fleet `{args.cluster}`, seed {args.seed}, {args.jobs} jobs per workload at load {args.load_factor:g}, "
          f"all preemptible; deadline = submit + {args.deadline_factor:g} x duration + {args.deadline_slack:g} s; "
          f"cost and JCT relative to {REFERENCE} (on-demand only). Periods: "
          + "; ".join(f"`{p}` = {PERIODS[p].gpu}, {PERIODS[p].about}" for p in args.periods) + "."
          + (f" The spot baselines run behind `{args.baseline_rules}` (default parameters)."
             if args.baseline_rules else "")
          + (f" `NAME+rules`: the baseline behind the rules `ppo:{args.ppo}` is served with "
             f"({', '.join(sorted(model.rule_params))})." if model is not None and model.rule_params else "")
          + "\n")
    print(table(rows))
    print("\nSummary over every period and workload (mean of the per-case ratios):\n")
    print(summary(rows))
    if args.ppo:
        print(f"\nTarget check for ppo:{args.ppo} (cost <= {TARGET_COST}x and JCT <= {TARGET_JCT}x on-demand-only, "
              "deadline misses <= uniform-progress):\n")
        print(target_check(rows, f"ppo:{args.ppo}"))
        print("\nAgainst the baselines (issue 16: no more deadline misses and lost GPU-hours than the best baseline - "
              "the cheapest of those with the fewest misses - at a cost <= the cheapest baseline's; every other row "
              "of the table is a baseline):\n")
        print(baseline_check(rows, f"ppo:{args.ppo}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
