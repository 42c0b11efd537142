"""The figure of ``rlsched simulate --plot``: a per-policy summary, then the runs over simulated time.

Made to be read in a few seconds with a dozen policies:

* the top row compares the policies on three numbers - mean JCT, p95 queueing
  delay and cost (on-demand and spot stacked) - as bars, best first by mean JCT;
* policies whose results are identical (every metric equal, see
  :func:`rlsched.report.table.identical_groups`) are drawn once and labelled
  ``a = b = c``, instead of as lines hidden under each other;
* every group gets its own style: a colour and a line style, no pair repeated
  (:func:`group_styles`), the same in the bars and in the lines;
* the legend sits outside the panels, on the right, so it never covers data;
* below, over simulated time: GPU utilisation (a rolling mean: the raw series
  jumps at every event), queued jobs, cumulative cost, and the nodes held in the
  pools that scaled (fixed pools are left out: their line says nothing).

matplotlib is imported lazily with the Agg backend so that plotting works on a
headless machine and costs nothing when no plot is asked for.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.report.table import group_label, identical_groups
from rlsched.sim.metrics import Report

#: Line styles cycled against the colours; with 10 colours and 4 styles the first 20 groups all differ in
#: (colour, style), and a marker tells the next 20 apart.
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = (None, "o", "s", "^")
_GRID_POINTS = 600  # time series are resampled onto this many points before smoothing


def group_styles(n: int) -> list[dict[str, Any]]:
    """``n`` distinct matplotlib styles (colour, linestyle, marker), no two alike.

    Group ``k`` takes colour ``k % 10`` of the tab10 palette and line style ``k % 4``: since 10 and 4 have
    20 as least common multiple, groups 0..19 are distinct pairs; groups 20 and up add a marker.
    """
    import matplotlib

    colors = matplotlib.colormaps["tab10"].colors  # type: ignore[attr-defined]
    out = []
    for k in range(n):
        style: dict[str, Any] = {"color": colors[k % 10], "linestyle": LINESTYLES[k % 4]}
        marker = MARKERS[(k // 20) % len(MARKERS)]
        if marker is not None:
            style.update(marker=marker, markevery=0.1, markersize=4)
        out.append(style)
    return out


def _resample(t: Sequence[float], y: Sequence[float], grid: np.ndarray) -> np.ndarray:
    """A step series (value holds until the next sample) read at ``grid``."""
    ts = np.asarray(t, dtype=float)
    ys = np.asarray(y, dtype=float)
    if len(ts) == 0:
        return np.zeros_like(grid)
    idx = np.clip(np.searchsorted(ts, grid, side="right") - 1, 0, len(ts) - 1)
    return ys[idx]


def _rolling_mean(y: np.ndarray, window: int) -> np.ndarray:
    if window <= 1:
        return y
    kernel = np.ones(window) / window
    padded = np.concatenate([np.full(window - 1, y[0]), y])
    return np.convolve(padded, kernel, mode="valid")


def _wrap(label: str, width: int = 34) -> str:
    return "\n".join(textwrap.wrap(label, width, break_on_hyphens=False)) or label


def _elastic_pools(reports: Sequence[Report]) -> list[str]:
    """Pools whose node count changed in some run (fixed on-prem pools never do)."""
    pools: set[str] = set()
    for r in reports:
        for pool, counts in r.timeline.nodes.items():
            if len(set(counts)) > 1:
                pools.add(pool)
    return sorted(pools)


def _hours(s: float) -> float:
    return s / 3600.0


def _bar_panel(ax: Any, labels: list[str], values: list[float], styles: list[dict[str, Any]], title: str,
               fmt: str, stacked: list[float] | None = None, stacked_label: str = "") -> None:
    """Horizontal bars, one per group in order top to bottom; the best (lowest) value's label is bold."""
    y = np.arange(len(labels))[::-1]
    colors = [s["color"] for s in styles]
    ax.barh(y, values, color=colors, alpha=0.85, edgecolor="black", linewidth=0.4)
    if stacked is not None:
        ax.barh(y, stacked, left=values, color=colors, alpha=0.35, hatch="///", edgecolor="black", linewidth=0.4,
                label=stacked_label)
    totals = [v + (stacked[i] if stacked is not None else 0.0) for i, v in enumerate(values)]
    best = min(totals) if totals else 0.0
    span = max(totals) if totals and max(totals) > 0 else 1.0
    for yi, tot in zip(y, totals, strict=True):
        ax.text(tot + span * 0.01, yi, fmt.format(tot), va="center", fontsize=7,
                fontweight="bold" if tot == best else "normal")
    ax.set_xlim(0, span * 1.22)
    ax.set_yticks(y)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(axis="y", length=0)


def plot_reports(reports: Sequence[Report], out: str | Path, title: str = "") -> Path:
    """Draw the figure described in the module doc for ``reports`` and save it as PNG at ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = build_figure(reports, title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def build_figure(reports: Sequence[Report], title: str = "") -> Any:
    """The matplotlib ``Figure`` :func:`plot_reports` saves (tests inspect it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted(identical_groups(reports), key=lambda g: (g[0].mean_jct_s, g[0].policy))
    styles = group_styles(len(groups))
    labels = [group_label(g) for g in groups]
    heads = [g[0] for g in groups]

    fig = plt.figure(figsize=(14, 15))
    outer = fig.add_gridspec(2, 1, height_ratios=[max(2.2, 0.32 * len(groups) + 0.8), 9.5], hspace=0.12)
    top = outer[0].subgridspec(1, 3, wspace=0.08)
    bars = [fig.add_subplot(top[0, i]) for i in range(3)]
    _bar_panel(bars[0], labels, [_hours(r.mean_jct_s) for r in heads], styles, "mean JCT (h)", "{:.2f}")
    _bar_panel(bars[1], labels, [_hours(r.p95_wait_s) for r in heads], styles, "p95 queueing delay (h)", "{:.2f}")
    _bar_panel(bars[2], labels, [r.cost_usd - r.cost_spot_usd for r in heads], styles,
               "cost (USD): on-demand and on-prem, spot hatched", "{:,.0f}",
               stacked=[r.cost_spot_usd for r in heads], stacked_label="spot")
    bars[0].set_yticklabels([_wrap(lbl, 40) for lbl in labels], fontsize=8)
    for ax in bars[1:]:
        ax.set_yticklabels([])

    series = outer[1].subgridspec(4, 1, hspace=0.08)
    axes = [fig.add_subplot(series[i, 0]) for i in range(4)]
    for ax in axes[1:]:
        ax.sharex(axes[0])
    end = max((r.timeline.time_s[-1] for r in reports if r.timeline.time_s), default=1.0)
    grid = np.linspace(0.0, max(end, 1.0), _GRID_POINTS)
    hours = grid / 3600.0
    window = max(1, round(3600.0 / float(grid[1] - grid[0]))) if end > 2 * 3600.0 else 1
    elastic = _elastic_pools(reports)
    for head, style, label in zip(heads, styles, labels, strict=True):
        tl = head.timeline
        kw = {**style, "linewidth": 1.2, "label": _wrap(label)}
        util = _rolling_mean(_resample(tl.time_s, tl.utilization, grid), window)
        axes[0].plot(hours, util, **kw)
        axes[1].plot(hours, _resample(tl.time_s, tl.queue_length, grid), **kw)
        axes[2].plot(hours, _resample(tl.time_s, tl.cost_usd, grid), **kw)
        if elastic:
            held = sum((_resample(tl.time_s, tl.nodes[p], grid) for p in elastic if p in tl.nodes),
                       np.zeros_like(grid))
            axes[3].step(hours, held, where="post", **kw)
    axes[0].set_ylabel("GPU utilisation" + ("\n(1 h rolling mean)" if window > 1 else ""))
    axes[0].set_ylim(0, 1.05)
    axes[1].set_ylabel("queued jobs")
    axes[2].set_ylabel("cumulative cost (USD)")
    axes[3].set_ylabel("nodes held in\nelastic pools" if elastic else "nodes held\n(no pool scaled)")
    if elastic:
        axes[3].text(0.995, 0.96, "sum over " + ", ".join(elastic), transform=axes[3].transAxes, ha="right",
                     va="top", fontsize=7, bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    axes[3].set_xlabel("simulated time (hours)")
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    handles, legend_labels = axes[0].get_legend_handles_labels()
    n_same = sum(len(g) for g in groups if len(g) > 1)
    legend_title = "policy (best mean JCT first)" + ("\na = b: identical results" if n_same else "")
    fig.legend(handles, legend_labels, loc="upper left", bbox_to_anchor=(0.91, 0.68), fontsize=8,
               title=legend_title, title_fontsize=8, frameon=False, handlelength=3.2)
    fig.suptitle(_wrap(title or "rlsched simulate", 110), fontsize=11, y=0.995)
    fig.subplots_adjust(left=0.14, right=0.9, top=0.95, bottom=0.04)
    return fig
