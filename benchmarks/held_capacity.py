"""Where a policy's held elastic GPU-hours go: busy, idle on partly used nodes, on empty nodes, provisioning.

Elastic capacity is paid per node while held, so a policy's cost is its held GPU-hours
times the price; the work itself is only the busy part. This replays one case of the
cost report (``benchmarks/cost_report.py``: a period, a workload, a fleet, a load) under
each policy and integrates, between decision points, the state of every held node:
provisioning, ready and empty, ready and partly used, ready and full - split into the
GPU-hours held in each state and the GPU-hours busy. Prints one row per policy and pool
kind with the exact command. It is how node consolidation was found to be worth doing
(BENCHMARKS.md, "Node consolidation").

    python benchmarks/held_capacity.py --ppo models/spot
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cost_report as cr

from rlsched.cluster.model import ClusterState, NodeStatus
from rlsched.cluster.shorthand import parse_cluster
from rlsched.scenario import apply_workload_options, build_market, load_jobs
from rlsched.sim import Engine
from rlsched.sim.engine import SimConfig

STATES = ("provisioning", "empty", "partly used", "full")


class Probe:
    """Wraps a scheduler; integrates node states between the decision points it sees."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "policy")
        self._last: tuple[float, list[tuple[str, str, int, int]]] | None = None
        #: (pool kind, state) -> held GPU-hours; (pool kind, "busy") -> busy GPU-hours
        self.hours: dict[tuple[str, str], float] = {}

    def reset(self, state: ClusterState) -> None:
        self._last = None
        self.hours = {}
        self.inner.reset(state)

    def _sample(self, state: ClusterState) -> None:
        if self._last is not None:
            t0, nodes = self._last
            dt = (state.time - t0) / 3600.0
            for kind, st, size, busy in nodes:
                self.hours[(kind, st)] = self.hours.get((kind, st), 0.0) + size * dt
                self.hours[(kind, "busy")] = self.hours.get((kind, "busy"), 0.0) + busy * dt
        nodes = []
        for node in state.nodes.values():
            if node.status is NodeStatus.STOPPED:
                continue
            kind = state.pools[node.pool].spec.kind.value
            size = len(node.gpus)
            if node.status is NodeStatus.PROVISIONING:
                nodes.append((kind, "provisioning", size, 0))
                continue
            busy = size - node.free_whole
            nodes.append((kind, "empty" if busy == 0 else "full" if busy == size else "partly used", size, busy))
        self._last = (state.time, nodes)

    def decide(self, state: ClusterState) -> Iterator[Any]:
        self._sample(state)
        yield from self.inner.decide(state)
        self._sample(state)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--period", default="gcp-h100-2024-06", choices=list(cr.PERIODS))
    ap.add_argument("--workload", default="openb", choices=list(cr.WORKLOADS))
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--cluster", default="spot:0-8x8x{gpu},ondemand:0-8x8x{gpu}")
    ap.add_argument("--load-factor", type=float, default=0.4)
    ap.add_argument("--policies", default="spot-greedy", help="comma-separated policy names")
    ap.add_argument("--ppo", default=None, help="a trained model folder to add as ppo:REF")
    args = ap.parse_args(argv)
    names = [p for p in args.policies.split(",") if p] + ([f"ppo:{args.ppo}"] if args.ppo else [])
    period = cr.PERIODS[args.period]
    pools = parse_cluster(args.cluster.format(gpu=period.gpu))
    market = build_market({"offset_s": period.offset_s, "preemption": period.preemption}, pools)
    raw, _ = load_jobs([{"path": cr.WORKLOADS[args.workload], "max_jobs": args.jobs}], None)
    jobs = apply_workload_options(raw, pools, load_factor=args.load_factor, preemptible="all",
                                  deadline_factor=3.0, deadline_slack_s=3600.0)
    forecast = None
    if args.ppo:
        from rlsched.learned.ppo import policy_forecast

        forecast = policy_forecast(cr._policy(f"ppo:{args.ppo}"))
    work = sum(j.duration * j.num_gpus for j in jobs) / 3600.0
    print(f"{args.period}, {args.workload} ({len(jobs)} jobs, {work:,.0f} whole-GPU hours of work), "
          f"fleet `{args.cluster}`, load {args.load_factor:g}\n")
    print("| policy | pool kind | cost (USD) | held GPU-h | busy GPU-h | idle on partly used nodes | "
          "on empty nodes | provisioning |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        probe = Probe(cr._policy(name))
        engine = Engine(pools, jobs, market, SimConfig(seed=0), forecaster=forecast.new() if forecast else None,
                        forecast_horizon_s=forecast.horizon_s if forecast else 3600.0)
        report = engine.run(probe)
        for kind in sorted({k for k, _ in probe.hours}):
            h = {st: probe.hours.get((kind, st), 0.0) for st in (*STATES, "busy")}
            held = sum(h[st] for st in STATES)
            busy_partly = h["busy"] - h["full"]
            print(f"| {name} | {kind} | {report.cost_usd:,.0f} | {held:,.0f} | {h['busy']:,.0f} | "
                  f"{h['partly used'] - busy_partly:,.0f} | {h['empty']:,.0f} | {h['provisioning']:,.0f} |")
    args_text = "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    print(f"\nCommand: `python benchmarks/held_capacity.py{args_text}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
