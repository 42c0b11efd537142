"""Codec v5/v6 semantics: checkpoint age, a spot pool's work at risk, waiting while only on-demand fits."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from rlsched.cluster.decisions import Decision, WakeAt
from rlsched.cluster.model import ClusterState, PoolKind
from rlsched.envs import ObservationCodec
from rlsched.sim.engine import Engine, SimConfig
from tests.sim.helpers import FakeMarket, Greedy, job, pool


def test_checkpoint_age_and_spot_exposure_follow_the_engine() -> None:
    # j (2 GPUs, 3000 s) runs on spot node 1 from t=0, checkpointing every 300 s; the node is reclaimed at
    # t=1000, keeping the checkpoint written at 900. The pool's minimum asks for a replacement (ready at 1100).
    market = FakeMarket(price=1.0, lifetimes=[1000.0, 1e9])
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=2, lo=1, gpus=2, delay=100.0),
             pool("od", kind=PoolKind.ONDEMAND, nodes=1, gpus=2, delay=100.0)]
    cfg = SimConfig(checkpoint_interval_s=300.0, restart_overhead_s=60.0)
    codec = ObservationCodec(window=4, max_pools=2)
    age = codec.job_features.index("log_checkpoint_age_h")
    exposed = codec.pool_features.index("log_exposed_gpu_h")
    seen: dict[float, dict[str, np.ndarray]] = {}

    def hook(state: ClusterState) -> Iterator[Decision]:
        seen[state.time] = codec.encode(state)
        if state.time == 0.0:
            yield WakeAt(500.0)
        if state.time == 1000.0:
            yield WakeAt(1050.0)

    e = Engine(pools, [job("j", 0, 3000, 2, preemptible=True)], market, cfg)
    e.run(Greedy(hook=hook))
    assert e.state.checkpoint_interval_s == 300.0  # the world's default reaches the state the codec reads
    # t=500: 500 s done, 300 checkpointed: 200 s x 2 GPUs at risk on the spot pool, none on on-demand
    assert seen[500.0]["pools"][0, exposed] == pytest.approx(math.log1p(400.0 / 3600.0))
    assert seen[500.0]["pools"][1, exposed] == 0.0
    # t=1000: reclaimed and queued; its checkpoint (work 900) was written at t=900, nothing runs any more
    assert seen[1000.0]["jobs"][0, age] == pytest.approx(math.log1p(100.0 / 3600.0))
    assert seen[1000.0]["pools"][0, exposed] == 0.0
    assert seen[1050.0]["jobs"][0, age] == pytest.approx(math.log1p(150.0 / 3600.0))
    # a job that never ran holds no checkpoint
    assert seen[0.0]["jobs"][0, age] == 0.0
    assert e.runs["j"].finish_time is not None


@pytest.mark.parametrize(("spot_nodes", "wait_legal"), [(0, True), (1, False)])
def test_waiting_is_legal_while_only_on_demand_capacity_fits(spot_nodes: int, wait_legal: bool) -> None:
    # One held on-demand node with free GPUs; the queued job fits it. Without a ready spot node
    # the policy may wait (let the on-demand node drain) instead of feeding it; with one, the
    # action space stays work-conserving.
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=2, lo=spot_nodes, gpus=2),
             pool("od", kind=PoolKind.ONDEMAND, nodes=2, lo=1, gpus=2)]
    e = Engine(pools, [job("j", 0, 100, 1, preemptible=True)], FakeMarket(price=1.0))
    e.reset()
    assert e.advance()
    codec = ObservationCodec(window=4, max_pools=2)
    mask = codec.mask(e.state)
    assert mask[0 * 2 + 1]  # place j in the on-demand pool
    assert bool(mask[0 * 2 + 0]) is bool(spot_nodes)  # ... or in the spot pool, when it holds a node
    assert bool(mask[codec.wait_action]) is wait_legal


def test_the_environment_runs_the_deadline_guard_before_the_agent() -> None:
    # No spot is sold and the agent always waits when it may: alone, the deadline job is only
    # placed when waiting is masked (nothing runs or provisions) - on the on-demand node the agent
    # must buy. With the guard the guard buys it at the job's latest safe start (1900 + 1 s, see
    # tests/policies/test_deadline_guard.py) and the job meets its deadline, the agent never acting.
    from rlsched.envs import GpuPoolEnv
    from rlsched.scenario import Scenario

    pools = [pool("spot", kind=PoolKind.SPOT, nodes=1, gpus=1, delay=40.0),
             pool("od", kind=PoolKind.ONDEMAND, nodes=1, gpus=1, delay=40.0)]
    jobs = [job("j", 0, 1000, preemptible=True, deadline=4000.0)]
    sc = Scenario("guarded", pools, jobs, FakeMarket(price=1.0, avail=[(0.0, 0)]),
                  SimConfig(oracle_durations=True))
    env = GpuPoolEnv(sc, window=2, max_pools=2, rules={"deadline_guard": {"margin_frac": 0.25, "min_margin_s": 300.0}})
    env.reset(seed=0)
    steps = 0
    done = False
    while not done:
        mask = env.action_masks()
        assert not mask[: env.codec.wait_action].any() or mask[env.codec.wait_action], "agent forced to act"
        _, _, done, _, info = env.step(env.codec.wait_action)
        steps += 1
    run = env.engine.runs["j"]
    assert run.first_start == pytest.approx(1941.0)
    assert run.placement is None and run.finish_time == pytest.approx(2941.0)
    assert info["report"]["deadline_misses"] == 0


def test_the_environment_runs_consolidation_before_the_agent_and_refuses_unknown_rules() -> None:
    # tests/policies/test_consolidate.py's base case, with an agent that places a queued job when
    # it can, buys a node when it cannot, and otherwise waits: at 1,000 s the two half-used nodes
    # become one before the agent sees the state.
    from rlsched.envs import GpuPoolEnv
    from rlsched.scenario import Scenario

    pools = [pool("el", kind=PoolKind.ONDEMAND, nodes=3, lo=0, gpus=2)]
    jobs = [job(x, 0, d, preemptible=True) for x, d in (("a", 10_000), ("b", 1000), ("c", 10_000), ("d", 1000))]
    sc = Scenario("consolidated", pools, jobs, FakeMarket(price=1.0), SimConfig(oracle_durations=True))
    with pytest.raises(ValueError, match="unknown rule"):
        GpuPoolEnv(sc, window=4, max_pools=1, rules={"consolidation": {}})
    env = GpuPoolEnv(sc, window=4, max_pools=1, rules={"consolidate": {}})
    env.reset(seed=0)
    done = False
    codec = env.codec
    while not done:
        mask = env.action_masks()
        place = [a for a in range(codec.reconfigure_offset) if mask[a]]
        buy = codec.scale_offset  # pool 0, up
        action = place[0] if place else buy if env.engine.state.queue and mask[buy] else codec.wait_action
        _, _, done, _, info = env.step(action)
    assert sum(r.restarts for r in env.engine.runs.values()) == 1
    assert info["report"]["jobs_completed"] == 4


def test_the_environment_runs_long_job_preemption_before_the_agent() -> None:
    # tests/policies/test_preempt_long.py's base case: one GPU, a 100,000 s preemptible job running,
    # a 100 s job arriving at 1,000 s. The agent only places what fits and otherwise waits; the rule
    # suspends the long job and starts the short one before the agent sees the state.
    from rlsched.envs import GpuPoolEnv
    from rlsched.scenario import Scenario

    jobs = [job("long", 0, 100_000, preemptible=True), job("short", 1000, 100)]
    sc = Scenario("long-and-short", [pool("p")], jobs, FakeMarket(), SimConfig(oracle_durations=True))
    env = GpuPoolEnv(sc, window=4, max_pools=1, rules={"preempt_long": {}})
    env.reset(seed=0)
    done = False
    while not done:
        mask = env.action_masks()
        place = [a for a in range(env.codec.reconfigure_offset) if mask[a]]
        _, _, done, _, info = env.step(place[0] if place else env.codec.wait_action)
    runs = env.engine.runs
    assert runs["long"].restarts == 1 and runs["short"].restarts == 0
    assert runs["short"].finish_time == pytest.approx(1100.0)
    assert info["report"]["jobs_completed"] == 2


def test_waiting_is_masked_only_where_nothing_is_left_to_happen() -> None:
    # Nothing runs or comes up and the queued job fits the held on-demand node. The environment lets a policy
    # wait while an event is still due (a later arrival), so the served loop must too; the live runtime, which
    # cannot say what is due, keeps the guess "nothing runs and nothing is coming up".
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=2, lo=0, gpus=2),
             pool("od", kind=PoolKind.ONDEMAND, nodes=2, lo=1, gpus=2)]
    e = Engine(pools, [job("j", 0, 100, 1, preemptible=True), job("later", 5000, 100, 1, preemptible=True)],
               FakeMarket(price=1.0))
    e.reset()
    assert e.advance() and not e.state.running
    codec = ObservationCodec(window=4, max_pools=2)
    mask = codec.mask(e.state)
    assert mask[codec.wait_action] and e.next_event_time() is not None
    assert codec.unstranded(e.state, mask)[codec.wait_action]  # "later" is still due: as in training
    e.state.next_event_due = None  # the live runtime
    assert not codec.unstranded(e.state, mask)[codec.wait_action]
    assert mask[codec.wait_action]  # the mask given is never changed
