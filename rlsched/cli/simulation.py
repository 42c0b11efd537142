"""One ``rlsched simulate`` run as a plain function: :class:`SimulationOptions` in, :class:`SimulationRun` out.

The command (``cli/simulate_cmd.py``) turns its flags into the options, calls
:func:`run_simulation` and renders the result; code and tests call the same
function without going through the command line. The steps: pick the scenario
(a trace on a cluster, declared pools, a scenario file or the bundled default),
shape its workload and market, set the world's knobs, build the policies and the
demand forecast they share, then replay the workload once per policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from rlsched.errors import ScenarioError

if TYPE_CHECKING:
    from rlsched.cluster.job import Job
    from rlsched.scenario import Scenario
    from rlsched.sim import SimConfig
    from rlsched.sim.metrics import Report

_err = Console(stderr=True)


@dataclass(frozen=True)
class SimulationOptions:
    """What to replay, on what, under which policies: the flags of ``rlsched simulate``.

    Attributes:
        trace: job trace (canonical CSV or Philly/openb/DLRM); goes with ``cluster`` or ``pools``.
        cluster: pools as ``[KIND:][MIN-]NODESxGPUSxMODEL[/mig=LAYOUT|/ts=N]``, comma-separated.
        pools: a pool spec (HCL) to simulate instead of ``cluster``.
        scenario: a scenario YAML; with none of trace, cluster and pools, the bundled default.
        policies: policy names, policy-spec YAMLs or ``ppo:MODEL``; empty = every heuristic.
        jobs_csv: per-job report (one file per policy, ``OUT-<policy>.csv``, when several run).
        load_factor: rescale arrivals to this offered load on the base capacity.
        max_jobs: replay only the first N jobs.
        seed: seed of the simulated world (default: the scenario's).
        prices: canonical prices CSV replacing the scenario's.
        spot_availability: canonical spot availability CSV replacing the scenario's.
        market_offset: seconds into the market series where the run starts.
        trace_format: trace format, ``auto`` to detect it.
        virtual_cluster: Philly: replay one virtual cluster.
        skip_bad_rows: count and skip malformed trace rows instead of failing.
        preemptible: who may use spot: ``trace`` (its column, the default), ``all``, ``none``.
        deadline_factor: every job's deadline = submit + X x duration (+ ``deadline_slack``).
        deadline_slack: seconds added to every ``deadline_factor`` deadline.
        preemption: spot lifetimes, ``advisor`` or ``observed`` (default: the scenario's).
        checkpoint_interval: seconds of work between checkpoints (default: the scenario's).
        oracle: let schedulers see true durations (an upper-bound reference only).
        horizon: stop this many seconds after the first arrival (default: the scenario's, else
            10 x the arrival span, at least span + 30 days).
        quiet: no progress bar or notes on stderr.
    """

    trace: Path | None = None
    cluster: str | None = None
    pools: Path | None = None
    scenario: Path | None = None
    policies: tuple[str, ...] = ()
    jobs_csv: Path | None = None
    load_factor: float | None = None
    max_jobs: int | None = None
    seed: int | None = None
    prices: Path | None = None
    spot_availability: Path | None = None
    market_offset: float | None = None
    trace_format: str = "auto"
    virtual_cluster: str | None = None
    skip_bad_rows: bool = False
    preemptible: str | None = None
    deadline_factor: float | None = None
    deadline_slack: float = 0.0
    preemption: str | None = None
    checkpoint_interval: float | None = None
    oracle: bool = False
    horizon: float | None = None
    quiet: bool = False


@dataclass
class SimulationRun:
    """The outcome of :func:`run_simulation`.

    Attributes:
        scenario: the scenario replayed (its market with the options' overrides).
        jobs: the workload as replayed (cut, rescaled, deadlines set).
        sim: the world's knobs as replayed.
        schedulers: the policies, in the order they ran.
        reports: one report per scheduler, in the same order.
        forecast: the demand forecast every policy saw (from a ``ppo:`` model folder), or None.
        job_times: per report, the (JCTs, queue waits) in seconds of its completed batch jobs: the
            samples behind the report's means and percentiles (the HTML report draws them).
    """

    scenario: Scenario
    jobs: list[Job]
    sim: SimConfig
    schedulers: list[Any]
    reports: list[Report]
    forecast: Any = None
    job_times: list[tuple[list[float], list[float]]] = field(default_factory=list)

    @property
    def title(self) -> str:
        """``NAME: N jobs on CLUSTER``, the heading of the comparison."""
        return f"{self.scenario.name}: {len(self.jobs):,} jobs on {self.cluster}"

    @property
    def cluster(self) -> str:
        """The replayed cluster in ``--cluster`` notation."""
        from rlsched.cluster.shorthand import format_cluster

        return format_cluster(self.scenario.pools)

    def to_json(self) -> dict[str, Any]:
        """The document ``rlsched simulate --json`` writes."""
        sc, forecast = self.scenario, self.forecast
        return {
            "trace": sc.source or sc.name,
            "scenario": sc.name,
            "cluster": self.cluster,
            "jobs": len(self.jobs),
            "seed": self.sim.seed,
            "forecast": ({"model": type(forecast.forecaster).__name__, "horizon_s": forecast.horizon_s,
                          "fitted_on": forecast.fitted_on} if forecast is not None else None),
            "results": [r.result() for r in self.reports],
        }


def run_simulation(opts: SimulationOptions) -> SimulationRun:
    """Replay the workload the options name once per policy and return the reports.

    Writes the per-job reports of ``opts.jobs_csv``; shows a progress bar and the shared
    forecast on stderr unless ``opts.quiet``.

    Raises:
        ScenarioError: options that contradict each other or are out of range, an empty workload,
            or a bad scenario, trace or policy spec.
    """
    from rlsched.policies import available
    from rlsched.scenario import apply_workload_options

    sc = _scenario(opts)
    jobs = apply_workload_options(sc.jobs, sc.pools, load_factor=opts.load_factor,
                                  preemptible=opts.preemptible or "trace", deadline_factor=opts.deadline_factor,
                                  max_jobs=opts.max_jobs, deadline_slack_s=opts.deadline_slack)
    _override_market(sc, opts)
    sim = _sim_config(sc.sim, jobs, opts)
    if not jobs:
        raise ScenarioError(f"{sc.source or sc.name}: the workload has no jobs")
    names = list(opts.policies) or list(available())
    schedulers = [build_policy(n) for n in names]
    forecast = _shared_forecast(names, schedulers, opts.quiet)
    reports, job_times = _replay(sc, jobs, sim, schedulers, forecast, opts)
    return SimulationRun(sc, jobs, sim, schedulers, reports, forecast, job_times)


def _scenario(opts: SimulationOptions) -> Scenario:
    """The scenario the options name: a trace on ``cluster`` or ``pools``, else a scenario file or the default."""
    from rlsched.scenario import Scenario, build_market, load_jobs, load_scenario

    cluster = opts.cluster
    declared = None
    if opts.pools is not None:
        if cluster is not None:
            raise ScenarioError("--pools and --cluster both name the cluster; use one")
        from rlsched.spec import load_spec, to_pool_specs

        declared = to_pool_specs(load_spec(opts.pools))
        cluster = str(opts.pools)
        if opts.trace is None and opts.scenario is None:
            raise ScenarioError("--pools needs --trace (the workload to replay on the declared pools)")
    if (opts.trace is None) != (cluster is None) and opts.scenario is None:
        raise ScenarioError("--trace and --cluster go together (or use --scenario, or neither for the default)")
    if opts.scenario is not None and (opts.trace is not None or cluster is not None):
        raise ScenarioError("--scenario already names a cluster and a workload; drop --trace/--cluster")
    if opts.trace is None or cluster is None:
        return load_scenario(opts.scenario)
    from rlsched.cluster.shorthand import parse_cluster

    pool_specs = declared if declared is not None else parse_cluster(cluster)
    entry: dict[str, Any] = {"path": str(opts.trace), "format": opts.trace_format,
                             "skip_bad_rows": opts.skip_bad_rows}
    if opts.virtual_cluster:
        entry["virtual_cluster"] = opts.virtual_cluster
    jobs, source = load_jobs([entry], None)
    return Scenario(name=opts.trace.name, pools=pool_specs, jobs=jobs, market=build_market("default", pool_specs),
                    source=source)


def _override_market(sc: Scenario, opts: SimulationOptions) -> None:
    """Replace the parts of the scenario's market that the options name; the rest is kept."""
    from rlsched.scenario import override_market

    if (opts.prices is None and opts.spot_availability is None and opts.market_offset is None
            and opts.preemption is None):
        return
    sc.market = override_market(sc.market, sc.pools, prices=str(opts.prices) if opts.prices else None,
                                availability=str(opts.spot_availability) if opts.spot_availability else None,
                                offset_s=opts.market_offset, preemption=opts.preemption)


def _sim_config(sim: SimConfig, jobs: list[Job], opts: SimulationOptions) -> SimConfig:
    """The scenario's world knobs with the options' seed, checkpoints, oracle and horizon."""
    if opts.seed is not None:
        sim = replace(sim, seed=opts.seed)
    if opts.checkpoint_interval is not None:
        if opts.checkpoint_interval < 0:
            raise ScenarioError("--checkpoint-interval must be >= 0")
        sim = replace(sim, checkpoint_interval_s=opts.checkpoint_interval)
    if opts.oracle:
        sim = replace(sim, oracle_durations=True)
    if opts.horizon is not None:
        if opts.horizon <= 0:
            raise ScenarioError("--horizon must be > 0 seconds")
        sim = replace(sim, horizon_s=opts.horizon)
    elif sim.horizon_s is None and jobs:
        # A guard for policies that never drain the queue (an untrained network): the
        # heuristics finish long before it.
        span = jobs[-1].submit_time - jobs[0].submit_time
        sim = replace(sim, horizon_s=max(10.0 * span, span + 30 * 86400.0))
    return sim


def _shared_forecast(names: list[str], schedulers: list[Any], quiet: bool) -> Any:
    """The demand forecast of the first ``ppo:`` policy trained with one (``forecaster.json``), or None.

    Every policy of the run then replays with a fresh copy of it, so the heuristics'
    forecast-aware autoscaling sees the same forecast as the network (a fair comparison).
    """
    if not any(n.startswith("ppo:") for n in names):
        return None
    from rlsched.learned.ppo import policy_forecast

    forecast = next((f for s in schedulers if (f := policy_forecast(s)) is not None), None)
    if forecast is not None and not quiet:
        _err.print(f"demand forecast: {type(forecast.forecaster).__name__} from the model folder "
                   f"(horizon {forecast.horizon_s:g} s), for every policy of this run")
    return forecast


def _replay(sc: Scenario, jobs: list[Job], sim: SimConfig, schedulers: list[Any], forecast: Any,
            opts: SimulationOptions) -> tuple[list[Report], list[tuple[list[float], list[float]]]]:
    """Run the workload once per scheduler, with a progress bar per policy; write the per-job reports.

    Returns each run's report and its (JCTs, waits) (see :attr:`SimulationRun.job_times`)."""
    from rlsched.sim import Engine

    reports = []
    job_times = []
    # The bar counts jobs that are done (completed, or ended unschedulable/skipped), not arrivals: a
    # policy that leaves the queue full must not show a full bar. Simulated time shows it moving.
    progress = Progress(
        TextColumn("[bold]{task.description:18s}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs done"),
        TextColumn("{task.fields[sim]}"), TimeElapsedColumn(), console=_err, disable=opts.quiet, transient=False,
    )
    with progress:
        for sched in schedulers:
            task = progress.add_task(sched.name, total=len(jobs), sim=sim_clock(0.0))
            engine = Engine(sc.pools, jobs, sc.market, sim, forecaster=forecast.new() if forecast else None,
                            forecast_horizon_s=forecast.horizon_s if forecast else 3600.0)

            def tick(done: int, total: int, sim_s: float, t: TaskID = task) -> None:
                progress.update(t, completed=done, sim=sim_clock(sim_s))

            reports.append(engine.run(sched, progress=tick))
            job_times.append(batch_times(engine))
            if opts.jobs_csv is not None:
                _write_jobs_csv(engine, opts.jobs_csv, sched.name, several=len(schedulers) > 1)
    return reports, job_times


def batch_times(engine: Any) -> tuple[list[float], list[float]]:
    """(JCTs, queue waits) in seconds of a finished run's completed batch jobs, as its report counts them."""
    from rlsched.cluster.job import JobKind

    batch = [r for r in engine.finished if r.job.kind is JobKind.BATCH]
    return ([r.finish_time - r.job.submit_time for r in batch if r.finish_time is not None],
            [r.queued_s for r in batch])


def _write_jobs_csv(engine: Any, jobs_csv: Path, policy: str, *, several: bool) -> None:
    """The per-job report of one policy: ``jobs_csv`` itself, or ``STEM-<policy>.csv`` beside it when several ran."""
    from rlsched.sim.job_report import write_job_report

    out = jobs_csv if not several else jobs_csv.with_name(
        f"{jobs_csv.stem}-{policy.replace(':', '_').replace('/', '_')}{jobs_csv.suffix or '.csv'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_job_report(engine, out)


def build_policy(policy: str) -> Any:
    """A scheduler from ``NAME``, ``ppo:MODEL`` or a policy file (YAML ``{policy: NAME, params: {...}}``)."""
    from rlsched.policies import make_policy

    if policy.startswith("ppo:"):
        from rlsched.learned.ppo import make_ppo_policy
        from rlsched.train.registry import download_model

        return make_ppo_policy(policy[4:], fetch=download_model)
    if policy.endswith((".yaml", ".yml")):
        path = Path(policy)
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
    return make_policy(policy)


def sim_clock(seconds: float) -> str:
    """Simulated time for the progress bar: ``sim 5.2 h`` up to two days, then ``sim 3.4 d``."""
    if seconds < 2 * 86400.0:
        return f"sim {seconds / 3600.0:.1f} h"
    return f"sim {seconds / 86400.0:.1f} d"
