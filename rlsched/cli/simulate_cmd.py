"""``rlsched simulate`` and ``rlsched policies``.

``rlsched simulate`` with no options replays the bundled default scenario under
every heuristic. ``--trace`` + ``--cluster`` (or ``--scenario FILE``) replay
other workloads on other fleets; the market is the bundled default unless
``--prices`` / ``--spot-availability`` give canonical CSVs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from rlsched.cli.app import app
from rlsched.cluster.model import PoolSpec
from rlsched.errors import ScenarioError
from rlsched.report.terminal import escape_control, output_console

_console = output_console()  # as wide as the terminal (COLUMNS); the comparison table fits it
_err = Console(stderr=True)


def build_policy(spec: str) -> Any:
    """A scheduler from ``NAME`` or a policy-spec YAML (``{policy: NAME, params: {...}}``)."""
    from rlsched.policies import make_policy

    if spec.startswith("ppo:"):
        from rlsched.policies.ppo import make_ppo_policy

        return make_ppo_policy(spec[4:])
    if spec.endswith((".yaml", ".yml")):
        path = Path(spec)
        if not path.exists():
            raise ScenarioError(f"{path}: policy spec not found")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ScenarioError(f"{path}: invalid YAML ({exc})") from None
        if not isinstance(data, dict) or "policy" not in data:
            raise ScenarioError(f"{path}: a policy spec needs a 'policy' key (and optional 'params')")
        unknown = set(data) - {"policy", "params", "name", "description"}
        if unknown:
            raise ScenarioError(f"{path}: unknown keys {sorted(unknown)}; known: policy, params, name, description")
        sched = make_policy(str(data["policy"]), **(data.get("params") or {}))
        if data.get("name"):
            sched.name = str(data["name"])
        return sched
    return make_policy(spec)


def sim_clock(seconds: float) -> str:
    """Simulated time for the progress bar: ``sim 5.2 h`` up to two days, then ``sim 3.4 d``."""
    if seconds < 2 * 86400.0:
        return f"sim {seconds / 3600.0:.1f} h"
    return f"sim {seconds / 86400.0:.1f} d"


def complete_policy(incomplete: str) -> list[str]:
    """Shell completion of --policy: the registered schedulers starting with what was typed."""
    from rlsched.policies import available

    return [name for name in available() if name.startswith(incomplete)]


@app.command("policies")
def policies_cmd() -> None:
    """List the schedulers selectable with --policy, with the parameters a NAME:KEY=VALUE string sets."""
    from rlsched.policies import available
    from rlsched.policies.base import parameters

    for name, summary in available().items():
        _console.print(f"[bold]{name:18s}[/] {summary}", highlight=False)
        params = parameters(name)
        if params:
            _console.print(" " * 19 + "parameters: " + ", ".join(f"{k}={v}" for k, v in params.items()),
                           highlight=False, markup=False)
    _console.print("\nSet parameters with --policy NAME:KEY=VALUE[,KEY=VALUE...] (a list as numbers joined by "
                   "'/'), e.g. --policy tiresias:thresholds=14400,promote_knob=2; values above are the defaults.",
                   highlight=False, markup=False)


@app.command("simulate")
def simulate(
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="Job trace (canonical CSV or Philly/openb/DLRM).")] = None,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", help="Pools: [KIND:][MIN-]NODESxGPUSxMODEL[/mig=LAYOUT|/ts=N], comma-separated.")] = None,
    pools: Annotated[Path | None, typer.Option(
        "--pools", help="Pool spec (HCL) to simulate instead of --cluster: the same file you plan and apply.")] = None,
    scenario: Annotated[Path | None, typer.Option(
        "--scenario", help="Scenario YAML (cluster + workload + market); default: the bundled one.")] = None,
    policy: Annotated[list[str] | None, typer.Option(
        "--policy", "-p", autocompletion=complete_policy,
        help="Policy name, policy-spec YAML, or ppo:MODEL_DIR / ppo:models:/NAME@ALIAS; "
        "repeat to compare. Default: every heuristic.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write a PNG of utilisation, queue, cost, nodes.")] = None,
    jobs_csv: Annotated[Path | None, typer.Option(
        "--jobs-csv", help="Per-job report (restarts, lost GPU-hours, deadline met); one file per policy "
        "(OUT-<policy>.csv) when several run.")] = None,
    load_factor: Annotated[float | None, typer.Option(
        "--load-factor", help="Rescale arrivals to this offered load on the base capacity.")] = None,
    max_jobs: Annotated[int | None, typer.Option("--max-jobs", help="Replay only the first N jobs.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the simulated world.")] = None,
    prices: Annotated[Path | None, typer.Option("--prices", help="Canonical prices CSV.")] = None,
    spot_availability: Annotated[Path | None, typer.Option(
        "--spot-availability", help="Canonical spot availability CSV.")] = None,
    market_offset: Annotated[float | None, typer.Option(
        "--market-offset", help="Seconds into the market series where the run starts (default: the "
        "scenario's, else 0).")] = None,
    trace_format: Annotated[str, typer.Option("--format", help="Trace format (auto-detected).")] = "auto",
    virtual_cluster: Annotated[str | None, typer.Option(
        "--virtual-cluster", help="Philly: replay one virtual cluster.")] = None,
    skip_bad_rows: Annotated[bool, typer.Option(
        "--skip-bad-rows", help="Count and skip malformed trace rows instead of failing.")] = False,
    preemptible: Annotated[str | None, typer.Option(
        "--preemptible", help="Who may use spot: trace (its column), all, none.")] = None,
    deadline_factor: Annotated[float | None, typer.Option(
        "--deadline-factor", help="Give every job deadline = submit + X x duration (+ --deadline-slack).")] = None,
    deadline_slack: Annotated[float, typer.Option(
        "--deadline-slack", help="Seconds added to every --deadline-factor deadline (provisioning, queueing).")] = 0.0,
    preemption: Annotated[str | None, typer.Option(
        "--preemption", help="Spot lifetimes: advisor (AWS Spot Advisor hazards, the default) or observed "
        "(the 2020 observed lifetimes: reclaims every few hours).")] = None,
    checkpoint_interval: Annotated[float | None, typer.Option(
        "--checkpoint-interval", help="Seconds of work between checkpoints (default 1800).")] = None,
    oracle: Annotated[bool, typer.Option(
        "--oracle-durations", help="Let schedulers see true durations (upper-bound reference only).")] = False,
    horizon: Annotated[float | None, typer.Option(
        "--horizon", help="Stop this many seconds after the first arrival; what is left is reported unfinished "
        "(default: 10 x the arrival span, at least span + 30 days).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or table.")] = False,
) -> None:
    """Replay a trace on a cluster under one or more policies and compare them."""
    from dataclasses import replace

    from rlsched.policies import available
    from rlsched.report.plots import plot_reports
    from rlsched.report.table import comparison_notes, comparison_table, fitted_columns
    from rlsched.scenario import (
        Scenario,
        apply_workload_options,
        build_market,
        load_jobs,
        load_scenario,
        override_market,
    )
    from rlsched.sim import Engine

    declared: list[PoolSpec] | None = None
    if pools is not None:
        if cluster is not None:
            raise ScenarioError("--pools and --cluster both name the cluster; use one")
        from rlsched.spec import load_spec, to_pool_specs

        declared = to_pool_specs(load_spec(pools))
        cluster = str(pools)
        if trace is None and scenario is None:
            raise ScenarioError("--pools needs --trace (the workload to replay on the declared pools)")
    if (trace is None) != (cluster is None) and scenario is None:
        raise ScenarioError("--trace and --cluster go together (or use --scenario, or neither for the default)")
    if scenario is not None and (trace is not None or cluster is not None):
        raise ScenarioError("--scenario already names a cluster and a workload; drop --trace/--cluster")
    if trace is not None and cluster is not None:
        from rlsched.cluster.spec import parse_cluster

        pool_specs = declared if declared is not None else parse_cluster(cluster)
        entry: dict[str, Any] = {"path": str(trace), "format": trace_format, "skip_bad_rows": skip_bad_rows}
        if virtual_cluster:
            entry["virtual_cluster"] = virtual_cluster
        jobs, source = load_jobs([entry], None)
        sc = Scenario(name=trace.name, pools=pool_specs, jobs=jobs, market=build_market("default", pool_specs),
                      source=source)
    else:
        sc = load_scenario(scenario)
    jobs = apply_workload_options(sc.jobs, sc.pools, load_factor=load_factor, preemptible=preemptible or "trace",
                                  deadline_factor=deadline_factor, max_jobs=max_jobs, deadline_slack_s=deadline_slack)
    if prices is not None or spot_availability is not None or market_offset is not None or preemption is not None:
        # Flags replace only what they name; the rest of a scenario's market is kept.
        sc.market = override_market(sc.market, sc.pools, prices=str(prices) if prices else None,
                                    availability=str(spot_availability) if spot_availability else None,
                                    offset_s=market_offset, preemption=preemption)
    sim = sc.sim
    if seed is not None:
        sim = replace(sim, seed=seed)
    if checkpoint_interval is not None:
        if checkpoint_interval < 0:
            raise ScenarioError("--checkpoint-interval must be >= 0")
        sim = replace(sim, checkpoint_interval_s=checkpoint_interval)
    if oracle:
        sim = replace(sim, oracle_durations=True)
    if horizon is not None:
        if horizon <= 0:
            raise ScenarioError("--horizon must be > 0 seconds")
        sim = replace(sim, horizon_s=horizon)
    elif sim.horizon_s is None and jobs:
        # A guard for policies that never drain the queue (an untrained network): the
        # heuristics finish long before it.
        span = jobs[-1].submit_time - jobs[0].submit_time
        sim = replace(sim, horizon_s=max(10.0 * span, span + 30 * 86400.0))
    if not jobs:
        raise ScenarioError(f"{sc.source or sc.name}: the workload has no jobs")
    names = policy or list(available())
    schedulers = [build_policy(n) for n in names]
    # A policy trained with a demand forecaster (forecaster.json in its model folder) reads the
    # forecast in its observation; every policy of this run then replays with a fresh copy of
    # it, so the heuristics' forecast-aware autoscaling sees the same forecast (a fair comparison).
    forecast: Any = None
    if any(n.startswith("ppo:") for n in names):
        from rlsched.policies.ppo import policy_forecast

        forecast = next((f for s in schedulers if (f := policy_forecast(s)) is not None), None)
        if forecast is not None and not quiet:
            _err.print(f"demand forecast: {type(forecast.forecaster).__name__} from the model folder "
                       f"(horizon {forecast.horizon_s:g} s), for every policy of this run")

    reports = []
    # The bar counts jobs that are done (completed, or ended unschedulable/skipped), not arrivals: a
    # policy that leaves the queue full must not show a full bar. Simulated time shows it moving.
    progress = Progress(
        TextColumn("[bold]{task.description:18s}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs done"),
        TextColumn("{task.fields[sim]}"), TimeElapsedColumn(), console=_err, disable=quiet, transient=False,
    )
    with progress:
        for sched in schedulers:
            task = progress.add_task(sched.name, total=len(jobs), sim=sim_clock(0.0))
            engine = Engine(sc.pools, jobs, sc.market, sim, forecaster=forecast.new() if forecast else None,
                            forecast_horizon_s=forecast.horizon_s if forecast else 3600.0)
            def tick(done: int, total: int, sim_s: float, t: TaskID = task) -> None:
                progress.update(t, completed=done, sim=sim_clock(sim_s))

            report = engine.run(sched, progress=tick)
            reports.append(report)
            if jobs_csv is not None:
                from rlsched.policies.spot import write_job_report

                out = jobs_csv if len(schedulers) == 1 else jobs_csv.with_name(
                    f"{jobs_csv.stem}-{sched.name.replace(':', '_').replace('/', '_')}{jobs_csv.suffix or '.csv'}")
                out.parent.mkdir(parents=True, exist_ok=True)
                write_job_report(engine, out)
    from rlsched.cluster.spec import format_cluster

    title = f"{sc.name}: {len(jobs):,} jobs on {format_cluster(sc.pools)}"
    if not quiet:
        from rich.markup import escape

        from rlsched.sim.metrics import HORIZON_REASON

        _, hidden = fitted_columns(reports, title, _console.width)
        _console.print(comparison_table(reports, title, width=_console.width))
        preempting = [s.name for s in schedulers if getattr(s, "preempt", False)]
        for note in comparison_notes(reports, hidden=hidden, preempting=preempting, total_jobs=len(jobs),
                                     preemptible_jobs=sum(1 for j in jobs if j.preemptible)):
            _console.print(f"[dim]{escape(note)}[/]")
        for r in reports:
            # jobs cut off by the horizon are the "unfinished" column (and its note), not unschedulable
            why = "; ".join(f"{n} {k}" for k, n in r.unschedulable_reasons.items() if k != HORIZON_REASON)
            if why:
                _console.print(f"[yellow]{escape(escape_control(f'{r.policy}: unschedulable: {why}'))}[/]")
            if r.loop_handovers:
                _console.print(f"[yellow]{escape(escape_control(r.policy))}: {r.loop_handovers} decision points "
                               "handed to weighted-priority (a decision loop without progress)[/]")
    if json_out is not None:
        doc = {
            "trace": sc.source or sc.name,
            "scenario": sc.name,
            "cluster": format_cluster(sc.pools),
            "jobs": len(jobs),
            "seed": sim.seed,
            "forecast": ({"model": type(forecast.forecaster).__name__, "horizon_s": forecast.horizon_s,
                          "fitted_on": forecast.fitted_on} if forecast is not None else None),
            "results": [r.result() for r in reports],
        }
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
        if not quiet:
            _console.print(f"wrote {json_out}")
    if plot is not None:
        plot_reports(reports, plot, title)
        if not quiet:
            _console.print(f"wrote {plot}")
