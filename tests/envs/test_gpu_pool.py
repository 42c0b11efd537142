"""The Gymnasium environment: API conformance, determinism, masks vs feasibility."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rlsched.envs
from rlsched.cluster.decisions import Place, Reconfigure, Scale
from rlsched.cluster.feasibility import check_placement, pool_candidates, reconfigure_check
from rlsched.envs import ENV_ID, GpuPoolEnv, ObservationCodec, register_envs
from rlsched.policies.heuristics.autoscale import headroom
from rlsched.scenario import Scenario, load_scenario
from tests.envs.conftest import SMALL, masked_action


def test_check_env_passes_on_default(default_scenario: Scenario) -> None:
    env = GpuPoolEnv(default_scenario)
    check_env(env, skip_render_check=True)


def test_make_with_no_arguments() -> None:
    register_envs()  # idempotent: a second registration is a no-op
    register_envs()
    env = gymnasium.make(ENV_ID)
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert isinstance(env.unwrapped, GpuPoolEnv)
    assert gymnasium.spec(ENV_ID).entry_point == "rlsched.envs.gpu_pool:GpuPoolEnv"
    assert rlsched.envs.ENV_ID == ENV_ID
    env.close()


def test_make_with_module_prefix() -> None:
    env = gymnasium.make("rlsched.envs:rlsched/GpuPool-v0")
    assert isinstance(env.unwrapped, GpuPoolEnv)


def _rollout(env: GpuPoolEnv, seed: int, steps: int) -> tuple[list[dict[str, np.ndarray]], list[float]]:
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    observations, rewards = [obs], []
    for _ in range(steps):
        obs, reward, term, trunc, _ = env.step(masked_action(env, rng))
        observations.append(obs)
        rewards.append(reward)
        if term or trunc:
            break
    return observations, rewards


def test_same_seed_same_trajectory(small_scenario: Scenario) -> None:
    a_obs, a_rew = _rollout(GpuPoolEnv(small_scenario, episode_jobs=120), 7, 400)
    b_obs, b_rew = _rollout(GpuPoolEnv(small_scenario, episode_jobs=120), 7, 400)
    assert a_rew == b_rew
    assert len(a_obs) == len(b_obs)
    for x, y in zip(a_obs, b_obs, strict=True):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    c_obs, _ = _rollout(GpuPoolEnv(small_scenario, episode_jobs=120), 8, 50)
    assert any(not np.array_equal(c_obs[0][k], a_obs[0][k]) for k in a_obs[0]) or len(c_obs) != len(a_obs)


def test_masked_actions_are_never_refused(default_scenario: Scenario) -> None:
    env = GpuPoolEnv(default_scenario)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    kinds: set[str] = set()
    for _ in range(600):
        a = masked_action(env, rng)
        kinds.add(env.codec.action_name(a).split("(")[0])
        _, _, term, _, info = env.step(a)
        assert not info["illegal_action"]
        if term:
            break
    assert info["refused"] == 0
    assert env.engine.refused == 0
    assert {"place", "scale", "reconfigure", "wait"} <= kinds


def test_mask_agrees_with_feasibility(small_scenario: Scenario) -> None:
    env = GpuPoolEnv(small_scenario, window=8)
    codec = env.codec
    rng = np.random.default_rng(1)
    env.reset(seed=1)
    k_slots, p_slots, n_l = codec.window, codec.max_pools, codec.layouts
    for _ in range(150):
        st = env.engine.state
        legal = env.action_masks()
        np.testing.assert_array_equal(legal, codec.legal(st))
        mask = codec.mask(st)
        window = codec.window_runs(st)
        pools = list(st.pools.values())
        for k in range(k_slots):
            for p in range(p_slots):
                a = k * p_slots + p
                legal_ref = k < len(window) and p < len(pools) and bool(
                    pool_candidates(pools[p], window[k].job, st.time))
                assert mask[a] == legal_ref, codec.action_name(a)
                d = codec.decode(a, st)
                assert isinstance(d, Place)
                if mask[a]:
                    assert check_placement(st, window[k].job, d.placement) is None
        for p in range(p_slots):
            for li in range(n_l):
                a = codec.reconfigure_offset + p * n_l + li
                d = codec.decode(a, st)
                assert isinstance(d, Reconfigure)
                if mask[a]:
                    assert reconfigure_check(st, d.node_id, d.gpu_index, d.layout) is None
                elif d.layout and p < len(pools):
                    # masked: no GPU can take the layout, or one is being re-split to it right now
                    if any(g.busy_until > st.time and sorted(sl.profile.name for sl in g.slices) == sorted(d.layout)
                           for n in pools[p].nodes.values() for g in n.gpus):
                        continue
                    for node in pools[p].nodes.values():
                        for gpu in node.gpus:
                            assert reconfigure_check(st, node.id, gpu.index, d.layout) is not None
            up, down = codec.scale_offset + 2 * p, codec.scale_offset + 2 * p + 1
            if p < len(pools):
                pool = pools[p]
                elastic = pool.spec.kind.elastic
                assert mask[up] == (elastic and headroom(st, pool) > 0)
                if mask[up] and not legal[up]:  # bought beyond the blocked window (ObservationCodec.within_queue)
                    blocked = sum(r.job.gpu_demand for r in window if not pool_candidates(pool, r.job, st.time))
                    assert pool.provisioning_gpus() >= blocked
                assert legal[up] <= mask[up]
                idle = any(not n.ready or not n.jobs for n in pool.nodes.values())
                assert mask[down] == (elastic and idle and len(pool.nodes) > pool.spec.min_nodes)
                d_up = codec.decode(up, st)
                assert isinstance(d_up, Scale) and d_up.delta == 1
        # work-conserving: no waiting in front of a job that fits
        if mask[: codec.reconfigure_offset].any():
            assert not mask[codec.wait_action]
        assert codec.decode(codec.wait_action, st) is None
        _, _, term, _, _ = env.step(masked_action(env, rng))
        if term:
            break


def test_episode_terminates_on_small_scenario() -> None:
    env = GpuPoolEnv(dict(SMALL))
    rng = np.random.default_rng(2)
    env.reset(seed=2)
    total = 0.0
    for _ in range(200_000):
        _, reward, term, trunc, info = env.step(masked_action(env, rng))
        total += reward
        assert not trunc
        if term:
            break
    assert term
    assert env.engine.done
    rep = info["report"]
    assert rep["jobs_completed"] + rep["jobs_unschedulable"] + len(env.engine.skipped) > 0
    assert total < 0
    assert info["refused"] == 0
    assert set(info["reward_components"]) >= {"job_hours", "cost_usd", "deadline_misses"}


def test_jct_reward_integrates_jobs_in_system(small_scenario: Scenario) -> None:
    """With only the JCT weight, the episode return is minus the summed job-hours in the system."""
    weights = {"jct": 1.0, "cost": 0.0, "wait": 0.0, "utilization": 0.0, "preemption": 0.0, "deadline": 0.0}
    env = GpuPoolEnv(small_scenario, reward_weights=weights, episode_jobs=60)
    rng = np.random.default_rng(4)
    env.reset(seed=4)
    total = 0.0
    while True:
        _, reward, term, _, _ = env.step(masked_action(env, rng))
        total += reward
        if term:
            break
    eng = env.engine
    done = [r for r in eng.finished]
    jct_h = sum(r.finish_time - r.job.submit_time for r in done if r.finish_time is not None) / 3600.0
    assert len(done) == len(eng.jobs) - sum(eng.unschedulable.values()) - sum(eng.skipped.values())
    from rlsched.envs.gpu_pool import REWARD_SCALE_JOB_HOURS

    assert total == pytest.approx(-jct_h / REWARD_SCALE_JOB_HOURS, rel=1e-6)


def test_truncation_and_episode_windows(small_scenario: Scenario) -> None:
    env = GpuPoolEnv(small_scenario, episode_jobs=50, max_steps=5)
    env.reset(seed=0)
    assert len(env.engine.jobs) == 50
    first = {j.job_id for j in env.engine.jobs}
    assert env.engine.jobs[0].submit_time < 86400.0  # re-based by whole days
    trunc = False
    for _ in range(5):
        _, _, term, trunc, _ = env.step(env.codec.wait_action)
        if term:
            break
    assert trunc or term
    seen = {frozenset(first)}
    for s in range(1, 6):
        env.reset(seed=s)
        seen.add(frozenset(j.job_id for j in env.engine.jobs))
    assert len(seen) > 1


def test_more_pools_than_slots() -> None:
    spec = dict(SMALL)
    spec["cluster"] = ("1x8xA100-80GB,1x8xA100-80GB/mig=balanced,spot:0-2x8xA100-80GB,"
                       "ondemand:0-2x8xA100-80GB,2x8xA100-80GB")
    spec["workload"] = [{"path": "bundled:philly-3day.csv", "max_jobs": 80}]
    sc = load_scenario(spec)
    assert len(sc.pools) == 5
    env = GpuPoolEnv(sc, max_pools=4)
    obs, _ = env.reset(seed=0)
    assert obs["pools"].shape == (4, len(env.codec.pool_features))
    rng = np.random.default_rng(0)
    for _ in range(3000):
        _, _, term, _, info = env.step(masked_action(env, rng))
        assert env.observation_space.contains(env.codec.encode(env.engine.state))
        if term:
            break
    assert info["refused"] == 0
    # the fifth pool is never given work by the agent
    fifth = list(env.engine.state.pools.values())[4]
    assert all(not n.jobs for n in fifth.nodes.values())


def test_invalid_action_is_refused_and_penalised(small_scenario: Scenario) -> None:
    env = GpuPoolEnv(small_scenario)
    env.reset(seed=0)
    mask = env.action_masks()
    illegal = int(np.flatnonzero(~mask)[0])
    _, reward, _, _, info = env.step(illegal)
    assert info["illegal_action"] and info["refused"] == 1
    assert info["reward_components"]["invalid"] == 1.0
    assert reward < 0


def test_unknown_reward_weight_is_rejected(small_scenario: Scenario) -> None:
    with pytest.raises(ValueError, match="unknown reward weight"):
        GpuPoolEnv(small_scenario, reward_weights={"jtc": 1.0})


def test_maskable_ppo_smoke(small_scenario: Scenario) -> None:
    sb3_contrib = pytest.importorskip("sb3_contrib")
    env = GpuPoolEnv(small_scenario, episode_jobs=80)
    model = sb3_contrib.MaskablePPO("MultiInputPolicy", env, n_steps=64, batch_size=32, seed=0, device="cpu")
    model.learn(128)
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, action_masks=env.action_masks(), deterministic=True)
    assert env.action_masks()[int(action)]


def test_render_ansi(small_scenario: Scenario) -> None:
    env = GpuPoolEnv(small_scenario, render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert isinstance(text, str) and "queue=" in text


def test_codec_signature_is_stable_and_layout_sensitive() -> None:
    a, b = ObservationCodec(), ObservationCodec()
    assert a.signature() == b.signature()
    assert a.signature() != ObservationCodec(window=8).signature()
    assert a.signature() != ObservationCodec(max_pools=3).signature()
    assert a.action_space.n == 16 * 4 + 4 * 6 + 2 * 4 + 1
    assert a.describe()["n_actions"] == a.action_space.n


def test_codec_on_untracked_state_is_fresh(small_scenario: Scenario) -> None:
    """Direct use (no track/invalidate) recomputes from scratch, as a server would call it."""
    env = GpuPoolEnv(small_scenario)
    env.reset(seed=0)
    st = env.engine.state
    fresh = ObservationCodec()
    np.testing.assert_array_equal(fresh.legal(st), env.action_masks())
    obs = fresh.encode(st)
    ref = env.codec.encode(st)
    np.testing.assert_array_equal(obs["jobs"], ref["jobs"])
    np.testing.assert_array_equal(obs["pools"], ref["pools"])
    # the demand signal is the only stateful feature: it needs the arrivals fed (record_arrivals)
    demand = fresh.global_features.index("log_demand_gpus")
    keep = [i for i in range(len(fresh.global_features)) if i != demand]
    np.testing.assert_array_equal(obs["globals"][keep], ref["globals"][keep])
    rng = np.random.default_rng(0)
    for _ in range(30):
        env.step(masked_action(env, rng))
        np.testing.assert_array_equal(fresh.legal(st), env.action_masks())
        np.testing.assert_array_equal(fresh.encode(st)["jobs"], env.codec.encode(st)["jobs"])
        np.testing.assert_array_equal(fresh.encode(st)["pools"], env.codec.encode(st)["pools"])


def test_extra_global_estimate_error_is_opt_in_and_reads_the_estimators_own_score(small_scenario: Scenario) -> None:
    """``extra_globals=("estimate_log_error",)`` appends one global feature; without it the layout is unchanged."""
    import math

    from rlsched.cluster.estimate import DurationEstimator
    from rlsched.cluster.job import Job

    plain = ObservationCodec()
    extra = ObservationCodec(extra_globals=["estimate_log_error"])
    assert extra.global_features == (*plain.global_features, "estimate_log_error")
    assert extra.signature() != plain.signature()
    assert plain.describe().get("extra_globals") is None and extra.describe()["extra_globals"] == ["estimate_log_error"]
    with pytest.raises(ValueError, match="unknown extra global feature 'estimate_error'"):
        ObservationCodec(extra_globals=["estimate_error"])

    # the estimator scores each finished job against the estimate it held just before learning from it
    est = DurationEstimator()
    est.observe(Job("a", 0.0, 100.0, num_gpus=1, user="u"), 100.0)  # prior 1 h vs 100 s
    assert est.log_error == pytest.approx(math.log(3600.0 / 100.0))
    est.observe(Job("b", 0.0, 100.0, num_gpus=1, user="u"), 100.0)  # now exact
    assert est.log_error == pytest.approx(math.log(36.0) / 2)
    assert DurationEstimator(oracle=True).log_error == 0.0

    env = GpuPoolEnv(small_scenario, extra_globals=["estimate_log_error"])
    obs, _ = env.reset(seed=0)
    assert obs["globals"].shape == (len(extra.global_features),)
    for _ in range(5000):  # place what fits, else the last legal action (wait), until a job finishes
        if env.engine.state.estimator.log_error > 0.0:
            break
        legal = np.flatnonzero(env.action_masks())
        places = legal[legal < env.codec.reconfigure_offset]
        obs, _, done, _, _ = env.step(int(places[0] if len(places) else legal[-1]))
        assert not done
    assert obs["globals"][-1] == pytest.approx(env.engine.state.estimator.log_error, rel=1e-6)
