"""``sjf-spot-reserve``: the spot teacher for bursts of deadline jobs that fill spot.

Each test builds the state the rule is about on a real engine: a spot pool held at its maximum
and full (no spot can come for a queued job), a held on-demand node, and a queue of deadline jobs.
"""

from __future__ import annotations

import numpy as np

from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, PoolKind
from rlsched.envs import ObservationCodec
from rlsched.envs.teacher_actions import (
    STUCK_EARLY_S,
    _reserve_risk,
    acting_teachers,
    at_risk,
    ondemand_room,
    teacher_action,
)
from rlsched.sim.engine import Engine, SimConfig
from tests.sim.helpers import FakeMarket, Greedy, job, pool

H = 3600.0


def _queued(jobs: list[Job], spot_lo: int = 1, od_nodes: int = 1, onprem_gpus: int = 0) -> ClusterState:
    """The state once every job has arrived: only t=0's decisions are applied (the blocker fills spot)."""
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=1, lo=spot_lo, gpus=2),
             pool("od", kind=PoolKind.ONDEMAND, nodes=od_nodes, lo=1, gpus=2, delay=300.0)]
    if onprem_gpus:
        pools.append(pool("onprem", nodes=1, gpus=onprem_gpus))
    eng = Engine(pools, jobs, FakeMarket(price=1.0), SimConfig(oracle_durations=True))
    eng.reset()
    greedy = Greedy()
    last = max(j.submit_time for j in jobs)
    while eng.advance():
        if eng.state.time == 0.0:
            for d in greedy.decide(eng.state):
                eng.apply(d)
        if eng.state.time >= last:
            break
    return eng.state


def _blocker() -> Job:
    return job("blocker", 0, 100 * H, 2, preemptible=True)


def test_ondemand_room_counts_free_provisioning_and_unbought_gpus() -> None:
    st = _queued([_blocker(), job("x", 10, 60, 1, preemptible=True)], od_nodes=3)
    pools = list(st.pools.values())
    # one held on-demand node with 2 free GPUs, two more nodes of 2 GPUs that may still be bought
    assert ondemand_room(st, pools) == 2 + 2 * 2
    assert ondemand_room(st, pools[:1]) == 0  # the spot pool alone


def test_a_job_no_spot_can_come_for_goes_first_by_deadline_and_turns_urgent_earlier() -> None:
    now = 600.0
    # "short" is the SJF pick; "due" is longer but its slack (deadline - now - work) lies between
    # work + delay and work + delay + STUCK_EARLY_S: at risk only because no spot can come for it
    due_deadline = now + 2 * H + 300.0 + STUCK_EARLY_S / 2
    jobs = [_blocker(), job("short", 100, 600, 1, preemptible=True, deadline=100 + 48 * H),
            job("due", now, H, 1, preemptible=True, deadline=due_deadline)]
    st = _queued(jobs)
    assert st.time == now and set(st.queue) == {"short", "due"}
    codec = ObservationCodec(window=4, max_pools=2)
    runs = codec.window_runs(st)
    ids = [r.job.job_id for r in runs]
    pools = list(st.pools.values())
    risky, first = _reserve_risk(st, pools, runs, now, 300.0)
    assert dict(zip(ids, risky, strict=True)) == {"short": False, "due": True}
    assert all(first)  # both are stuck: spot is full and at its maximum
    assert not at_risk(runs[ids.index("due")], H, now, 300.0)  # sjf-spot-first would still wait
    mask = codec.mask(st)
    # sjf-spot-first waits for spot (neither job is at risk to it); the reserve teacher puts "due" on
    # the held on-demand node
    assert teacher_action(codec, st, mask, rule="sjf-spot-first") == codec.wait_action
    a = teacher_action(codec, st, mask, rule="sjf-spot-reserve")
    assert ids[a // codec.max_pools] == "due"
    assert pools[a % codec.max_pools].spec.kind is PoolKind.ONDEMAND


def test_jobs_no_spot_can_come_for_take_on_prem_by_deadline_not_by_length() -> None:
    # spot is full and at its maximum, one on-prem GPU is free. Two relaxed jobs wait: SJF gives it
    # to "short"; the reserve teacher to "sooner", whose deadline is nearer (both far off)
    now = 600.0
    jobs = [_blocker(), job("short", 100, 600, 1, preemptible=True, deadline=100 + 48 * H),
            job("sooner", now, H, 1, preemptible=True, deadline=now + 24 * H)]
    st = _queued(jobs, onprem_gpus=1)
    assert set(st.queue) == {"short", "sooner"} and st.pools["onprem"].free_whole_gpus() == 1
    codec = ObservationCodec(window=4, max_pools=3)
    runs = codec.window_runs(st)
    ids = [r.job.job_id for r in runs]
    risky, first = _reserve_risk(st, list(st.pools.values()), runs, now, 300.0)
    assert not any(risky) and all(first)
    mask = codec.mask(st)
    picks = {rule: ids[teacher_action(codec, st, mask, rule=rule) // codec.max_pools]
             for rule in ("sjf-spot-first", "sjf-spot-reserve")}
    assert picks == {"sjf-spot-first": "short", "sjf-spot-reserve": "sooner"}


def test_waiting_long_counts_only_while_on_demand_has_room_beyond_urgent_jobs() -> None:
    now = 2 * H
    # "waited" has queued for almost 2 h (> max(estimate, 1 h)) with two days of slack; "urgent" needs
    # the held on-demand node's 2 GPUs now. sjf-spot-first sends both to on-demand; the reserve
    # teacher keeps "waited" off it, since the room left after the urgent demand is 0 GPUs.
    jobs = [_blocker(), job("waited", 60, 600, 2, preemptible=True, deadline=60 + 48 * H),
            job("urgent", now, H, 2, preemptible=True, deadline=now + H + 600.0)]
    st = _queued(jobs)
    codec = ObservationCodec(window=4, max_pools=2)
    runs = codec.window_runs(st)
    ids = [r.job.job_id for r in runs]
    waited = runs[ids.index("waited")]
    assert at_risk(waited, 600.0, now, 300.0)
    risky, _ = _reserve_risk(st, list(st.pools.values()), runs, now, 300.0)
    assert dict(zip(ids, risky, strict=True)) == {"waited": False, "urgent": True}
    # with room to spare (a second on-demand node to buy), waiting long counts again
    st2 = _queued(jobs, od_nodes=2)
    runs2 = codec.window_runs(st2)
    risky2, _ = _reserve_risk(st2, list(st2.pools.values()), runs2, now, 300.0)
    assert all(risky2)


def test_the_reserve_teacher_is_listed_and_acts_legally_on_a_mixed_queue() -> None:
    from rlsched.cluster.shorthand import parse_cluster
    from rlsched.market import default_market
    from rlsched.train.teacher import TeacherScheduler

    assert "sjf-spot-reserve" in acting_teachers()
    jobs = [Job(f"j{i}", 30.0 * i, 600.0 + 97.0 * (i % 7), num_gpus=1 + (i % 4), preemptible=i % 5 != 0,
                deadline=30.0 * i + 3 * (600.0 + 97.0 * (i % 7)) + 3600.0) for i in range(60)]
    eng = Engine(parse_cluster("spot:0-1x8xV100-16GB,ondemand:0-2x8xV100-16GB"), jobs, default_market(),
                 SimConfig(seed=0))
    rep = eng.run(TeacherScheduler("sjf-spot-reserve", window=8, max_pools=2))
    assert rep.jobs_completed == 60 and rep.refused_decisions == 0
    assert np.isfinite(rep.cost_usd) and rep.cost_usd > 0


def test_where_waiting_could_strand_the_queue_the_reserve_teacher_still_acts_legally() -> None:
    # Spot is one ready node of 2 GPUs at its maximum; a relaxed 4-GPU gang fits nowhere and nothing runs.
    # While an event is still due, waiting stays legal (the environment's rule); once nothing is left to
    # happen the loop masks it. sjf-spot-first still answers "wait" then (its scheduler ends the decision
    # point; an anchored network cannot take it); sjf-spot-reserve buys on-demand.
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=1, lo=1, gpus=2),
             pool("od", kind=PoolKind.ONDEMAND, nodes=2, lo=0, gpus=2, delay=300.0)]
    eng = Engine(pools, [job("gang", 0, H, 4, preemptible=True, deadline=48 * H)], FakeMarket(price=1.0),
                 SimConfig(oracle_durations=True))
    eng.reset()
    assert eng.advance()
    st = eng.state
    codec = ObservationCodec(window=4, max_pools=2)
    st.next_event_due = lambda: st.time + 60.0
    assert codec.unstranded(st, codec.mask(st))[codec.wait_action]
    st.next_event_due = lambda: None  # what the simulator says when nothing is left to happen
    mask = codec.unstranded(st, codec.mask(st))
    assert not mask[codec.wait_action] and mask.any()
    assert teacher_action(codec, st, mask, rule="sjf-spot-first") == codec.wait_action  # illegal here
    a = teacher_action(codec, st, mask, rule="sjf-spot-reserve")
    assert mask[a] and a == codec.scale_offset + 2 * 1  # one on-demand node


def test_a_spot_teacher_brings_every_other_spot_teacher_along() -> None:
    from rlsched.envs.teacher_actions import with_spot_teachers

    assert with_spot_teachers(["sjf-spot-reserve"]) == ["sjf-spot-reserve", "sjf-spot-first"]
    assert with_spot_teachers(["sjf", "sjf-spot-first"]) == ["sjf", "sjf-spot-first", "sjf-spot-reserve"]
    assert with_spot_teachers(["sjf"]) == ["sjf"]  # an on-prem teacher brings none
