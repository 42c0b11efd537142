"""Counterfactual labels of the heuristic selector: faithful copies, the owed-work charge, soft targets, cloning."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from rlsched.envs.regime import REGIME_FEATURES
from rlsched.envs.selector_env import SelectorEnv
from rlsched.scenario import Scenario, load_scenario
from rlsched.train.config import SelectorParams
from rlsched.train.selector_labels import SelectorLabels, clone_labels, collect_labels, owed_work, rollout_cost

CANDIDATES = ["weighted-priority", "sjf", "fair-share"]


@pytest.fixture(scope="module")
def onprem() -> Scenario:
    return load_scenario({"name": "onprem", "cluster": "2x8xA100-80GB",
                          "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 150}], "load_factor": 1.2})


def _busy_env(onprem: Scenario) -> SelectorEnv:
    env = SelectorEnv([onprem], CANDIDATES, hold_s=1800.0, episode_jobs=None)
    env.reset(seed=0)
    while len(env.engine.state.queue) < 5:
        env.step(0)
    return env


def test_a_rollout_is_the_real_future_and_leaves_the_env_untouched(onprem: Scenario) -> None:
    env = _busy_env(onprem)
    now, queue = env.engine.now, sorted(env.engine.state.queue)
    rng = copy.deepcopy(env.np_random.bit_generator.state)
    costs = [rollout_cost(env, k, 6 * 3600.0) for k in range(len(CANDIDATES))]
    assert env.engine.now == now and sorted(env.engine.state.queue) == queue
    assert env.np_random.bit_generator.state == rng
    assert len(set(costs)) > 1  # the candidates differ from this state
    # candidate 1 stepped for real over the same horizon costs what its rollout said
    start, real = env.engine.now, 0.0
    while True:
        _, _, term, trunc, info = env.step(1)
        real += info["job_seconds"]
        if term or trunc or env.engine.now - start >= 6 * 3600.0:
            break
    assert real + owed_work(env.engine.state) == pytest.approx(costs[1], rel=1e-12)


def test_owed_work_charges_every_job_its_estimated_remaining_time(onprem: Scenario) -> None:
    env = _busy_env(onprem)
    st = env.engine.state
    est = st.estimator
    expected = sum(est.estimate(r.job) for r in st.queue.values())
    expected += sum(max(est.estimate(r.job) - r.work_done, 0.0) for r in st.running.values())
    assert owed_work(st) == pytest.approx(expected) and owed_work(st) > 0


def test_soft_targets_share_ties_and_favour_a_decisive_winner() -> None:
    labels = SelectorLabels(np.zeros((2, len(REGIME_FEATURES)), dtype=np.float32),
                            np.array([[100.0, 100.0, 100.0], [100.0, 150.0, 130.0]]))
    t = labels.targets(0.02)
    assert np.allclose(t[0], 1 / 3)
    assert t[1, 0] > 0.999


def test_the_safest_candidate_has_the_mildest_worst_state() -> None:
    costs = np.array([[100.0, 110.0, 100.0],   # regrets 1.0, 1.1, 1.0
                      [100.0, 105.0, 300.0],   # 1.0, 1.05, 3.0
                      [250.0, 100.0, 100.0]])  # 2.5, 1.0, 1.0
    labels = SelectorLabels(np.zeros((3, len(REGIME_FEATURES)), dtype=np.float32), costs)
    assert labels.safest() == 1  # wins no state, but is never more than 1.1 times the best
    tied = SelectorLabels(np.zeros((2, len(REGIME_FEATURES)), dtype=np.float32),
                          np.array([[100.0, 120.0], [120.0, 100.0], ]))
    assert tied.safest() == 0  # equal worst and mean regret: the first


def test_cloning_learns_a_regime_dependent_choice() -> None:
    from sb3_contrib import MaskablePPO

    from rlsched.envs.selector_env import SelectorEnv as Env

    sc = load_scenario({"name": "q", "cluster": "1x8xA100-80GB",
                        "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 20}]})
    ppo = MaskablePPO("MlpPolicy", Env([sc], CANDIDATES, episode_jobs=None), n_steps=32, batch_size=32, seed=0,
                      device="cpu", policy_kwargs={"net_arch": [16, 16]})
    rng = np.random.default_rng(0)
    obs = rng.uniform(0, 2, (400, len(REGIME_FEATURES))).astype(np.float32)
    # candidate 1 wins where the first feature (backlog) is high, candidate 0 elsewhere, 2 never
    costs = np.where(obs[:, :1] > 1.0, [[110.0, 100.0, 120.0]], [[100.0, 110.0, 120.0]])
    params = SelectorParams(tuple(CANDIDATES), label_temperature=0.02, label_epochs=300)
    stats = clone_labels(ppo.policy, SelectorLabels(obs, costs), params, seed=0, batch_size=64)
    assert stats["selector/agreement_after"] > 0.95 > stats["selector/agreement_before"]


def test_collect_labels_labels_only_states_with_a_choice(onprem: Scenario) -> None:
    logs: list[str] = []
    params = SelectorParams(tuple(CANDIDATES), hold_s=1800.0, episode_jobs=1_000_000, label_count=6, label_every=1,
                            label_horizon_s=3600.0)
    labels = collect_labels([onprem], params, 0, logs.append)
    assert labels.obs.shape == (6, len(REGIME_FEATURES)) and labels.costs.shape == (6, 3)
    assert (labels.costs > 0).all() and sum(labels.wins.values()) == 6
    # every labelled state had a queue to order (its backlog feature is not zero)
    assert (labels.obs[:, REGIME_FEATURES.index("log_queued_jobs_per_node")] > 0).all()


def test_labels_can_follow_a_given_policy_and_add_up(onprem: Scenario) -> None:
    """DAgger: the labelled trajectory is the given policy's - every step takes its choice, whoever won the label."""
    params = SelectorParams(tuple(CANDIDATES), hold_s=1800.0, episode_jobs=1_000_000, label_count=4, label_every=2,
                            label_horizon_s=3600.0)
    taken: list[int] = []

    def always_weighted_priority(obs: np.ndarray) -> int:
        assert obs.shape == (len(REGIME_FEATURES),)
        taken.append(0)
        return 0

    followed = collect_labels([onprem], params, 0, lambda _: None, follow=always_weighted_priority)
    own = collect_labels([onprem], params, 0, lambda _: None)
    assert taken and set(taken) == {0} and followed.obs.shape == own.obs.shape == (4, len(REGIME_FEATURES))
    assert own.wins["sjf"] >= 1  # the winners' trajectory takes SJF at least once here
    assert sum(followed.wins.values()) == 4  # the follower's states are labelled with who won there
    # the first label is taken before any choice, so it is the same state; later ones are the follower's
    assert np.array_equal(followed.obs[0], own.obs[0]) and not np.array_equal(followed.obs, own.obs)
    both = own + followed
    assert both.obs.shape == (8, len(REGIME_FEATURES)) and both.costs.shape == (8, 3)
    assert both.wins == own.wins + followed.wins and both.wall_s == pytest.approx(own.wall_s + followed.wall_s)
