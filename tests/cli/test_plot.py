"""The ``simulate --plot`` figure is readable with a dozen policies (issue 22.7)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rlsched.report.plots import build_figure, group_styles, plot_reports
from rlsched.sim.metrics import Report, Timeline


def _report(policy: str, jct: float, cost: float = 100.0) -> Report:
    tl = Timeline(time_s=[0.0, 3600.0, 7200.0, 10800.0], utilization=[0.0, 0.9, 0.5, 0.1],
                  queue_length=[0, 5, 2, 0], cost_usd=[0.0, cost / 3, cost / 2, cost],
                  nodes={"onprem": [4, 4, 4, 4], "spot": [0, 2, int(jct) % 3 + 1, 0]})
    return Report(policy=policy, mean_jct_s=jct * 3600, p95_jct_s=jct * 7200, mean_wait_s=600.0, p95_wait_s=1800.0,
                  makespan_s=10800.0, gpu_utilization=0.5, cost_usd=cost, cost_ondemand_usd=cost / 2,
                  cost_spot_usd=cost / 2, preemptions=0, restarts=0, lost_gpu_hours=0.0, deadline_misses=0,
                  jobs_completed=10, jobs_unschedulable=0, jobs_skipped=0, refused_decisions=0, wall_s=1.0,
                  timeline=tl)


def _twelve() -> list[Report]:
    same = _report("weighted-priority", 4.0)
    reports = [replace(same, policy=p, wall_s=w) for p, w in
               (("best-fit", 2.0), ("fgd", 3.0), ("spot-fallback", 4.0), ("weighted-priority", 1.0))]
    reports += [_report(p, 4.5 + i / 10, cost=100.0 + 10 * i) for i, p in enumerate(
        ("fair-share", "fifo", "sjf", "tiresias", "uniform-progress", "ondemand-static", "ondemand-autoscale",
         "spot-greedy"))]
    return reports


def test_styles_never_repeat() -> None:
    styles = group_styles(40)
    keys = {(tuple(s["color"]), s["linestyle"], s.get("marker")) for s in styles}
    assert len(keys) == 40
    assert len({(tuple(s["color"]), s["linestyle"]) for s in styles[:20]}) == 20


def test_identical_results_are_one_line_labelled_as_such_with_distinct_styles() -> None:
    import matplotlib.pyplot as plt

    fig = build_figure(_twelve(), "twelve policies")
    try:
        legend = fig.legends[0]
        labels = [t.get_text().replace("\n", " ") for t in legend.get_texts()]
        assert len(labels) == 9  # 4 identical policies drawn once, 8 of their own
        grouped = next(lbl for lbl in labels if "=" in lbl)
        assert set(grouped.split(" = ")) == {"best-fit", "fgd", "spot-fallback", "weighted-priority"}
        util_axis = next(ax for ax in fig.axes if ax.get_ylabel().startswith("GPU utilisation"))
        lines = util_axis.get_lines()
        assert len(lines) == 9
        assert len({(line.get_color() if isinstance(line.get_color(), str) else tuple(line.get_color()),
                     line.get_linestyle()) for line in lines}) == 9
        # the legend is outside every panel
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title() or ax.get_ylabel()
        # the summary row: one bar per group in each of mean JCT, p95 wait and cost
        titles = [ax.get_title() for ax in fig.axes]
        for want in ("mean JCT (h)", "p95 queueing delay (h)"):
            ax = fig.axes[titles.index(want)]
            assert len(ax.patches) == 9
        cost = next(ax for ax in fig.axes if ax.get_title().startswith("cost (USD)"))
        assert len(cost.patches) == 18  # on-demand bars and spot bars stacked on them
    finally:
        plt.close(fig)


@pytest.mark.parametrize("n", [1, 12])
def test_plot_writes_a_png(tmp_path: Path, n: int) -> None:
    out = plot_reports(_twelve()[:n], tmp_path / "sub" / "p.png", "t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
