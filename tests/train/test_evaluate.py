"""Evaluation tables: on-demand-relative spot columns and extra competitors (the teacher row)."""

from __future__ import annotations

import pytest

from rlsched.cluster.shorthand import parse_cluster
from rlsched.scenario import Scenario, apply_workload_options, build_market, load_jobs
from rlsched.train.evaluate import ONDEMAND_REFERENCE, comparison_markdown, evaluate
from rlsched.train.teacher import TeacherScheduler
from rlsched.train.worlds import World


def _world(label: str, offset_s: float) -> World:
    pools = parse_cluster("spot:0-2x8xH100-80GB,ondemand:0-2x8xH100-80GB")
    raw, src = load_jobs([{"path": "bundled:philly-3day.csv", "max_jobs": 80}], None)
    jobs = apply_workload_options(raw, pools, load_factor=0.4, preemptible="all", deadline_factor=3,
                                  deadline_slack_s=3600)
    market = build_market({"offset_s": offset_s}, pools)
    return World(label, Scenario(label, pools, jobs, market, source=src))


def test_spot_columns_are_means_of_per_world_ratios_and_extra_rows_run() -> None:
    worlds = [_world("june-2024", 0.0), _world("march-2025", 24_700_000.0)]
    res = evaluate(worlds, None, heuristics=[ONDEMAND_REFERENCE, "spot-greedy"],
                   extra=[lambda: TeacherScheduler("sjf-spot-first", 16, 4)])
    rel = res["relative"]
    assert set(rel) == {ONDEMAND_REFERENCE, "spot-greedy", "teacher:sjf-spot-first"}
    assert rel[ONDEMAND_REFERENCE]["cost_vs_ondemand"] == pytest.approx(1.0)
    per = res["worlds"]
    expect = sum(per[w]["spot-greedy"]["cost_usd"] / per[w][ONDEMAND_REFERENCE]["cost_usd"] for w in per) / 2
    assert rel["spot-greedy"]["cost_vs_ondemand"] == pytest.approx(expect)
    # spot is cheaper in both periods, much cheaper in March 2025
    assert rel["teacher:sjf-spot-first"]["cost_vs_ondemand"] < 1.0
    table = comparison_markdown(res, "t")
    assert "cost vs on-demand" in table and "deadline misses" in table
    assert "| teacher:sjf-spot-first |" in table


def test_tables_without_the_on_demand_reference_keep_their_columns() -> None:
    res = evaluate([_world("w", 0.0)], None, heuristics=["weighted-priority", "fifo"])
    assert all("cost_vs_ondemand" not in r for r in res["relative"].values())
    assert "cost vs on-demand" not in comparison_markdown(res, "t")


def test_on_prem_only_evaluation_has_no_on_demand_columns() -> None:
    pools = parse_cluster("2x8xV100-16GB")
    raw, src = load_jobs([{"path": "bundled:philly-3day.csv", "max_jobs": 40}], None)
    w = World("onprem", Scenario("onprem", pools, raw, build_market("default", pools), source=src))
    res = evaluate([w], None, heuristics=[ONDEMAND_REFERENCE, "weighted-priority"])
    assert all("cost_vs_ondemand" not in r for r in res["relative"].values())
    assert "nan" not in comparison_markdown(res, "t")
