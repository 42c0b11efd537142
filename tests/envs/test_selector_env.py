"""SelectorEnv: a Gymnasium env whose action is which heuristic schedules the next hold_s seconds."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env

from rlsched.envs.selector_env import SelectorEnv
from rlsched.policies import make_policy
from rlsched.scenario import Scenario, load_scenario
from rlsched.sim import Engine
from rlsched.sim.engine import SimConfig

CANDIDATES = ["weighted-priority", "sjf", "fair-share", "best-fit"]


@pytest.fixture(scope="module")
def onprem() -> Scenario:
    """150 real Philly jobs queueing on two 8-GPU nodes."""
    return load_scenario({"name": "onprem", "cluster": "2x8xA100-80GB",
                          "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 150}], "load_factor": 1.2})


def _episode(env: SelectorEnv, action: int, seed: int = 0) -> tuple[float, float, int]:
    env.reset(seed=seed)
    total = job_s = 0.0
    steps = 0
    while True:
        _, r, term, trunc, info = env.step(action)
        total += r
        job_s += info["job_seconds"]
        steps += 1
        if term or trunc:
            return total, job_s, steps


def test_check_env_passes(onprem: Scenario) -> None:
    check_env(SelectorEnv([onprem], CANDIDATES, episode_jobs=60), skip_render_check=True)


def test_one_candidate_throughout_is_that_heuristic(onprem: Scenario) -> None:
    """Always choosing candidate k replays exactly what heuristic k does alone: the reward integrates the
    jobs in the system, so the episode's job-seconds are the heuristic's total JCT (Little's law)."""
    env = SelectorEnv([onprem], CANDIDATES, hold_s=1800.0, episode_jobs=None)
    for k, name in enumerate(CANDIDATES):
        _, job_s, steps = _episode(env, k)
        rep = env.engine.report(name, 0.0)
        alone = Engine(onprem.pools, onprem.jobs, onprem.market, SimConfig(seed=0)).run(make_policy(name))
        assert rep.jobs_completed == alone.jobs_completed == len(onprem.jobs)
        assert rep.mean_jct_s == pytest.approx(alone.mean_jct_s, rel=1e-9), name
        assert job_s == pytest.approx(alone.mean_jct_s * len(onprem.jobs), rel=1e-6), name
        assert steps > 3  # the episode was many choices, not one


def test_the_choice_matters_and_rewards_rank_it(onprem: Scenario) -> None:
    env = SelectorEnv([onprem], CANDIDATES, episode_jobs=None)
    returns = {name: _episode(env, k)[0] for k, name in enumerate(CANDIDATES)}
    jct = {name: Engine(onprem.pools, onprem.jobs, onprem.market).run(make_policy(name)).mean_jct_s
           for name in CANDIDATES}
    assert len({round(v, 6) for v in returns.values()}) > 1
    # a higher return is a lower mean JCT (same jobs, same fleet: the reward is minus total JCT, scaled)
    assert sorted(returns, key=returns.__getitem__) == sorted(jct, key=lambda n: -jct[n])


def test_episodes_are_random_runs_of_jobs_and_reproducible(onprem: Scenario) -> None:
    env = SelectorEnv([onprem], CANDIDATES, episode_jobs=40)
    a = _episode(env, 1, seed=3)
    b = _episode(env, 1, seed=3)
    assert a == b
    assert len(env.engine.jobs) == 40
    assert env.action_masks().tolist() == [True] * 4


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"candidates": ["sjf"]}, "at least two"),
    ({"candidates": ["sjf", "shortest"]}, "unknown policy 'shortest'"),
    ({"hold_s": 0.0}, "hold_s must be > 0"),
])
def test_bad_parameters_are_one_line_errors(onprem: Scenario, kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"candidates": CANDIDATES, **kwargs}
    cands = args.pop("candidates")
    with pytest.raises(Exception, match=message):
        SelectorEnv([onprem], cands, **args)  # type: ignore[arg-type]


def test_a_candidate_taking_over_rebuilds_its_memory_from_the_state(onprem: Scenario) -> None:
    """Tiresias keeps memory between decision points (its jobs' queues); hours another candidate scheduled
    would leave it stale, so a candidate is reset from the state it takes over - each time, and only then."""
    env = SelectorEnv([onprem], ["sjf", "tiresias"], hold_s=1800.0, episode_jobs=None)
    env.reset(seed=0)
    tiresias = env._schedulers[1]
    taken_over: list[float] = []
    plain_reset = tiresias.reset

    def reset(state):  # type: ignore[no-untyped-def]
        taken_over.append(state.time)
        plain_reset(state)

    tiresias.reset = reset
    for action in (0, 0, 1, 1, 1, 0, 1):
        _, _, term, _, _ = env.step(action)
        assert not term
    assert len(taken_over) == 2  # at the two switches to it, not at the steps it kept
    assert taken_over[0] > env.engine.t0  # mid-episode, after sjf scheduled
    while not env.step(1)[2]:
        pass
    assert env.engine.report("mix", 0.0).jobs_completed == len(onprem.jobs)
