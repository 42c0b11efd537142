"""The comparison table ``rlsched simulate`` prints, and the notes under it.

The table fits the terminal: with every column it is about 170 characters wide, so
on a narrower terminal the least important columns are left out (lowest
:attr:`Column.keep` first) and a note names them (``--json`` has every metric).
Policies whose runs were identical are named in a note, so equal rows read as
equal on purpose rather than as a bug; so is a preempting policy that had nothing
it was allowed to preempt.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlsched.report.terminal import escape_control
from rlsched.sim.metrics import Report


def _dur(s: float) -> str:
    if s >= 86400:
        return f"{s / 86400:.1f}d"
    if s >= 3600:
        return f"{s / 3600:.1f}h"
    if s >= 60:
        return f"{s / 60:.1f}m"
    return f"{s:.0f}s"


def _money(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.2f}"


def _count(v: float) -> str:
    return f"{int(v):,}"


@dataclass(frozen=True)
class Column:
    """One metric column: header, how to read and format it, and how much it matters."""

    header: str
    value: Callable[[Report], float]
    fmt: Callable[[float], str]
    keep: int  # higher survives longer on a narrow terminal
    best: str | None = "min"  # which value is bold: "min", "max" or None (not a score)
    exception: bool = False  # counts of things that should not happen: first to go when 0 for every policy


COLUMNS: tuple[Column, ...] = (
    Column("mean JCT", lambda r: r.mean_jct_s, _dur, 100),
    Column("p95 JCT", lambda r: r.p95_jct_s, _dur, 60),
    Column("mean wait", lambda r: r.mean_wait_s, _dur, 50),
    Column("p95 wait", lambda r: r.p95_wait_s, _dur, 95),
    Column("makespan", lambda r: r.makespan_s, _dur, 20),
    Column("GPU util", lambda r: r.gpu_utilization, lambda v: f"{v:.1%}", 70, "max"),
    Column("cost USD", lambda r: r.cost_usd, _money, 90),
    Column("preempt", lambda r: r.preemptions, _count, 45, exception=True),
    Column("lost GPU-h", lambda r: r.lost_gpu_hours, _money, 30, exception=True),
    Column("dl miss", lambda r: r.deadline_misses, _count, 55, exception=True),
    Column("done", lambda r: r.jobs_completed, _count, 85, None),
    Column("unsched", lambda r: r.jobs_never_schedulable, _count, 80, exception=True),
    Column("unfinished", lambda r: r.jobs_unfinished, _count, 75, exception=True),
    Column("skipped", lambda r: r.jobs_skipped, _count, 25, None, exception=True),
    Column("wall", lambda r: r.wall_s, lambda v: f"{v:.2f}s", 10, None),
)


def _build(reports: Sequence[Report], title: str, columns: Sequence[Column]) -> Table:
    t = Table(title=escape_control(title), header_style="bold")
    t.add_column("policy", justify="left", no_wrap=True)
    for c in columns:
        t.add_column(c.header, justify="right", no_wrap=True)
    best: dict[str, float] = {}
    if len(reports) > 1:
        for c in columns:
            if c.best is not None:
                vals = [c.value(r) for r in reports]
                best[c.header] = max(vals) if c.best == "max" else min(vals)
    for r in reports:
        row = [Text(escape_control(r.policy))]
        for c in columns:
            v = c.value(r)
            row.append(Text(c.fmt(v), style="bold green" if best.get(c.header) == v else ""))
        t.add_row(*row)
    return t


def fitted_columns(reports: Sequence[Report], title: str, width: int | None) -> tuple[list[Column], list[Column]]:
    """(shown, hidden): every column when ``width`` is None or the table fits; else the most important
    ones that fit in ``width`` characters (the policy column and mean JCT always stay)."""
    shown = list(COLUMNS)
    hidden: list[Column] = []
    if width is None:
        return shown, hidden
    # Measured on an unbounded console: a measure is clamped to the console's width.
    console = Console(width=100_000, file=io.StringIO())

    def keep(c: Column) -> int:
        return c.keep - 1000 if c.exception and all(c.value(r) == 0 for r in reports) else c.keep

    while len(shown) > 1 and console.measure(_build(reports, title, shown)).maximum > width:
        drop = min(shown, key=keep)
        shown.remove(drop)
        hidden.append(drop)
    return shown, hidden


def comparison_table(reports: Sequence[Report], title: str = "", *, width: int | None = None) -> Table:
    """One row per policy; the best value of each lower-is-better column is bold.

    With ``width`` the least important columns are left out until the table fits (see the module doc;
    :func:`fitted_columns` says which).
    """
    shown, _ = fitted_columns(reports, title, width)
    return _build(reports, title, shown)


def _signature(r: Report) -> tuple[object, ...]:
    """Every metric of a run except its name and wall time: equal to the last digit means the same schedule."""
    return tuple(sorted((k, v) for k, v in r.result().items() if k not in ("policy", "wall_s")))


def identical_groups(reports: Sequence[Report]) -> list[list[Report]]:
    """The reports grouped by identical results (every metric but wall time, exactly equal), in first-seen
    order; a policy with a result of its own is a group of one."""
    groups: dict[tuple[object, ...], list[Report]] = {}
    for r in reports:
        groups.setdefault(_signature(r), []).append(r)
    return list(groups.values())


def group_label(group: Iterable[Report]) -> str:
    """``a = b = c``: the policies of one group of identical results."""
    return " = ".join(escape_control(r.policy) for r in group)


def comparison_notes(reports: Sequence[Report], *, hidden: Sequence[Column] = (), preempting: Iterable[str] = (),
                     preemptible_jobs: int | None = None, total_jobs: int | None = None) -> list[str]:
    """Plain-text notes printed under the table (each one line, safe to print).

    Args:
        reports: the runs, as in the table.
        hidden: columns :func:`fitted_columns` left out.
        preempting: names of the policies that preempt running jobs (Tiresias, weighted-priority with
            preemption...).
        preemptible_jobs: how many jobs of the workload may be preempted.
        total_jobs: how many jobs the workload has.
    """
    notes = []
    if hidden:
        ordered = sorted(hidden, key=lambda c: COLUMNS.index(c))
        zero = [c.header for c in ordered if c.exception and all(c.value(r) == 0 for r in reports)]
        other = [c.header for c in ordered if c.header not in zero]
        parts = ([", ".join(other)] if other else []) + ([", ".join(zero) + " (0 for every policy)"] if zero else [])
        notes.append(f"not shown, to fit the terminal: {'; '.join(parts)}. COLUMNS=200 or a wider terminal "
                     f"shows them; --json has every metric")
    for g in identical_groups(reports):
        if len(g) > 1:
            notes.append(f"identical results (every metric equal): {group_label(g)}")
    quiet = [r for r in reports if r.policy in set(preempting) and r.preemptions == 0]
    if quiet and preemptible_jobs == 0:
        names = ", ".join(escape_control(r.policy) for r in quiet)
        of = f"the {total_jobs:,} jobs" if total_jobs is not None else "the jobs"
        notes.append(f"{names}: 0 preemptions because none of {of} is preemptible (the trace's preemptible "
                     f"column; --preemptible all lets every job be preempted)")
    if any(r.jobs_unfinished for r in reports):
        notes.append("unfinished: jobs still queued or running when the simulation horizon ended the run "
                     "(--horizon); unsched: jobs no pool could ever hold")
    return notes
