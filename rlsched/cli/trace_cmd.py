"""``rlsched trace convert`` and ``rlsched trace info``.

Thin layers over :mod:`rlsched.workload`: convert any supported trace to the
canonical CSV every ``--trace`` option accepts, and summarise a trace before
spending simulator time on it. Problems surface as :class:`~rlsched.errors.RlschedError`
subclasses, which :func:`rlsched.cli.main` prints as one line.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rlsched.cli.app import trace_app
from rlsched.cluster.job import JobKind
from rlsched.errors import TraceError
from rlsched.workload import FORMATS, Trace, load_trace, offered_load, take, write_canonical

_FORMAT_HELP = f"Input format: auto (from the header) or one of {', '.join(FORMATS)}."


def _check_format(fmt: str) -> str:
    fmt = fmt.lower()
    if fmt not in ("auto", *FORMATS):
        raise TraceError("--format", None, None, f"unknown format {fmt!r}; supported: auto, {', '.join(FORMATS)}")
    return fmt


def _skips(trace: Trace) -> str:
    if not trace.skipped_rows:
        return "skipped 0"
    reasons = ", ".join(f"{n} {r}" for r, n in sorted(trace.skip_reasons.items(), key=lambda kv: -kv[1]))
    return f"skipped {trace.skipped_rows} ({reasons})"


def _duration(seconds: float) -> str:
    """Human span: '3d 4h', '2h 5m', '42s'."""
    s = round(seconds)
    days, rem = divmod(s, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{seconds:g}s"


@trace_app.command("convert")
def convert(
    src: Annotated[Path, typer.Argument(help="Trace to read (any supported format).")],
    dst: Annotated[Path, typer.Argument(help="Canonical CSV to write.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help=_FORMAT_HELP)] = "auto",
    virtual_cluster: Annotated[
        str | None, typer.Option("--virtual-cluster", help="Philly only: keep one virtual cluster.")
    ] = None,
    skip_bad_rows: Annotated[
        bool, typer.Option("--skip-bad-rows", help="Count malformed rows instead of stopping at the first.")
    ] = False,
    max_jobs: Annotated[
        int | None, typer.Option("--max-jobs", min=0, help="Keep only the first N jobs by submit time.")
    ] = None,
) -> None:
    """Convert a trace to the canonical job-trace CSV (FORMAT.md)."""
    fmt = _check_format(fmt)
    if src.resolve() == dst.resolve():
        raise TraceError(str(dst), None, None, "destination is the source file; choose another path")
    trace = load_trace(src, fmt, skip_bad_rows=skip_bad_rows, virtual_cluster=virtual_cluster)
    if max_jobs is not None:
        trace = take(trace, max_jobs)
    written = write_canonical(dst, trace.jobs)
    censored = sum(1 for j in trace.jobs if j.duration_censored)
    typer.echo(f"wrote {written} jobs to {dst}; {_skips(trace)}; {censored} censored")


@trace_app.command("info")
def info(
    file: Annotated[Path, typer.Argument(help="Trace to summarise (any supported format).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help=_FORMAT_HELP)] = "auto",
    virtual_cluster: Annotated[
        str | None, typer.Option("--virtual-cluster", help="Philly only: keep one virtual cluster.")
    ] = None,
    skip_bad_rows: Annotated[
        bool, typer.Option("--skip-bad-rows", help="Count malformed rows instead of stopping at the first.")
    ] = False,
    capacity: Annotated[
        int | None, typer.Option("--capacity", min=1, help="Also show the offered load on this many GPUs.")
    ] = None,
) -> None:
    """Summarise a trace: jobs, span, GPU demand by size, fractional share, load."""
    fmt = _check_format(fmt)
    trace = load_trace(file, fmt, skip_bad_rows=skip_bad_rows, virtual_cluster=virtual_cluster)
    jobs = trace.jobs
    console = Console()

    summary = Table(title=f"Trace {file}", show_header=False)
    summary.add_column("what", style="bold")
    summary.add_column("value")
    summary.add_row("jobs", str(len(jobs)))
    summary.add_row("skipped rows", _skips(trace).removeprefix("skipped "))
    summary.add_row("censored durations", str(trace.censored))
    summary.add_row(
        "submissions",
        f"{trace.start:,.0f}s .. {trace.last_submit:,.0f}s ({_duration(trace.last_submit - trace.start)})",
    )
    summary.add_row("end (last finish)", f"{trace.end:,.0f}s ({_duration(trace.span)} after the first submit)")
    summary.add_row("GPU-hours demanded", f"{trace.gpu_seconds() / 3600:,.1f}")
    summary.add_row("fractional (1 GPU, gpu_milli < 1000)", str(sum(1 for j in jobs if j.fractional)))
    summary.add_row("CPU-only (num_gpus 0)", str(sum(1 for j in jobs if j.num_gpus == 0)))
    summary.add_row("services", str(sum(1 for j in jobs if j.kind is JobKind.SERVICE)))
    summary.add_row("with GPU-model constraint", str(sum(1 for j in jobs if j.gpu_models)))
    if capacity is not None:
        summary.add_row(f"offered load on {capacity} GPUs", f"{offered_load(jobs, capacity):.3f}")
    console.print(summary)

    counts: Counter[int] = Counter(j.num_gpus for j in jobs)
    gpu_hours: dict[int, float] = {}
    for j in jobs:
        gpu_hours[j.num_gpus] = gpu_hours.get(j.num_gpus, 0.0) + j.gpu_demand * j.duration / 3600
    hist = Table(title="GPU demand by num_gpus")
    hist.add_column("num_gpus", justify="right")
    hist.add_column("jobs", justify="right")
    hist.add_column("share", justify="right")
    hist.add_column("GPU-hours", justify="right")
    total = max(len(jobs), 1)
    for n in sorted(counts):
        hist.add_row(str(n), str(counts[n]), f"{counts[n] / total:.1%}", f"{gpu_hours[n]:,.1f}")
    console.print(hist)


def _override(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--set`` with VALUE parsed as a number where it is one."""
    from rlsched.workload.generator import GeneratorError

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise GeneratorError(f"--set {text!r}: expected KEY=VALUE, e.g. load=1.2")
    value: object = raw.strip()
    for conv in (int, float):
        try:
            value = conv(raw)
            break
        except ValueError:
            continue
    return key.strip(), value


@trace_app.command("generate")
def generate_cmd(
    family_name: Annotated[str, typer.Argument(metavar="FAMILY", help="A workload family (see `--list`).")] = "",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Canonical CSV to write.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the draw; each seed is another window.")] = 0,
    sets: Annotated[
        list[str] | None, typer.Option("--set", help="Override a family parameter, KEY=VALUE (repeatable).")
    ] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the families and exit.")] = False,
) -> None:
    """Draw a synthetic trace from a workload family (heavy tails, gangs, bursts, backlogs, MIG shares).

    The trace is written as canonical CSV; the family's fleet is printed as a
    --cluster string to simulate it on.
    """
    from rlsched.workload.generator import FAMILIES, GeneratorError, family, generate, with_overrides

    if list_ or not family_name:
        for name, spec in FAMILIES.items():
            typer.echo(f"{name:12} {spec.cluster:45} {spec.description}")
        if not list_:
            raise GeneratorError("name a family to generate (the list above), e.g. `rlsched trace generate bursty`")
        return
    if out is None:
        raise GeneratorError("--out FILE is required: where to write the generated trace")
    spec = with_overrides(family(family_name), **dict(_override(s) for s in sets or []))
    trace = generate(spec, seed)
    written = write_canonical(out, trace.jobs)
    typer.echo(f"wrote {written} jobs to {out} (family {spec.name}, seed {seed}, offered load {spec.load:g} "
               f"on --cluster {spec.cluster})")


@trace_app.command("export")
def export_cmd(
    state_dir: Annotated[Path, typer.Option("--state-dir", help="The service's state dir (its jobs.db).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Canonical CSV to write.")],
    since: Annotated[
        str | None, typer.Option("--since", help="Only jobs submitted in this last span (30d, 12h); default all.")
    ] = None,
    with_commands: Annotated[
        bool, typer.Option("--with-commands", help="Also write each job's command line and cwd (private: 0600).")
    ] = False,
) -> None:
    """Export the scheduler service's own job history as a canonical trace (read-only; the service may run).

    One row per job that started: submit time, the last attempt's run time as duration (restarts and the
    total run time of every attempt in their own columns), GPUs or MIG profile, user, priority,
    preemptible, deadline and outcome. Jobs that never started are counted, not written.
    """
    from rlsched.cli.service_cmd import parse_duration
    from rlsched.workload.history import db_path_of, read_history, write_history

    since_s = parse_duration(since, "--since") if since is not None else None
    export = read_history(db_path_of(state_dir), since_s=since_s, with_commands=with_commands)
    written = write_history(out, export, with_commands=with_commands)
    running = sum(1 for j in export.jobs if j.censored)
    restarted = sum(1 for j in export.jobs if j.attempts > 1)
    left = sum(export.not_started.values())
    why = ", ".join(f"{n} {s}" for s, n in sorted(export.not_started.items()))
    typer.echo(f"wrote {written} jobs to {out}; {restarted} restarted, {running} still running (censored); "
               f"{left} never started, not written{f' ({why})' if why else ''}")
