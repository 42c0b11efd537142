"""Plots of simulation runs: utilisation, queue, cost and nodes held over time.

matplotlib is imported lazily with the Agg backend so that plotting works on a
headless machine and costs nothing when no plot is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlsched.sim.metrics import Report


def plot_reports(reports: Sequence[Report], out: str | Path, title: str = "") -> Path:
    """Draw one figure comparing ``reports`` over simulated time and save it as PNG.

    Panels: GPU utilisation, queue length, cumulative cost, and elastic nodes held
    per pool (one line per policy and pool), so a reader sees at a glance which
    policy keeps GPUs busy, who lets the queue grow, and what it costs.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    fig, axes = plt.subplots(4, 1, figsize=(11, 13), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(reports):
        tl = r.timeline
        hours = [t / 3600.0 for t in tl.time_s]
        c = colors[i % len(colors)]
        axes[0].plot(hours, tl.utilization, color=c, label=r.policy, linewidth=1)
        axes[1].plot(hours, tl.queue_length, color=c, label=r.policy, linewidth=1)
        axes[2].plot(hours, tl.cost_usd, color=c, label=r.policy, linewidth=1.2)
        styles = ["-", "--", ":", "-."]
        for j, (pool, counts) in enumerate(sorted(tl.nodes.items())):
            if len(set(counts)) <= 1 and i > 0:
                continue
            axes[3].step(hours, counts, where="post", color=c, linestyle=styles[j % len(styles)], linewidth=1,
                         label=f"{r.policy} / {pool}")
    axes[0].set_ylabel("GPU utilisation")
    axes[0].set_ylim(0, 1.05)
    axes[1].set_ylabel("queued jobs")
    axes[2].set_ylabel("cumulative cost (USD)")
    axes[3].set_ylabel("nodes held")
    axes[3].set_xlabel("simulated time (hours)")
    axes[0].legend(loc="upper right", fontsize=8, ncol=2)
    axes[3].legend(loc="upper right", fontsize=6, ncol=2)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title or "rlsched simulate")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
