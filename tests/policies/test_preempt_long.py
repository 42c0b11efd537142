"""Long-job preemption on constructed clusters whose right answer is known by hand.

True durations throughout (the estimate is the duration), restart overhead 60 s: a
job suspended gracefully at progress P resumes at P - 60.
"""

from __future__ import annotations

import pytest
from sim.helpers import FakeMarket, Greedy, job, pool

from rlsched.cluster.job import Job
from rlsched.cluster.model import PoolSpec
from rlsched.policies.rules.preempt_long import LongJobPreemption
from rlsched.sim.engine import Engine, SimConfig
from rlsched.sim.metrics import Report


def _replay(jobs: list[Job], rule: LongJobPreemption | None,
            pools: list[PoolSpec] | None = None) -> tuple[Engine, Report]:
    placer = Greedy(hook=rule.decide if rule is not None else None)
    e = Engine(pools or [pool("p")], jobs, FakeMarket(), SimConfig(oracle_durations=True))
    return e, e.run(placer)


def test_a_short_job_suspends_a_far_longer_one() -> None:
    jobs = [job("long", 0, 100_000, preemptible=True), job("short", 1000, 100)]
    rule = LongJobPreemption()
    e, r = _replay(jobs, rule)
    assert rule.preemptions == 1 and e.runs["long"].restarts == 1
    assert e.runs["short"].first_start == pytest.approx(1000.0)
    assert e.runs["short"].finish_time == pytest.approx(1100.0)
    assert r.lost_gpu_hours == 0.0  # graceful: only the restart overhead is repeated
    assert e.runs["long"].finish_time == pytest.approx(100_000.0 + 100.0 + 60.0)
    # without the rule the short job waits for the long one
    e, _ = _replay(jobs, None)
    assert e.runs["short"].first_start == pytest.approx(100_000.0)


@pytest.mark.parametrize("kw", [{}, {"preemptible": True, "deadline": 500_000.0}],
                         ids=["not-preemptible", "has-a-deadline"])
def test_jobs_that_may_not_be_suspended_stay(kw: dict[str, object]) -> None:
    rule = LongJobPreemption()
    e, _ = _replay([job("long", 0, 100_000, **kw), job("short", 1000, 100)], rule)
    assert rule.preemptions == 0 and e.runs["short"].first_start == pytest.approx(100_000.0)


@pytest.mark.parametrize(("long_s", "short_s", "expect"), [
    (9000.0, 1000.0, 0),     # 8,000 s left at t=1000: less than 10x the short job's 1,000
    (2000.0, 50.0, 0),       # 1,000 s left is 20x, but gains less than 3,600 GPU-s
    (20_000.0, 1000.0, 1),   # 19,000 s left: both tests pass
])
def test_only_a_wide_gap_is_worth_a_restart(long_s: float, short_s: float, expect: int) -> None:
    rule = LongJobPreemption()
    _replay([job("long", 0, long_s, preemptible=True), job("short", 1000, short_s)], rule)
    assert rule.preemptions == expect


@pytest.mark.parametrize(("restart_overhead_s", "expect"), [
    (60.0, 1),       # 19,000 s left at t=1000 against the short job's 1,000: 10x, and 3,600 s more
    (18_500.0, 0),   # a restart that repeats 18,500 s: 19,000 is not 1,000 + 18,500 longer
])
def test_the_gap_must_also_pay_for_the_restart(restart_overhead_s: float, expect: int) -> None:
    rule = LongJobPreemption(restart_overhead_s=restart_overhead_s)
    _replay([job("long", 0, 20_000, preemptible=True), job("short", 1000, 1000)], rule)
    assert rule.preemptions == expect


def test_the_restart_is_paid_on_each_of_the_victims_gpus() -> None:
    # a candidate with 1,000 GPU-s left: a victim needs 10x that, and 3,600 GPU-s or its restart's cost more
    rule = LongJobPreemption(restart_overhead_s=3000.0)
    assert rule._threshold(1000.0, 1) == 10_000.0  # 1,000 + max(3,600, 3,000) is below 10x
    assert rule._threshold(1000.0, 4) == 13_000.0  # 1,000 + 12,000 repeated on four GPUs
    assert LongJobPreemption()._threshold(1000.0, 8) == 10_000.0  # the defaults: 8 x 60 s never tops 3,600


def test_nothing_is_suspended_while_the_job_fits_elsewhere() -> None:
    rule = LongJobPreemption()
    e, _ = _replay([job("long", 0, 100_000, preemptible=True), job("short", 1000, 100)], rule,
                   pools=[pool("p", gpus=2)])
    assert rule.preemptions == 0 and e.runs["short"].first_start == pytest.approx(1000.0)


def test_a_victim_never_preempts_its_preemptor_back() -> None:
    # The suspended job requeues with ~99,000 s left; the short one holds the GPU for 5,000 s.
    rule = LongJobPreemption(factor=2.0, min_gain_gpu_s=0.0)
    e, _ = _replay([job("long", 0, 100_000, preemptible=True), job("short", 1000, 5000, preemptible=True)], rule)
    assert e.runs["long"].restarts == 1 and e.runs["short"].restarts == 0
    assert e.runs["short"].finish_time == pytest.approx(6000.0)


def test_room_is_made_where_the_fewest_gpus_are_suspended() -> None:
    # Node 0 holds two 1-GPU long jobs, node 1 one 2-GPU long job: a 2-GPU short job needs two
    # GPUs either way, and one victim (node 1) beats two.
    jobs = [job("a", 0, 100_000, preemptible=True), job("b", 0, 100_000, preemptible=True),
            job("gang", 0, 100_000, 2, preemptible=True), job("short", 1000, 100, 2)]
    rule = LongJobPreemption()
    e, _ = _replay(jobs, rule, pools=[pool("p", nodes=2, gpus=2)])
    assert rule.preemptions == 1 and e.runs["gang"].restarts == 1
    assert e.runs["a"].restarts == 0 and e.runs["b"].restarts == 0
    assert e.runs["short"].first_start == pytest.approx(1000.0)


def test_a_job_larger_than_a_node_is_no_candidate() -> None:
    jobs = [job("a", 0, 100_000, 2, preemptible=True), job("b", 0, 100_000, 2, preemptible=True),
            job("wide", 1000, 100, 4)]
    rule = LongJobPreemption()
    _replay(jobs, rule, pools=[pool("p", nodes=2, gpus=2)])
    assert rule.preemptions == 0


@pytest.mark.parametrize("kw", [{"factor": 0.5}, {"min_gain_gpu_s": -1.0}, {"scan": 0}, {"restart_overhead_s": -1.0}])
def test_bad_parameters_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="factor must be >= 1"):
        LongJobPreemption(**kw)
