"""The Grafana dashboard of the scheduler service, generated with grafanalib from its Prometheus metrics.

``python -m rlsched.service.grafana`` writes ``dashboards/rlsched.json`` (``--out`` elsewhere, ``--check`` to
fail when the file differs from what the generator makes). The dashboard reads a Prometheus data source
chosen when it is imported (the ``datasource`` variable) that scrapes ``/metrics`` (README, Serve:
Prometheus). Rows: utilisation per pool and MIG profile; queue length and wait percentiles; decisions,
fallbacks and the circuit breaker; nodes held and cost rate.

Every query names only families :class:`~rlsched.service.metrics.ServiceMetrics` and
:class:`~rlsched.service.board.BoardCollector` export (``tests/service/test_ui_grafana.py`` checks it).
Needs the ``dashboards`` extra (``pip install -e '.[dashboards]'``); the service itself does not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: Where the generated dashboard is checked in, relative to the repository root.
DEFAULT_OUT = Path("dashboards") / "rlsched.json"
#: The data source every panel reads (a dashboard variable, picked at import).
DATASOURCE = "${datasource}"
WIDTH = 24


def _panel(kind: str, title: str, exprs: list[tuple[str, str]], at: tuple[int, int, int], unit: str = "short",
           description: str = "") -> Any:
    """A time-series or stat panel at ``at`` = (x, y, width), 8 rows high."""
    from grafanalib.core import GridPos, Stat, Target, TimeSeries

    targets = [Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + i), datasource=DATASOURCE)
               for i, (expr, legend) in enumerate(exprs)]
    x, y, w = at
    pos = GridPos(h=8, w=w, x=x, y=y)
    if kind == "stat":
        return Stat(title=title, dataSource=DATASOURCE, targets=targets, gridPos=pos, format=unit,
                    description=description, reduceCalc="lastNotNull")
    return TimeSeries(title=title, dataSource=DATASOURCE, targets=targets, gridPos=pos, unit=unit,
                      description=description)


def _row(title: str, y: int) -> Any:
    from grafanalib.core import GridPos, RowPanel

    return RowPanel(title=title, gridPos=GridPos(h=1, w=WIDTH, x=0, y=y))


def build_dashboard() -> Any:
    """The grafanalib ``Dashboard`` (panel ids assigned)."""
    from grafanalib.core import Dashboard, Template, Templating, Time

    wait = "sum by (le) (rate(rlsched_job_wait_seconds_bucket[$__rate_interval]))"
    latency = "sum by (le) (rate(rlsched_decision_latency_seconds_bucket[$__rate_interval]))"
    panels = [
        _row("Utilisation", 0),
        _panel("timeseries", "GPUs allocated per pool", [
            ("sum by (pool) (rlsched_allocated_gpus) / clamp_min(sum by (pool) (rlsched_pool_gpus), 1)", "{{pool}}")],
            (0, 1, 12), unit="percentunit", description="Whole GPUs allocated to jobs over the GPUs the pool has."),
        _panel("timeseries", "MIG instances allocated per pool and profile", [
            ("sum by (pool, profile) (rlsched_allocated_mig_slices)", "{{pool}} {{profile}}")],
            (12, 1, 12), description="MIG instances held by jobs."),
        _panel("timeseries", "GPU utilisation (telemetry)", [
            ("avg(rlsched_gpu_utilization_percent)", "mean"), ("max(rlsched_gpu_utilization_percent)", "max")],
            (0, 9, 12), unit="percent"),
        _panel("stat", "Unhealthy GPUs", [("rlsched_unhealthy_gpus", "unhealthy")], (12, 9, 6)),
        _panel("stat", "Pool GPUs", [("sum(rlsched_pool_gpus)", "GPUs")], (18, 9, 6)),
        _row("Queue", 17),
        _panel("timeseries", "Queue length and running jobs", [
            ("rlsched_queue_length", "queued"), ("rlsched_running_jobs", "running")], (0, 18, 12)),
        _panel("timeseries", "Queue wait percentiles", [
            (f"histogram_quantile(0.5, {wait})", "p50"), (f"histogram_quantile(0.9, {wait})", "p90"),
            (f"histogram_quantile(0.99, {wait})", "p99")], (12, 18, 12), unit="s",
            description="Submission to first start, over jobs that started in the window."),
        _panel("timeseries", "Submissions by outcome", [
            ("sum by (outcome) (rate(rlsched_submissions_total[$__rate_interval]))", "{{outcome}}")], (0, 26, 12),
            unit="reqps"),
        _panel("timeseries", "Jobs per state", [("sum by (state) (rlsched_jobs)", "{{state}}")], (12, 26, 12)),
        _row("Decisions", 34),
        _panel("timeseries", "Decisions by source", [
            ("sum by (policy) (rate(rlsched_decisions_total[$__rate_interval]))", "{{policy}}")], (0, 35, 8),
            unit="ops"),
        _panel("timeseries", "Fallbacks by reason", [
            ("sum by (reason) (rate(rlsched_fallbacks_total[$__rate_interval]))", "{{reason}}"),
            ("sum(rate(rlsched_refused_actions_total[$__rate_interval]))", "refused actions")], (8, 35, 8),
            unit="ops"),
        _panel("timeseries", "Decision latency and circuit breaker", [
            (f"histogram_quantile(0.99, {latency})", "p99 latency"), ("rlsched_breaker_open", "breaker open")],
            (16, 35, 8), unit="s"),
        _row("Capacity and cost", 43),
        _panel("timeseries", "Cost rate per pool", [
            ("sum by (pool) (rlsched_cost_rate_usd_per_hour)", "{{pool}}")], (0, 44, 12), unit="currencyUSD",
            description="USD per hour of the nodes each pool holds."),
        _panel("timeseries", "Nodes held by capacity kind", [
            ("sum by (kind) (rlsched_nodes_held)", "{{kind}}")], (12, 44, 6)),
        _panel("stat", "Cost since the service started", [("rlsched_cost_usd_total", "USD")], (18, 44, 6),
               unit="currencyUSD"),
    ]
    datasource = Template(name="datasource", query="prometheus", type="datasource", label="Prometheus",
                          default="Prometheus")
    return Dashboard(title="rlsched scheduler service", uid="rlsched-service", tags=["rlsched", "gpu"],
                     description="Generated by python -m rlsched.service.grafana; do not edit by hand.",
                     time=Time("now-6h", "now"), refresh="30s", timezone="utc",
                     templating=Templating(list=[datasource]), panels=panels).auto_panel_ids()


def dashboard_json() -> str:
    """The dashboard as the checked-in file's text (sorted keys, 2-space indent, final newline)."""
    from grafanalib._gen import DashboardEncoder

    data = json.loads(json.dumps(build_dashboard().to_json_data(), cls=DashboardEncoder))
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def panel_queries(data: dict[str, Any]) -> list[str]:
    """Every Prometheus expression of a dashboard's panels (rows included)."""
    out: list[str] = []
    for panel in data.get("panels", []):
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append(str(target["expr"]))
        for inner in panel.get("panels", []):
            out.extend(str(t["expr"]) for t in inner.get("targets", []) if t.get("expr"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlsched.service.grafana", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where to write it (default {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs from the generated dashboard")
    args = parser.parse_args(argv)
    text = dashboard_json()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date; regenerate with python -m rlsched.service.grafana", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
