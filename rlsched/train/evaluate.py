"""Evaluate a policy against every heuristic on evaluation worlds, with simulate's metrics."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rlsched.policies import available, make_policy
from rlsched.sim import Engine, Report
from rlsched.train.worlds import World
from rlsched.workload.forecast import fresh_forecaster

#: the on-demand-only baseline that spot economics are measured against (issue 6)
ONDEMAND_REFERENCE = "ondemand-autoscale"
#: Metrics averaged over worlds in the summary (lower is better except utilisation).
SUMMARY_METRICS = ("mean_jct_s", "p95_jct_s", "mean_wait_s", "cost_usd", "gpu_utilization", "deadline_misses",
                   "lost_gpu_hours", "jobs_completed", "jobs_unschedulable")


def _horizon(world: World) -> float:
    jobs = world.scenario.jobs
    span = jobs[-1].submit_time - jobs[0].submit_time if jobs else 0.0
    return max(10.0 * span, span + 30 * 86400.0)


#: A reference, not a competitor: SJF told every job's TRUE duration. No real scheduler has that
#: information, so it bounds what ordering alone can gain on a world (how much headroom is left
#: over the weighted-priority baseline); it is reported beside the heuristics, never ranked as one.
ORACLE_BOUND = "sjf-oracle-bound"


def is_reference(name: str) -> bool:
    """True for rows that are bounds rather than schedulers (excluded from "who beats whom")."""
    return name == ORACLE_BOUND


def run_world(world: World, scheduler: Any, *, oracle_durations: bool = False) -> Report:
    """Replay one world under one scheduler (with a horizon guard for untrained policies)."""
    sc = world.scenario
    # A fresh copy per replay: a forecaster learns online, and every policy must start from the same one.
    fc = fresh_forecaster(world.forecaster) if world.forecaster is not None else None
    sim = replace(sc.sim, horizon_s=_horizon(world))
    if oracle_durations:
        sim = replace(sim, oracle_durations=True)
    engine = Engine(sc.pools, sc.jobs, sc.market, sim, forecaster=fc, forecast_horizon_s=world.forecast_horizon_s)
    return engine.run(scheduler)


def evaluate(
    worlds: Sequence[World],
    policy_factory: Callable[[], Any] | None,
    *,
    heuristics: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    bound: bool = False,
    extra: Sequence[Callable[[], Any]] = (),
) -> dict[str, Any]:
    """Run the policy (if any) and every heuristic on every world.

    ``extra`` builds further competitors (e.g. the behaviour-cloning teacher) per world.
    With ``bound``, each world also gets an :data:`ORACLE_BOUND` row (SJF on true durations).

    Returns:
        ``{"worlds": {label: {policy: result}}, "summary": {policy: {metric: mean over worlds}},
        "relative": {policy: {"jct_vs_weighted_priority": ratio, "cost_vs_weighted_priority": ratio}}}``
    """
    names = list(heuristics) if heuristics is not None else list(available())
    per_world: dict[str, dict[str, dict[str, float]]] = {}
    for world in worlds:
        row: dict[str, dict[str, float]] = {}
        scheds: list[Any] = [make_policy(n) for n in names] + [f() for f in extra]
        if policy_factory is not None:
            scheds.insert(0, policy_factory())
        for sched in scheds:
            if progress is not None:
                progress(f"{world.label}: {sched.name}")
            rep = run_world(world, sched)
            row[sched.name] = rep.result()
        if bound:
            if progress is not None:
                progress(f"{world.label}: {ORACLE_BOUND}")
            row[ORACLE_BOUND] = run_world(world, make_policy("sjf"), oracle_durations=True).result()
        per_world[world.label] = row
    return summarise_worlds(per_world)


def summarise_worlds(per_world: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """:func:`evaluate`'s result from its per-world rows ``{label: {policy: result}}`` (also for rows
    replayed elsewhere, e.g. as Ray tasks)."""
    policies = list(next(iter(per_world.values())).keys()) if per_world else []
    summary = {
        p: {m: statistics.fmean(per_world[w][p][m] for w in per_world) for m in SUMMARY_METRICS}
        for p in policies
    }
    relative: dict[str, dict[str, float]] = {}
    wp = summary.get("weighted-priority")
    if wp:
        for p, s in summary.items():
            relative[p] = {
                "jct_vs_weighted_priority": s["mean_jct_s"] / wp["mean_jct_s"] if wp["mean_jct_s"] else float("nan"),
                # NaN, not a ratio, when weighted-priority paid nothing (on-prem only): there is no ratio.
                "cost_vs_weighted_priority": s["cost_usd"] / wp["cost_usd"] if wp["cost_usd"] else float("nan"),
            }
    if ONDEMAND_REFERENCE in summary and any(w[ONDEMAND_REFERENCE]["cost_usd"] > 0 for w in per_world.values()):
        # Spot economics compare against on-demand-only capacity world by world: the mean of the
        # per-world ratios, so a cheap world counts as much as an expensive one. (An on-prem-only
        # evaluation, where nothing is bought, has no such comparison.)
        for p in policies:
            jr, cr = [], []
            for w in per_world.values():
                ref, mine = w[ONDEMAND_REFERENCE], w[p]
                if ref["mean_jct_s"] > 0:
                    jr.append(mine["mean_jct_s"] / ref["mean_jct_s"])
                if ref["cost_usd"] > 0:
                    cr.append(mine["cost_usd"] / ref["cost_usd"])
            relative.setdefault(p, {}).update({
                "jct_vs_ondemand": statistics.fmean(jr) if jr else float("nan"),
                "cost_vs_ondemand": statistics.fmean(cr) if cr else float("nan"),
            })
    return {"worlds": per_world, "summary": summary, "relative": relative}


def ratio_text(value: float | None) -> str:
    """A ratio with three decimals, or ``-`` where there is none (a zero or missing reference)."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.3f}"


def comparison_markdown(result: dict[str, Any], title: str) -> str:
    """The summary as a markdown table (model cards, MLflow artifacts, the terminal).

    With the on-demand-only baseline among the policies, the table also gives the
    spot-economics columns: mean per-world JCT and cost relative to it, deadline misses
    and lost GPU-hours (means over the worlds).
    """
    rel = result.get("relative", {})
    spot = any("cost_vs_ondemand" in r for r in rel.values())
    head = ("| policy | mean JCT h | p95 JCT h | mean wait h | cost USD | GPU util | JCT vs WP | cost vs WP | "
            "completed | unfinished |")
    sep = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    if spot:
        head += " JCT vs on-demand | cost vs on-demand | deadline misses | lost GPU-h |"
        sep += "---:|---:|---:|---:|"
    lines = [f"### {title}", "", head, sep]
    for p, s in sorted(result["summary"].items(), key=lambda kv: kv[1]["mean_jct_s"]):
        r = rel.get(p, {})
        label = f"{p} (reference: true durations)" if is_reference(p) else p
        line = (
            f"| {label} | {s['mean_jct_s'] / 3600:.2f} | {s['p95_jct_s'] / 3600:.2f} | {s['mean_wait_s'] / 3600:.2f} | "
            f"{s['cost_usd']:,.0f} | {s['gpu_utilization']:.1%} | "
            f"{ratio_text(r.get('jct_vs_weighted_priority'))} | "
            f"{ratio_text(r.get('cost_vs_weighted_priority'))} | {s['jobs_completed']:.0f} | "
            f"{s['jobs_unschedulable']:.0f} |"
        )
        if spot:
            line += (f" {ratio_text(r.get('jct_vs_ondemand'))} | {ratio_text(r.get('cost_vs_ondemand'))} | "
                     f"{s['deadline_misses']:.1f} | {s['lost_gpu_hours']:.1f} |")
        lines.append(line)
    return "\n".join(lines) + "\n"
