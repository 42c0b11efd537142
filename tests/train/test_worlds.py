"""Training/evaluation worlds: cluster, load and price-period variants of a scenario entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.market import TableMarket
from rlsched.market.preemption import KaplanMeierPreemption
from rlsched.train.config import ExperimentError, load_experiment
from rlsched.train.worlds import evaluation_worlds, training_worlds

SCENARIO = """
cluster: "spot:0-2x8xV100-16GB,ondemand:0-2x8xV100-16GB"
workload: [{path: "bundled:philly-3day.csv"}]
preemptible: all
deadline_factor: 3
deadline_slack_s: 3600
market: {preemption: observed, offset_s: 1000}
"""


def _experiment(tmp_path: Path, entry_extra: str) -> Path:
    (tmp_path / "sc.yaml").write_text(SCENARIO)
    p = tmp_path / "exp.yaml"
    p.write_text(f"""
name: t
scenarios:
  - name: v100
    scenario: sc.yaml
    train_window_h: [0, 24]
    eval_windows_h: [[48, 60]]
{entry_extra}
""")
    return p


def test_market_offsets_are_price_periods_on_top_of_the_scenarios_offset(tmp_path: Path) -> None:
    exp = load_experiment(_experiment(tmp_path, "    market_offsets_h: [0, 100]\n    load_factors: [0.3, 0.5]"))
    assert exp.scenarios[0].market_offsets_h == (0.0, 100.0)
    worlds = training_worlds(exp.scenarios)
    assert len(worlds) == 4  # 2 periods x 2 loads
    offsets = sorted({w.scenario.market.offset_s for w in worlds})  # type: ignore[attr-defined]
    assert offsets == [1000.0, 1000.0 + 100 * 3600.0]
    assert all("@market+" in w.label for w in worlds)
    evals = evaluation_worlds(exp.scenarios, 500)
    assert len(evals) == 4 and all(w.end_h == 60 for w in evals)
    # the scenario's own market (observed lifetimes) is what every variant replays
    for w in worlds:
        m = w.scenario.market
        assert isinstance(m, TableMarket) and isinstance(m.preemption["V100-16GB"], KaplanMeierPreemption)


def test_cluster_override_keeps_the_scenarios_market(tmp_path: Path) -> None:
    exp = load_experiment(_experiment(tmp_path, '    clusters: ["spot:0-1x8xV100-16GB,ondemand:0-1x8xV100-16GB"]'))
    (w,) = training_worlds(exp.scenarios)
    m = w.scenario.market
    assert isinstance(m, TableMarket) and m.offset_s == 1000.0
    assert isinstance(m.preemption["V100-16GB"], KaplanMeierPreemption)
    assert sum(p.max_nodes for p in w.scenario.pools) == 2


@pytest.mark.parametrize("bad", ["[-1]", "5", "[a]"])
def test_bad_market_offsets(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ExperimentError, match="market_offsets_h: a list of hours >= 0"):
        load_experiment(_experiment(tmp_path, f"    market_offsets_h: {bad}"))
