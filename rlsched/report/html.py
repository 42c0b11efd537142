"""``rlsched simulate --html``: one self-contained HTML file comparing the policies of a run.

The page speaks the dashboard's visual language (dark panels, one colour per policy) and needs nothing but
itself: charts are inline SVG drawn here in Python, the style sheet is inline, there is no script and no
external reference, so it opens offline, attached to a mail or from an artefact store. Contents:

* a summary table (JCT, waits, utilisation, cost, jobs completed and unfinished, preemptions);
* bars of mean JCT, p95 queueing delay and cost (spot part lighter), best first by mean JCT;
* the distributions of job completion time and queueing delay, as empirical CDFs on a log-time axis
  (over completed batch jobs, the samples behind the table's means and percentiles);
* over simulated time: GPU utilisation (1 h rolling mean on runs longer than 2 h), queued jobs, cumulative
  cost and the nodes held in pools that scaled (all pools when none did).

Policies whose results are identical are drawn once and labelled ``a = b`` (as in ``--plot``). Every string
from the run (policy names, the title) is HTML-escaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import rlsched
from rlsched.report.plots import _elastic_pools, _resample, _rolling_mean
from rlsched.report.table import group_label, identical_groups
from rlsched.sim.metrics import Report

#: One colour per policy group (the tab10 palette, as the PNG plot), then dash patterns for groups 10+.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")
DASHES = ("", "6 3", "2 3", "8 3 2 3")
_GRID_POINTS = 400
W, H = 860, 230
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 12, 36

CSS = """
body { margin: 0; background: #0f1419; color: #d8e0e8; font: 14px/1.4 system-ui, sans-serif; }
header { padding: .8rem 1.2rem; background: #182028; border-bottom: 1px solid #2a3642; }
h1 { margin: 0; font-size: 1.2rem; } h2 { margin: 0 0 .6rem; font-size: 1rem; }
main { padding: 1rem; display: grid; gap: 1rem; grid-template-columns: repeat(auto-fit, minmax(760px, 1fr)); }
section.wide { grid-column: 1 / -1; }
section { background: #182028; border: 1px solid #2a3642; border-radius: 6px; padding: .8rem 1rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: right; padding: .25rem .5rem; border-bottom: 1px solid #2a3642; }
th:first-child, td:first-child { text-align: left; }
th { color: #8a99a8; font-weight: 600; }
.muted { color: #8a99a8; }
.legend { display: flex; flex-wrap: wrap; gap: .4rem 1.2rem; margin: .4rem 0; }
.legend span { white-space: nowrap; }
svg text { fill: #d8e0e8; font-size: 11px; }
svg .axis { stroke: #8a99a8; } svg .grid { stroke: #2a3642; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    return [round(start + i * step, 10) for i in range(int((hi - start) / step) + 1)]


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{s / 3600:.3g}h"
    return f"{s / 86400:.3g}d"


class _Frame:
    """Maps data to an SVG plot area (optionally a log10 x axis)."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, *, log_x: bool = False) -> None:
        self.log_x = log_x
        self.x0, self.x1 = (math.log10(x0), math.log10(x1)) if log_x else (x0, x1)
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1.0
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1.0)

    def x(self, v: float) -> float:
        v = math.log10(max(v, 1e-9)) if self.log_x else v
        return PAD_L + (v - self.x0) / (self.x1 - self.x0) * (W - PAD_L - PAD_R)

    def y(self, v: float) -> float:
        return H - PAD_B - (v - self.y0) / (self.y1 - self.y0) * (H - PAD_T - PAD_B)


def _axes(f: _Frame, xticks: list[tuple[float, str]], yticks: list[tuple[float, str]], x_label: str,
          y_label: str) -> list[str]:
    out = []
    for v, label in yticks:
        y = f.y(v)
        out.append(f'<line class="grid" x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(label)}</text>')
    for v, label in xticks:
        x = f.x(v)
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_T}" y2="{H - PAD_B}"/>')
        out.append(f'<text x="{x:.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{_e(label)}</text>')
    out.append(f'<line class="axis" x1="{PAD_L}" x2="{W - PAD_R}" y1="{H - PAD_B}" y2="{H - PAD_B}"/>')
    out.append(f'<line class="axis" x1="{PAD_L}" x2="{PAD_L}" y1="{PAD_T}" y2="{H - PAD_B}"/>')
    out.append(f'<text x="{(PAD_L + W - PAD_R) / 2:.0f}" y="{H - 4}" text-anchor="middle">{_e(x_label)}</text>')
    out.append(f'<text x="12" y="{(PAD_T + H - PAD_B) / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 12 {(PAD_T + H - PAD_B) / 2:.0f})">{_e(y_label)}</text>')
    return out


def _svg(body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" role="img" '
            f'aria-label="{_e(label)}">' + "".join(body) + "</svg>")


def _polyline(f: _Frame, xs: Sequence[float], ys: Sequence[float], k: int, label: str, *, step: bool = False) -> str:
    pts: list[str] = []
    prev_y: float | None = None
    for x, y in zip(xs, ys, strict=True):
        px, py = f.x(x), f.y(y)
        if step and prev_y is not None:
            pts.append(f"{px:.1f},{prev_y:.1f}")
        pts.append(f"{px:.1f},{py:.1f}")
        prev_y = py
    dash = DASHES[(k // len(COLORS)) % len(DASHES)]
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<polyline fill="none" stroke="{COLORS[k % len(COLORS)]}" stroke-width="1.6"{dash_attr} '
            f'points="{" ".join(pts)}"><title>{_e(label)}</title></polyline>')


def cdf_chart(samples: Sequence[Sequence[float]], labels: Sequence[str], x_label: str) -> str:
    """Empirical CDFs of ``samples`` (seconds) on a log-time axis, one line per group."""
    positive = [v for s in samples for v in s if v > 0]
    lo = max(min(positive), 1.0) if positive else 1.0
    hi = max(max(positive), lo * 10) if positive else 10.0
    f = _Frame(lo, hi, 0.0, 1.0, log_x=True)
    xticks = [(10.0 ** e, _duration(10.0 ** e)) for e in range(math.ceil(math.log10(lo)),
                                                                math.floor(math.log10(hi)) + 1)]
    body = _axes(f, xticks, [(v, f"{v:.0%}") for v in (0, 0.25, 0.5, 0.75, 1.0)], x_label, "share of jobs")
    for k, (s, label) in enumerate(zip(samples, labels, strict=True)):
        if not s:
            continue
        xs = np.sort(np.maximum(np.asarray(s, dtype=float), lo))
        ys = np.arange(1, len(xs) + 1) / len(xs)
        if len(xs) > _GRID_POINTS:  # thin to the quantiles: the shape, not every job
            idx = np.linspace(0, len(xs) - 1, _GRID_POINTS).astype(int)
            xs, ys = xs[idx], ys[idx]
        body.append(_polyline(f, [lo, *xs.tolist()], [0.0, *ys.tolist()], k, label, step=True))
    return _svg(body, x_label)


def time_chart(series: Sequence[tuple[np.ndarray, np.ndarray]], labels: Sequence[str], y_label: str, *,
               y_max: float | None = None, step: bool = False) -> str:
    """Lines over simulated time (hours), one per group."""
    x_hi = max((float(x[-1]) for x, _ in series if len(x)), default=1.0)
    y_hi = y_max if y_max is not None else max((float(np.max(y)) for _, y in series if len(y)), default=1.0)
    f = _Frame(0.0, max(x_hi, 1e-9), 0.0, max(y_hi, 1e-9) * (1.0 if y_max is not None else 1.05))
    xticks = [(v, _fmt(v)) for v in _nice_ticks(0.0, x_hi, 8)]
    yticks = [(v, _fmt(v)) for v in _nice_ticks(0.0, f.y1, 4) if v <= f.y1]
    body = _axes(f, xticks, yticks, "simulated time (hours)", y_label)
    for k, ((xs, ys), label) in enumerate(zip(series, labels, strict=True)):
        body.append(_polyline(f, xs.tolist(), ys.tolist(), k, label, step=step))
    return _svg(body, y_label)


def bar_chart(values: Sequence[float], labels: Sequence[str], title: str, fmt: str,
              light: Sequence[float] | None = None) -> str:
    """Horizontal bars, one per group (``light``: a lighter part stacked on each bar, e.g. spot cost)."""
    row = 22
    height = PAD_T + row * len(values) + 8
    totals = [v + (light[i] if light is not None else 0.0) for i, v in enumerate(values)]
    span = max(totals, default=0.0) or 1.0
    best = min(totals, default=0.0)
    left, right = 8, 250
    scale = (W - left - right) / span
    body = []
    for i, (v, label) in enumerate(zip(values, labels, strict=True)):
        y = PAD_T + i * row
        color = COLORS[i % len(COLORS)]
        body.append(f'<rect x="{left}" y="{y}" width="{max(v * scale, 0.5):.1f}" height="{row - 6}" fill="{color}">'
                    f"<title>{_e(label)}: {_e(fmt.format(totals[i]))}</title></rect>")
        if light is not None and light[i] > 0:
            body.append(f'<rect x="{left + v * scale:.1f}" y="{y}" width="{light[i] * scale:.1f}" '
                        f'height="{row - 6}" fill="{color}" fill-opacity="0.4"/>')
        weight = ' font-weight="bold"' if totals[i] == best else ""
        body.append(f'<text x="{left + totals[i] * scale + 6:.1f}" y="{y + row - 10}"{weight}>'
                    f"{_e(fmt.format(totals[i]))} {_e(_short(label))}</text>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="100%" role="img" '
            f'aria-label="{_e(title)}">' + "".join(body) + "</svg>")


def _short(label: str, n: int = 40) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def _legend(labels: Sequence[str]) -> str:
    items = []
    for k, label in enumerate(labels):
        dash = DASHES[(k // len(COLORS)) % len(DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        items.append(f'<span><svg width="28" height="10" aria-hidden="true"><line x1="0" x2="28" y1="5" y2="5" '
                     f'stroke="{COLORS[k % len(COLORS)]}" stroke-width="3"{dash_attr}/></svg> {_e(label)}</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


def _summary(groups: Sequence[Sequence[Report]], labels: Sequence[str]) -> str:
    head = ("policy", "mean JCT", "p95 JCT", "mean wait", "p95 wait", "GPU util.", "cost (USD)", "spot (USD)",
            "completed", "unfinished", "preemptions")
    rows = []
    for g, label in zip(groups, labels, strict=True):
        r = g[0]
        cells = (label, _duration(r.mean_jct_s), _duration(r.p95_jct_s), _duration(r.mean_wait_s),
                 _duration(r.p95_wait_s), f"{r.gpu_utilization:.1%}", f"{r.cost_usd:,.0f}", f"{r.cost_spot_usd:,.0f}",
                 f"{r.jobs_completed:,}", f"{r.jobs_unfinished:,}", f"{r.preemptions:,}")
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def render_html(reports: Sequence[Report], job_times: Sequence[tuple[Sequence[float], Sequence[float]]],
                title: str = "") -> str:
    """The report page (see the module doc) for ``reports`` and their ``job_times`` (JCTs, waits), in order."""
    times = {id(r): t for r, t in zip(reports, job_times, strict=True)}
    groups = sorted(identical_groups(reports), key=lambda g: (g[0].mean_jct_s, g[0].policy))
    labels = [group_label(g) for g in groups]
    heads = [g[0] for g in groups]
    jcts = [list(times[id(r)][0]) for r in heads]
    waits = [list(times[id(r)][1]) for r in heads]

    end = max((r.timeline.time_s[-1] for r in reports if r.timeline.time_s), default=1.0)
    grid = np.linspace(0.0, max(end, 1.0), _GRID_POINTS)
    hours = grid / 3600.0
    window = max(1, round(3600.0 / float(grid[1] - grid[0]))) if end > 2 * 3600.0 else 1
    elastic = _elastic_pools(reports)
    util, queue, cost, nodes = [], [], [], []
    for r in heads:
        tl = r.timeline
        util.append((hours, _rolling_mean(_resample(tl.time_s, tl.utilization, grid), window)))
        queue.append((hours, _resample(tl.time_s, tl.queue_length, grid)))
        cost.append((hours, _resample(tl.time_s, tl.cost_usd, grid)))
        pools = elastic or sorted(tl.nodes)
        held = sum((_resample(tl.time_s, tl.nodes[p], grid) for p in pools if p in tl.nodes), np.zeros_like(grid))
        nodes.append((hours, held))
    nodes_label = ("nodes held in elastic pools (" + ", ".join(elastic) + ")") if elastic else \
        "nodes held (no pool scaled)"

    title = title or "rlsched simulate"
    legend = _legend(labels)
    sections = [
        ("Summary", _summary(groups, labels)),
        ("Mean JCT (best first)", bar_chart([r.mean_jct_s / 3600 for r in heads], labels, "mean JCT", "{:.2f} h")),
        ("p95 queueing delay", bar_chart([r.p95_wait_s / 3600 for r in heads], labels, "p95 wait", "{:.2f} h")),
        ("Cost (on-demand and on-prem; spot lighter)",
         bar_chart([r.cost_usd - r.cost_spot_usd for r in heads], labels, "cost", "${:,.0f}",
                   light=[r.cost_spot_usd for r in heads])),
        ("Job completion time (CDF, completed batch jobs)", legend + cdf_chart(jcts, labels, "job completion time")),
        ("Queueing delay (CDF, completed batch jobs)", legend + cdf_chart(waits, labels, "queueing delay")),
        ("GPU utilisation" + (" (1 h rolling mean)" if window > 1 else ""),
         legend + time_chart(util, labels, "GPU utilisation", y_max=1.0)),
        ("Queued jobs", legend + time_chart(queue, labels, "queued jobs")),
        ("Cumulative cost (USD)", legend + time_chart(cost, labels, "cost (USD)")),
        (nodes_label[:1].upper() + nodes_label[1:], legend + time_chart(nodes, labels, "nodes", step=True)),
    ]
    wide = ' class="wide"'
    body = "".join(f"<section{wide if i == 0 else ''}><h2>{_e(h)}</h2>{content}</section>"
                   for i, (h, content) in enumerate(sections))
    note = ("Policies with identical results are drawn once (a = b)." if any(len(g) > 1 for g in groups) else "")
    return ("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"<header><h1>{_e(title)}</h1><div class=\"muted\">rlsched {_e(rlsched.__version__)} - "
            f"{len(reports)} polic{'y' if len(reports) == 1 else 'ies'}. {_e(note)}</div></header>\n"
            f"<main>{body}</main>\n</body>\n</html>\n")


def write_html_report(reports: Sequence[Report], job_times: Sequence[tuple[Sequence[float], Sequence[float]]],
                      out: str | Path, title: str = "") -> Path:
    """Write :func:`render_html` to ``out`` (parent folders created)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(reports, job_times, title), encoding="utf-8")
    return path
