"""``rlsched simulate`` and ``rlsched policies``.

``rlsched simulate`` with no options replays the bundled default scenario under
every heuristic. ``--trace`` + ``--cluster`` (or ``--scenario FILE``) replay
other workloads on other fleets; the market is the bundled default unless
``--prices`` / ``--spot-availability`` give canonical CSVs. The run itself is
:func:`rlsched.cli.simulation.run_simulation`; this module turns flags into its
options and renders what it returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlsched.cli.app import app
from rlsched.report.terminal import escape_control, output_console

if TYPE_CHECKING:
    from rlsched.cli.simulation import SimulationRun

_console = output_console()  # as wide as the terminal (COLUMNS); the comparison table fits it


def complete_policy(incomplete: str) -> list[str]:
    """Shell completion of --policy: the registered schedulers starting with what was typed."""
    from rlsched.policies import available

    return [name for name in available() if name.startswith(incomplete)]


@app.command("policies")
def policies_cmd() -> None:
    """List the schedulers selectable with --policy, with the parameters a NAME:KEY=VALUE string sets."""
    from rlsched.policies import available
    from rlsched.policies.registry import parameters

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
    html_out: Annotated[Path | None, typer.Option(
        "--html", help="Write one self-contained HTML report (JCT and wait distributions, utilisation, nodes "
        "held, cost per policy; inline SVG, no external files).")] = None,
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
    from rlsched.cli.simulation import SimulationOptions, run_simulation

    run = run_simulation(SimulationOptions(
        trace=trace, cluster=cluster, pools=pools, scenario=scenario, policies=tuple(policy or ()),
        jobs_csv=jobs_csv, load_factor=load_factor, max_jobs=max_jobs, seed=seed, prices=prices,
        spot_availability=spot_availability, market_offset=market_offset, trace_format=trace_format,
        virtual_cluster=virtual_cluster, skip_bad_rows=skip_bad_rows, preemptible=preemptible,
        deadline_factor=deadline_factor, deadline_slack=deadline_slack, preemption=preemption,
        checkpoint_interval=checkpoint_interval, oracle=oracle, horizon=horizon, quiet=quiet))
    if not quiet:
        _print_comparison(run)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(run.to_json(), indent=2) + "\n")
        if not quiet:
            _console.print(f"wrote {json_out}")
    if plot is not None:
        from rlsched.report.plots import plot_reports

        plot_reports(run.reports, plot, run.title)
        if not quiet:
            _console.print(f"wrote {plot}")
    if html_out is not None:
        from rlsched.report.html import write_html_report

        write_html_report(run.reports, run.job_times, html_out, run.title)
        if not quiet:
            _console.print(f"wrote {html_out}")


def _print_comparison(run: SimulationRun) -> None:
    """The comparison table, its notes, and each policy's unschedulable jobs and loop handovers."""
    from rich.markup import escape

    from rlsched.report.table import comparison_notes, comparison_table, fitted_columns
    from rlsched.sim.metrics import HORIZON_REASON

    reports, jobs = run.reports, run.jobs
    _, hidden = fitted_columns(reports, run.title, _console.width)
    _console.print(comparison_table(reports, run.title, width=_console.width))
    preempting = [s.name for s in run.schedulers if getattr(s, "preempt", False)]
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
