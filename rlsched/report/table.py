"""The comparison table ``rlsched simulate`` prints."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from rlsched.sim.metrics import Report


def _dur(s: float) -> str:
    if s >= 86400:
        return f"{s / 86400:.1f}d"
    if s >= 3600:
        return f"{s / 3600:.1f}h"
    if s >= 60:
        return f"{s / 60:.1f}m"
    return f"{s:.0f}s"


def comparison_table(reports: Sequence[Report], title: str = "") -> Table:
    """One row per policy; the best value of each lower-is-better column is bold."""
    t = Table(title=title, header_style="bold")
    cols = [
        ("policy", None), ("mean JCT", "mean_jct_s"), ("p95 JCT", "p95_jct_s"), ("mean wait", "mean_wait_s"),
        ("p95 wait", "p95_wait_s"), ("makespan", "makespan_s"), ("GPU util", "gpu_utilization"),
        ("cost USD", "cost_usd"), ("preempt", "preemptions"), ("lost GPU-h", "lost_gpu_hours"),
        ("dl miss", "deadline_misses"), ("done", "jobs_completed"), ("unsched", "jobs_unschedulable"),
        ("skipped", "jobs_skipped"), ("wall", "wall_s"),
    ]
    for name, _ in cols:
        t.add_column(name, justify="left" if name == "policy" else "right")
    best: dict[str, float] = {}
    for _, key in cols:
        if key is None or key in ("jobs_completed", "wall_s", "jobs_skipped"):
            continue
        vals = [getattr(r, key) for r in reports]
        best[key] = max(vals) if key == "gpu_utilization" else min(vals)
    for r in reports:
        row = []
        for _, key in cols:
            if key is None:
                row.append(r.policy)
                continue
            v = getattr(r, key)
            if key.endswith("_s") and key != "wall_s":
                txt = _dur(v)
            elif key == "wall_s":
                txt = f"{v:.2f}s"
            elif key == "gpu_utilization":
                txt = f"{v:.1%}"
            elif key in ("cost_usd", "lost_gpu_hours"):
                txt = f"{v:,.0f}" if v >= 100 else f"{v:,.2f}"
            else:
                txt = f"{v:,}"
            if len(reports) > 1 and key in best and v == best[key]:
                txt = f"[bold green]{txt}[/]"
            row.append(txt)
        t.add_row(*row)
    return t
