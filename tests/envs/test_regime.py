"""Regime features: zero on an idle cluster, and the same numbers on a fleet twice the size."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.cluster.job import Job
from rlsched.cluster.shorthand import parse_cluster
from rlsched.envs.regime import CLIP, REGIME_FEATURES, regime_features
from rlsched.sim import Engine


def _state_after(nodes: int, copies: int, t: float = 3600.0) -> np.ndarray:
    """Features at ``t`` of a fleet of ``nodes`` x 8 GPUs where ``copies`` users each submitted the same jobs."""
    jobs = [Job(f"u{c}-j{i}", 60.0 * i, 3600.0 * (1 + i % 5), num_gpus=8, user=f"u{c}")
            for c in range(copies) for i in range(12)]
    engine = Engine(parse_cluster(f"{nodes}x8xA100-80GB"), jobs)
    from rlsched.policies import make_policy

    sched = make_policy("weighted-priority")
    sched.reset(engine.state)
    while engine.advance() and engine.now < t:
        for d in sched.decide(engine.state):
            engine.apply(d)
    return regime_features(engine.state)


def test_an_idle_cluster_reads_zero_backlog() -> None:
    engine = Engine(parse_cluster("2x8xA100-80GB"), [Job("j", 10.0, 60.0)])
    x = regime_features(engine.state)
    assert x.shape == (len(REGIME_FEATURES),) and x.dtype == np.float32
    assert x[REGIME_FEATURES.index("log_queued_gpus_per_gpu")] == 0.0
    assert x[REGIME_FEATURES.index("top_user_share")] == 0.0


def test_features_keep_their_range_when_fleet_and_queue_double() -> None:
    """Twice the nodes and twice the (same) demand: the backlog ratios and shares are unchanged."""
    small, big = _state_after(2, 1), _state_after(4, 2)
    for name in ("log_queued_gpus_per_gpu", "log_queued_jobs_per_node", "utilisation", "fractional_share",
                 "gang_share", "log_estimate_spread"):
        i = REGIME_FEATURES.index(name)
        assert abs(float(small[i]) - float(big[i])) < 1e-5, name
    assert small[REGIME_FEATURES.index("log_queued_gpus_per_gpu")] > 0.5  # a real backlog
    # one tenant owns the small queue; two share the big one equally
    assert small[REGIME_FEATURES.index("top_user_share")] == 1.0
    assert big[REGIME_FEATURES.index("top_user_share")] == 0.5
    assert (small >= 0).all() and (small <= CLIP).all()


def test_gang_and_fractional_shares() -> None:
    jobs = [Job("big", 0.0, 3600.0, num_gpus=16), Job("half", 0.0, 3600.0, num_gpus=1, gpu_milli=500),
            Job("one", 0.0, 3600.0)]
    engine = Engine(parse_cluster("2x8xA100-80GB"), jobs)  # the 16-GPU job spans both nodes: a gang
    assert engine.advance()
    x = regime_features(engine.state)
    assert abs(float(x[REGIME_FEATURES.index("gang_share")]) - 1 / 3) < 1e-6
    assert abs(float(x[REGIME_FEATURES.index("fractional_share")]) - 1 / 3) < 1e-6


def test_a_cold_estimator_says_so() -> None:
    """Before any job finished the error reads 0; confidence and the never-estimated share tell it apart."""
    jobs = [Job("a1", 0.0, 600.0, user="a"), Job("a2", 10.0, 600.0, user="a"), Job("b1", 20.0, 600.0, user="b"),
            Job("a3", 1200.0, 600.0, user="a"), Job("b2", 1200.0, 600.0, user="b")]
    engine = Engine(parse_cluster("1x8xA100-80GB"), jobs)
    from rlsched.policies import make_policy

    sched = make_policy("fifo")
    sched.reset(engine.state)
    conf, unknown = REGIME_FEATURES.index("estimator_confidence"), REGIME_FEATURES.index("unestimated_share")
    seen = []
    while engine.advance():
        x = regime_features(engine.state)
        if engine.state.queue:
            seen.append((engine.now, float(x[conf]), float(x[unknown])))
        for d in sched.decide(engine.state):
            engine.apply(d)
    assert seen[0][1] == 0.0 and seen[0][2] == 1.0  # nothing finished, nobody known
    late = [s for s in seen if s[0] >= 1200.0]
    # by t=1200 a1, a2 and b1 have finished: three scored, both users known
    assert late and late[0][1] == pytest.approx(3 / 23) and late[0][2] == 0.0
    assert engine.state.estimator.scored == 5 and engine.state.estimator.knows(jobs[0])
