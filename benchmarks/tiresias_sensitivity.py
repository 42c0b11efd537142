"""How much Tiresias' queue thresholds and starvation knob matter, across many Philly windows.

Cuts the Philly 2017 job table into ``--windows`` windows of ``--length-h`` hours spread
evenly over the trace, rescales each to every offered load in ``--loads`` on one fleet
(``--cluster``), declares every job preemptible (Tiresias preempts only preemptible
jobs; Philly's table declares none), and replays each (window, load) case under every
variant. A variant is a policy string ``NAME[:KEY=VALUE,...]`` as ``--policy`` takes it
(:func:`rlsched.policies.registry.parse_policy_string`; ``thresholds`` written ``3250/7200``,
GPU-seconds), e.g. ``tiresias:thresholds=14400,promote_knob=2``. Prints, per variant, the mean over cases
of its mean JCT divided by the baseline's (``--baseline``, weighted-priority) - the
mean of ratios - the same per load, the worst and best case, preemptions per case and
replay time; then every case's ratio (``--per-window``)::

    python benchmarks/tiresias_sensitivity.py                      # defaults: 8 windows x 3 loads
    python benchmarks/tiresias_sensitivity.py --start-hours 1900,2150,2400 --loads 1.0,1.25  # chosen windows
    python benchmarks/tiresias_sensitivity.py --timing --repeat 3  # replay time vs FIFO (10k Philly jobs)

``--timing`` instead replays the first ``--timing-jobs`` Philly jobs (declared
preemptible) on 32 x 8 V100 under FIFO and default Tiresias, interleaved ``--repeat``
times, and prints each run's wall and CPU time, the medians and their ratios (CPU time is
the process's own, so it is the fairer measure on a machine shared with other work).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PHILLY = ROOT.parent / "shared" / "data" / "philly-2017" / "philly_jobs.csv"
DEFAULT_VARIANTS = (
    "tiresias",                                # the simulator's defaults: 3250/7200 GPU-s, no promotion
    "tiresias:thresholds=3600",                # two queues split at one GPU-hour
    "tiresias:thresholds=3600/36000",          # rlsched's thresholds before this benchmark
    "tiresias:thresholds=14400",               # two queues split at four GPU-hours
    "tiresias:thresholds=1800/7200/28800",     # four queues
    "tiresias:promote_knob=2",
    "tiresias:promote_knob=8",
    "tiresias:preempt=0",                      # the order alone
    "fifo",
    "sjf:oracle=1",                            # told true durations: a reference, not a scheduler
)


def cases(trace_path: str, windows: int, length_h: float, loads: list[float], cluster: str,
          start_hours: list[float] | None = None) -> list[tuple[str, float, list[Any]]]:
    """``(label, load, jobs)`` per (window, load), every job preemptible.

    Windows are spread evenly over Philly, or start at ``start_hours`` (hours after the
    trace's first submission) when given.
    """
    from rlsched.cluster import parse_cluster
    from rlsched.scenario import base_capacity
    from rlsched.workload import load_trace
    from rlsched.workload.windows import scale_to_load, split_windows

    trace = load_trace(trace_path)
    cap = base_capacity(parse_cluster(cluster))
    if start_hours:
        from rlsched.workload.windows import window

        picked_at = [(f"h{h:g}", window(trace, trace.start + h * 3600.0, trace.start + (h + length_h) * 3600.0))
                     for h in start_hours]
        return [(label, load, scale_to_load(type(w)([replace(j, preemptible=True) for j in w.jobs],
                                                    source=w.source), cap, load).jobs)
                for label, w in picked_at for load in loads]
    every = split_windows(trace, length_h * 3600.0)
    every = [w for w in every if len(w.jobs) >= 20]
    if len(every) < windows:
        raise ValueError(f"only {len(every)} windows of {length_h:g} h with >= 20 jobs; ask for fewer")
    step = len(every) / windows
    picked = [(int(k * step), every[int(k * step)]) for k in range(windows)]
    out = []
    for idx, w in picked:
        jobs = [replace(j, preemptible=True) for j in w.jobs]
        for load in loads:
            scaled = scale_to_load(type(w)(jobs, source=w.source), cap, load).jobs
            out.append((f"w{idx:02d}", load, scaled))
    return out


def replay(cluster: str, jobs: list[Any], variant: str) -> tuple[float, int, float, float]:
    """``(mean JCT s, preemptions, wall s, CPU s)`` of one replay (CPU: this process's, immune to other load)."""
    from rlsched.cluster import parse_cluster
    from rlsched.policies import make_policy
    from rlsched.sim import Engine

    t0, c0 = time.perf_counter(), time.process_time()
    report = Engine(parse_cluster(cluster), jobs).run(make_policy(variant))
    return report.mean_jct_s, report.preemptions, time.perf_counter() - t0, time.process_time() - c0


def sensitivity(args: argparse.Namespace) -> None:
    loads = [float(x) for x in args.loads.split(",")]
    variants = [args.baseline] + [v for v in (args.variants.split(";") if args.variants else DEFAULT_VARIANTS)
                                  if v != args.baseline]
    from rlsched.policies import make_policy

    for v in variants:
        make_policy(v)  # a bad variant fails here, before any replay
    starts = [float(x) for x in args.start_hours.split(",")] if args.start_hours else None
    runs = cases(args.trace, args.windows, args.length_h, loads, args.cluster, starts)
    ratio: dict[str, list[float]] = {v: [] for v in variants}
    preempt: dict[str, list[int]] = {v: [] for v in variants}
    wall: dict[str, float] = dict.fromkeys(variants, 0.0)
    rows = []
    t0 = time.perf_counter()
    for label, load, jobs in runs:
        base = None
        row = [label, f"{load:g}", f"{len(jobs)}"]
        for v in variants:
            jct, pre, w, _ = replay(args.cluster, jobs, v)
            base = jct if base is None else base
            ratio[v].append(jct / base)
            preempt[v].append(pre)
            wall[v] += w
            row.append(f"{jct / base:.3f}")
        row.insert(3, f"{base / 3600:.2f}")
        rows.append(row)
        print(f"  {label} load {load:g}: {len(jobs)} jobs, {args.baseline} {base / 3600:.2f} h", file=sys.stderr)
    print(f"\n`python benchmarks/tiresias_sensitivity.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`: "
          f"{len(runs)} cases ({len(starts) if starts else args.windows} windows of {args.length_h:g} h x loads "
          f"{args.loads}) on "
          f"{args.cluster}, every job preemptible; mean JCT / {args.baseline}'s, {time.perf_counter() - t0:.0f} s\n")
    head = ["variant", "mean of ratios"] + [f"load {x:g}" for x in loads] + ["min", "max", "preemptions / case",
                                                                            "replay s / case"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    n_load = len(loads)
    for v in variants:
        r = ratio[v]
        per_load = [statistics.mean(r[i::n_load]) for i in range(n_load)]
        cells = [f"`{v}`", f"{statistics.mean(r):.3f}"] + [f"{x:.3f}" for x in per_load] + [
            f"{min(r):.3f}", f"{max(r):.3f}", f"{statistics.mean(preempt[v]):,.0f}", f"{wall[v] / len(r):.2f}"]
        print("| " + " | ".join(cells) + " |")
    if args.per_window:
        head = ["window", "load", "jobs", f"{args.baseline} mean JCT h"] + [f"`{v}`" for v in variants[1:]]
        print("\n| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row[:4] + row[5:]) + " |")


def timing(args: argparse.Namespace) -> None:
    from rlsched.workload import load_trace

    jobs = [replace(j, preemptible=True) for j in load_trace(args.trace).jobs[: args.timing_jobs]]
    cluster = "32x8xV100-16GB"
    walls: dict[str, list[float]] = {"fifo": [], "tiresias": []}
    cpus: dict[str, list[float]] = {"fifo": [], "tiresias": []}
    for k in range(args.repeat):
        for v in walls:
            jct, pre, w, c = replay(cluster, jobs, v)
            walls[v].append(w)
            cpus[v].append(c)
            print(f"  run {k + 1}: {v:9s} wall {w:6.2f} s  CPU {c:6.2f} s  mean JCT {jct / 3600:8.2f} h  "
                  f"preemptions {pre:,}", file=sys.stderr)
    med = {v: statistics.median(w) for v, w in walls.items()}
    med_cpu = {v: statistics.median(c) for v, c in cpus.items()}
    print(f"\n`python benchmarks/tiresias_sensitivity.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`: "
          f"first {len(jobs):,} jobs of {Path(args.trace).name}, every job preemptible, {cluster}\n")
    print("| policy | wall s per run | median wall s | CPU s per run | median CPU s |")
    print("|---|---|---|---|---|")
    for v in walls:
        print(f"| {v} | {', '.join(f'{x:.2f}' for x in walls[v])} | {med[v]:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in cpus[v])} | {med_cpu[v]:.2f} |")
    print(f"\nTiresias / FIFO: median wall time {med['tiresias'] / med['fifo']:.2f}x, "
          f"median CPU time {med_cpu['tiresias'] / med_cpu['fifo']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(PHILLY), help="job trace (default: the shared Philly 2017 job table)")
    ap.add_argument("--windows", type=int, default=8, help="windows spread over the trace (default 8)")
    ap.add_argument("--start-hours", default="", help="window starts in hours after the trace start, comma-separated "
                    "(instead of --windows spread evenly)")
    ap.add_argument("--length-h", type=float, default=48.0, help="window length in hours (default 48)")
    ap.add_argument("--loads", default="0.8,1.0,1.2", help="offered loads, comma-separated (default 0.8,1.0,1.2)")
    ap.add_argument("--cluster", default="16x8xV100-16GB", help="fleet (default 16x8xV100-16GB)")
    ap.add_argument("--baseline", default="weighted-priority", help="ratios are against this variant")
    ap.add_argument("--variants", default="", help="variants separated by ';' (default: the built-in sweep)")
    ap.add_argument("--per-window", action="store_true", help="also print every case's ratios")
    ap.add_argument("--timing", action="store_true", help="measure replay time against FIFO instead")
    ap.add_argument("--timing-jobs", type=int, default=10_000, help="jobs replayed by --timing (default 10000)")
    ap.add_argument("--repeat", type=int, default=3, help="--timing runs per policy (default 3)")
    args = ap.parse_args()
    try:
        if args.windows < 1 or args.repeat < 1 or args.timing_jobs < 1:
            raise ValueError("--windows, --repeat and --timing-jobs must be >= 1")
        if not Path(args.trace).exists():
            raise ValueError(f"{args.trace} not found")
        timing(args) if args.timing else sensitivity(args)
    except Exception as exc:  # one line, no traceback, non-zero exit
        print(f"tiresias_sensitivity: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
