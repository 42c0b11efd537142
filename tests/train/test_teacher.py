"""The behaviour-cloning teachers choose what their heuristic would, among legal actions only."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.cluster.job import Job
from rlsched.cluster.shorthand import parse_cluster
from rlsched.envs.codec import ObservationCodec
from rlsched.market import default_market
from rlsched.sim.engine import Engine, SimConfig
from rlsched.train.teacher import teacher_action


def _queued_state() -> tuple[ObservationCodec, Engine]:
    """One 8-GPU node held by a blocker; three queued 1-GPU jobs whose estimates differ by user."""
    # teach the estimator: user "short" runs 60 s jobs, user "long" 5 h jobs
    jobs = [Job(f"s{i}", 1.0 + i, 60.0, user="short") for i in range(3)]
    jobs += [Job(f"l{i}", 1.0 + i, 18_000.0, user="long") for i in range(3)]
    # then a whole-node blocker, and three jobs that must queue behind it
    jobs += [Job("blocker", 40_000.0, 100_000.0, num_gpus=8, user="z")]
    jobs += [Job("old-long", 50_000.0, 18_000.0, user="long"), Job("mid", 50_001.0, 1_000.0, user="z"),
             Job("new-short", 50_002.0, 60.0, user="short")]
    eng = Engine(parse_cluster("1x8xV100-16GB"), jobs, default_market(), SimConfig(seed=0))
    from rlsched.policies import make_policy

    fifo = make_policy("fifo")
    # run until the three late jobs are queued behind a full node
    while eng.advance():
        st = eng.state
        if {"old-long", "mid", "new-short"} <= set(st.queue):
            break
        for d in fifo.decide(st):
            eng.apply(d)
    return ObservationCodec(window=8, max_pools=1), eng


def test_sjf_teacher_picks_the_shortest_estimate_and_wp_the_longest_wait() -> None:
    codec, eng = _queued_state()
    st = eng.state
    # the teachers rank by the mask they are given: offer every window job
    mask = np.zeros(codec.n_actions, dtype=bool)
    runs = codec.window_runs(st)
    ids = [r.job.job_id for r in runs]
    for k in range(len(runs)):
        mask[k * codec.max_pools] = True
    sjf = teacher_action(codec, st, mask, rule="sjf")
    wp = teacher_action(codec, st, mask)
    assert ids[sjf // codec.max_pools] == "new-short"
    assert ids[wp // codec.max_pools] == "old-long"  # equal priorities: the longest wait wins


def test_teacher_never_picks_an_illegal_action_and_rejects_unknown_rules() -> None:
    codec, eng = _queued_state()
    st = eng.state
    mask = np.zeros(codec.n_actions, dtype=bool)
    mask[codec.wait_action] = True
    for rule in ("sjf", "weighted-priority"):
        assert teacher_action(codec, st, mask, rule=rule) == codec.wait_action
    with pytest.raises(ValueError, match="unknown teacher"):
        teacher_action(codec, st, mask, rule="srtf")
