"""The cost-aware teacher of the spot experiment: spot first, on-demand only for jobs at risk."""

from __future__ import annotations

from rlsched.cluster.job import Job
from rlsched.cluster.model import JobRun
from rlsched.cluster.shorthand import parse_cluster
from rlsched.market import default_market
from rlsched.sim.engine import Engine, SimConfig
from rlsched.sim.metrics import Report
from rlsched.train.teacher import AT_RISK_WAIT_S, TeacherScheduler, at_risk

HYBRID = "spot:0-2x8xV100-16GB,ondemand:0-2x8xV100-16GB"


def _run(jobs: list[Job], rule: str = "sjf-spot-first", cluster: str = HYBRID) -> tuple[Engine, Report]:
    eng = Engine(parse_cluster(cluster), jobs, default_market(), SimConfig(seed=0))
    return eng, eng.run(TeacherScheduler(rule, window=8, max_pools=2))


def test_at_risk_rule() -> None:
    now = 10_000.0
    run = JobRun(Job("j", 0.0, 3600.0, preemptible=True, deadline=now + 10 * 3600.0))
    run.enqueued_at = now - 600.0
    assert not at_risk(run, 3600.0, now, 300.0)  # 9 h of slack for 1 h of work, queued 10 min
    run.enqueued_at = now - 3601.0
    assert at_risk(run, 3600.0, now, 300.0)  # queued longer than max(estimate, 1 h): spot is not coming
    tight = JobRun(Job("t", 0.0, 3600.0, preemptible=True, deadline=now + 2 * 3600.0))
    assert at_risk(tight, 3600.0, now, 300.0)  # 1 h of slack < 1 h of work + provisioning
    assert at_risk(JobRun(Job("np", 0.0, 60.0, preemptible=False)), 60.0, now, 300.0)
    waiting = JobRun(Job("w", 0.0, 60.0, preemptible=True))
    waiting.enqueued_at = now - AT_RISK_WAIT_S - 1.0
    assert at_risk(waiting, 60.0, now, 300.0)  # no deadline, queued longer than max(estimate, 1 h)
    waiting.enqueued_at = now - 60.0
    assert not at_risk(waiting, 60.0, now, 300.0)


def test_relaxed_preemptible_jobs_never_buy_on_demand() -> None:
    jobs = [Job(f"j{i}", 10.0 * i, 1800.0, num_gpus=4, preemptible=True, deadline=10.0 * i + 48 * 3600.0)
            for i in range(6)]
    _, rep = _run(jobs)
    assert rep.jobs_completed == 6 and rep.refused_decisions == 0
    assert rep.cost_spot_usd > 0 and rep.cost_ondemand_usd == 0.0
    # the cheapest-pool SJF teacher, by contrast, buys whatever is cheapest with room, spot first too,
    # but then on-demand for the queue that spot cannot take at once
    _, greedy = _run(jobs, rule="sjf", cluster="spot:0-1x8xV100-16GB,ondemand:0-2x8xV100-16GB")
    assert greedy.cost_ondemand_usd > 0


def test_jobs_that_cannot_use_spot_or_are_late_get_on_demand() -> None:
    jobs = [Job("np", 0.0, 1800.0, num_gpus=2, preemptible=False),
            Job("tight", 0.0, 1800.0, num_gpus=2, preemptible=True, deadline=1800.0 + 900.0)]
    eng, rep = _run(jobs)
    assert rep.jobs_completed == 2 and rep.refused_decisions == 0
    assert rep.cost_ondemand_usd > 0
    runs = {r.job.job_id: r for r in eng.finished}
    assert not runs["np"].on_spot  # never on spot: it cannot survive a reclaim
    assert not runs["tight"].on_spot  # at risk from the start: bought on-demand for it
    assert rep.cost_spot_usd == 0.0 and rep.deadline_misses == 0


def test_teacher_scheduler_always_acts_legally_on_a_mixed_queue() -> None:
    jobs = [Job(f"j{i}", 30.0 * i, 600.0 + 97.0 * (i % 7), num_gpus=1 + (i % 4), preemptible=i % 5 != 0,
                deadline=30.0 * i + 3 * (600.0 + 97.0 * (i % 7)) + 3600.0) for i in range(60)]
    for rule in ("sjf-spot-first", "sjf", "weighted-priority"):
        _, rep = _run(jobs, rule=rule)
        assert rep.jobs_completed == 60, rule
        assert rep.refused_decisions == 0, rule


def test_at_risk_jobs_go_first_least_slack_first() -> None:
    import numpy as np

    from rlsched.envs.codec import ObservationCodec
    from rlsched.policies import make_policy
    from rlsched.train.teacher import teacher_action

    # a blocker holds the only node; then a short relaxed job and two long jobs with tight deadlines queue
    jobs = [Job("blocker", 0.0, 7200.0, num_gpus=8, preemptible=True),
            Job("short", 10.0, 60.0, preemptible=True),
            Job("late", 20.0, 3600.0, preemptible=True, deadline=20.0 + 3600.0 + 2000.0),
            Job("later", 30.0, 3600.0, preemptible=True, deadline=30.0 + 3600.0 + 1000.0)]
    eng = Engine(parse_cluster("1x8xV100-16GB"), jobs, default_market(), SimConfig(seed=0, oracle_durations=True))
    fifo = make_policy("fifo")
    while eng.advance():
        if {"short", "late", "later"} <= set(eng.state.queue):
            break
        for d in fifo.decide(eng.state):
            eng.apply(d)
    codec = ObservationCodec(window=8, max_pools=1)
    st = eng.state
    runs = codec.window_runs(st)
    mask = np.zeros(codec.n_actions, dtype=bool)
    for k in range(len(runs)):
        mask[k * codec.max_pools] = True
    pick = runs[teacher_action(codec, st, mask, rule="sjf-spot-first") // codec.max_pools].job.job_id
    assert pick == "later"  # at risk with the least slack, ahead of the shorter relaxed job
    assert runs[teacher_action(codec, st, mask, rule="sjf") // codec.max_pools].job.job_id == "short"


def test_relaxed_jobs_wait_for_spot_rather_than_feed_a_held_on_demand_node() -> None:
    # "tight" buys an on-demand node at t=0 (2 of its 8 GPUs used); relaxed jobs arriving later fit
    # that node, but the teacher waits for spot instead, so the on-demand node drains and stops.
    jobs = [Job("tight", 0.0, 1800.0, num_gpus=2, preemptible=True, deadline=1800.0 + 900.0)]
    jobs += [Job(f"r{i}", 600.0 + i, 3600.0, num_gpus=2, preemptible=True, deadline=600.0 + 48 * 3600.0)
             for i in range(3)]
    eng, rep = _run(jobs)
    assert rep.jobs_completed == 4 and rep.refused_decisions == 0 and rep.deadline_misses == 0
    runs = {r.job.job_id: r for r in eng.finished}
    assert not runs["tight"].on_spot
    assert all(runs[f"r{i}"].on_spot for i in range(3))
