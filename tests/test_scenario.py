"""Scenario options of the spot experiment: deadline slack and the spot-lifetime evidence source."""

from __future__ import annotations

import pytest

from rlsched.cluster.job import Job
from rlsched.cluster.shorthand import parse_cluster
from rlsched.errors import ScenarioError
from rlsched.market.preemption import ExponentialPreemption, KaplanMeierPreemption
from rlsched.scenario import apply_workload_options, build_market, load_scenario
from rlsched.sim.engine import Engine, SimConfig

V100 = "spot:0-4x8xV100-16GB,ondemand:0-4x8xV100-16GB"


def test_deadline_is_factor_times_duration_plus_slack() -> None:
    pools = parse_cluster(V100)
    jobs = [Job("a", 100.0, 60.0), Job("b", 200.0, 7200.0)]
    out = apply_workload_options(jobs, pools, deadline_factor=3.0, deadline_slack_s=3600.0)
    assert [j.deadline for j in out] == [100.0 + 180.0 + 3600.0, 200.0 + 21600.0 + 3600.0]
    plain = apply_workload_options(jobs, pools, deadline_factor=3.0)
    assert [j.deadline for j in plain] == [280.0, 21800.0]
    with pytest.raises(ScenarioError, match="deadline_slack_s must be >= 0"):
        apply_workload_options(jobs, pools, deadline_factor=3.0, deadline_slack_s=-1.0)
    with pytest.raises(ScenarioError, match="needs deadline_factor"):
        apply_workload_options(jobs, pools, deadline_slack_s=60.0)


def test_scenario_file_keys_for_slack_and_preemption() -> None:
    sc = load_scenario({
        "cluster": V100, "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 50}],
        "preemptible": "all", "deadline_factor": 2, "deadline_slack_s": 600,
        "market": {"preemption": "observed"},
    })
    assert all(j.deadline == pytest.approx(j.submit_time + 2 * j.duration + 600) for j in sc.jobs)
    with pytest.raises(ScenarioError, match="did you mean 'deadline_slack_s'"):
        load_scenario({"cluster": V100, "workload": "bundled:philly-3day.csv", "deadline_slak_s": 1})


def test_observed_lifetimes_replace_the_advisor_hazard() -> None:
    pools = parse_cluster(V100)
    advisor = build_market({"preemption": "advisor"}, pools)
    observed = build_market({"preemption": "observed"}, pools)
    assert isinstance(advisor.preemption["V100-16GB"], ExponentialPreemption)  # type: ignore[attr-defined]
    assert isinstance(observed.preemption["V100-16GB"], KaplanMeierPreemption)  # type: ignore[attr-defined]
    spot = pools[0]
    # the 2020 lifetimes (mean a few hours) reclaim far more often than the Spot Advisor bucket
    assert observed.reclaim_rate_per_hour(spot) > 10 * advisor.reclaim_rate_per_hour(spot)
    with pytest.raises(ScenarioError, match=r"market\.preemption must be one of advisor, observed"):
        build_market({"preemption": "sometimes"}, pools)


def test_observed_market_reclaims_and_nothing_is_lost() -> None:
    """A days-long spot run under the observed lifetimes: reclaims happen, every job still finishes."""
    from rlsched.policies import make_policy

    sc = load_scenario({
        "cluster": V100, "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 200}],
        "preemptible": "all", "market": {"preemption": "observed"}, "load_factor": 0.5,
    })
    rep = Engine(sc.pools, sc.jobs, sc.market, SimConfig(seed=0)).run(make_policy("spot-greedy"))
    assert rep.preemptions > 0 and rep.restarts > 0
    assert rep.jobs_completed == 200


def test_market_flags_replace_only_what_they_name() -> None:
    from rlsched.market import TableMarket
    from rlsched.scenario import override_market

    sc = load_scenario({
        "cluster": V100, "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 20}],
        "market": {"preemption": "observed", "offset_s": 100},
    })
    moved = override_market(sc.market, sc.pools, offset_s=5000.0)
    assert isinstance(moved, TableMarket) and moved.offset_s == 5000.0
    assert isinstance(moved.preemption["V100-16GB"], KaplanMeierPreemption)  # the scenario's source is kept
    advisor = override_market(sc.market, sc.pools, preemption="advisor")
    assert isinstance(advisor, TableMarket) and advisor.offset_s == 100.0
    assert isinstance(advisor.preemption["V100-16GB"], ExponentialPreemption)
