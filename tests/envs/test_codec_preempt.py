"""The codec's opt-in preempt slots: layout, running-slot order and features, mask rules, decode."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rlsched.cluster.decisions import Place, Preempt
from rlsched.cluster.feasibility import pool_candidates
from rlsched.cluster.job import Job
from rlsched.cluster.shorthand import parse_cluster
from rlsched.envs.codec import RUNNING_FEATURES, ObservationCodec
from rlsched.envs.trained_actions import TrainedActions
from rlsched.scenario import load_scenario
from rlsched.sim.engine import Engine
from tests.envs.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", ["models/scorer", "models/spot"])
def test_shipped_models_keep_their_signature_and_layout(folder: str) -> None:
    meta = json.loads((ROOT / folder / "codec.json").read_text())
    codec = ObservationCodec(meta["window"], meta["max_pools"], meta["layouts"],
                             nominators=meta.get("nominators", ()))
    assert codec.signature() == meta["signature"]
    assert codec.n_actions == meta["describe"]["n_actions"]
    described = codec.describe()
    assert {k: described[k] for k in meta["describe"]} == meta["describe"]
    assert "preempt_slots" not in described and "running_features" not in described
    assert "running" not in codec.observation_space.spaces
    assert codec.preempt_slots == 0 and codec.preempt_offset == codec.wait_action


def test_preempt_slots_extend_the_layout_before_wait() -> None:
    base, pre = ObservationCodec(), ObservationCodec(preempt_slots=4)
    assert pre.n_actions == base.n_actions + 4
    assert pre.preempt_offset == base.wait_action and pre.wait_action == pre.n_actions - 1
    assert pre.signature() != base.signature()
    assert pre.observation_space["running"].shape == (4, len(RUNNING_FEATURES))
    assert pre.action_name(pre.preempt_offset + 2) == "preempt(running2)"
    assert pre.action_name(pre.wait_action) == "wait"
    assert pre.describe()["preempt_slots"] == 4 and "preempt_slots" not in base.describe()
    with pytest.raises(ValueError):
        ObservationCodec(preempt_slots=-1)


def _engine(*, blocked: bool = True) -> Engine:
    """One 8-GPU node: a (4 GPUs, preemptible), b (2, preemptible), c (2, not preemptible) run from t=0;
    at t=3600 a short 4-GPU job arrives that fits nowhere (or a 0-GPU-free-needing 1-GPU job if not blocked)."""
    pools = parse_cluster("1x8xA100-80GB")
    jobs = [
        Job("a", 0.0, 36_000.0, num_gpus=4, user="u1", preemptible=True),
        Job("b", 0.0, 36_000.0, num_gpus=2, user="u2", preemptible=True),
        Job("c", 0.0, 36_000.0, num_gpus=2 if blocked else 1, user="u1"),
        Job("short", 3600.0, 600.0, num_gpus=4 if blocked else 1, user="u3", preemptible=True),
    ]
    eng = Engine(pools, jobs)
    eng.advance()  # the first arrivals
    st = eng.state
    for jid in ("a", "b", "c"):
        run = st.queue[jid]
        pool = next(iter(st.pools.values()))
        found = pool_candidates(pool, run.job, st.time)
        assert found and eng.apply(Place(jid, found[0])) is None
    eng.advance()  # the short job arrives at t=3600
    assert st.time == pytest.approx(3600.0) and "short" in st.queue
    return eng


def test_running_slots_order_and_features() -> None:
    eng = _engine()
    st = eng.state
    codec = ObservationCodec(window=4, max_pools=1, preempt_slots=3)
    assert [r.job.job_id for r in codec.running_runs(st)] == ["a", "b"]  # most attained first; c not preemptible
    rows = codec.encode(st)["running"]
    assert rows.shape == (3, len(RUNNING_FEATURES))
    f = dict(zip(RUNNING_FEATURES, rows[0], strict=True))
    assert f["present"] == 1.0 and f["log2_num_gpus"] == pytest.approx(3.0)  # log2(4) + 1
    assert f["log_attained_gpu_h"] == pytest.approx(math.log1p(4.0), rel=1e-6)  # 4 GPUs for 1 h
    est = st.estimator.estimate(st.running["a"].job)
    work = max(est, 1.0)
    while work <= 3600.0:
        work *= 2.0
    assert f["log_believed_remaining_h"] == pytest.approx(math.log1p((work - 3600.0) / 3600.0), rel=1e-5)
    assert f["log_run_time_h"] == pytest.approx(math.log1p(1.0), rel=1e-6)
    assert f["log_restarts"] == 0.0
    assert f["log_checkpoint_age_h"] == 0.0  # no checkpoint written yet
    assert f["user_gpu_share"] == pytest.approx(6.0 / 8.0)  # u1 holds a (4) and c (2) of 8 in use
    assert rows[1][0] == 1.0 and rows[1][2] == pytest.approx(math.log1p(2.0), rel=1e-6)
    assert not rows[2].any()  # padding


def test_mask_allows_preempt_only_when_a_window_job_is_blocked() -> None:
    codec = ObservationCodec(window=4, max_pools=1, preempt_slots=3)
    st = _engine().state
    mask = codec.mask(st)
    assert mask[codec.preempt_offset: codec.preempt_offset + 2].all()  # a, b
    assert not mask[codec.preempt_offset + 2]  # an empty slot
    assert not codec.only_wait(st)
    free = _engine(blocked=False).state  # the new job fits: nothing is blocked
    codec2 = ObservationCodec(window=4, max_pools=1, preempt_slots=3)
    assert not codec2.mask(free)[codec2.preempt_offset: codec2.wait_action].any()


def test_mask_without_trained_preemption() -> None:
    st = _engine().state
    every = frozenset(TrainedActions.unrestricted().place)
    untrained = TrainedActions(every, frozenset(), frozenset(), frozenset(), True, "test")
    codec = ObservationCodec(window=4, max_pools=1, preempt_slots=3).restrict(untrained)
    mask = codec.mask(st)
    assert not mask[codec.preempt_offset: codec.wait_action].any()
    assert mask[codec.wait_action]  # nothing else is legal: waiting is
    assert codec.only_wait(st)
    trained = TrainedActions(every, frozenset(), frozenset(), frozenset(), True, "test", preempt=True)
    codec = ObservationCodec(window=4, max_pools=1, preempt_slots=3).restrict(trained)
    assert codec.mask(st)[codec.preempt_offset]


def test_trained_actions_record_preempt() -> None:
    every = frozenset(TrainedActions.unrestricted().place)
    old = TrainedActions(every, frozenset(), frozenset(), frozenset(), True, "x")
    assert "preempt" not in old.to_dict()  # records of models without preempt slots are unchanged
    assert not TrainedActions.from_dict(old.to_dict()).preempt  # absent: not trained
    new = TrainedActions(every, frozenset(), frozenset(), frozenset(), True, "x", preempt=True)
    assert TrainedActions.from_dict(new.to_dict()) == new
    assert "preempt" in new.describe()
    assert TrainedActions.of_fleets([parse_cluster("1x8xA100-80GB")], max_pools=4, layouts=6, source="",
                                    preempt_slots=2).preempt
    with pytest.raises(ValueError):
        TrainedActions.from_dict({**new.to_dict(), "preempt": "yes"})


def test_decode_preempt_is_accepted_and_the_job_keeps_its_progress() -> None:
    eng = _engine()
    st = eng.state
    codec = ObservationCodec(window=4, max_pools=1, preempt_slots=3)
    codec.track(st)
    decision = codec.decode(codec.preempt_offset, st)
    assert decision == Preempt("a", reason="policy")
    assert decision.checkpoint
    assert eng.apply(decision) is None
    run = st.queue["a"]
    assert run.checkpointed == pytest.approx(3600.0)  # graceful: the work done is kept
    assert run.work_done == pytest.approx(3600.0 - eng.config.restart_overhead_s)
    codec.invalidate(None)
    assert [r.job.job_id for r in codec.running_runs(st)] == ["b"]
    assert "a" in [r.job.job_id for r in codec.window_runs(st)]  # requeued like any queued job
    # placed again, "a" shows its restart and the age of the checkpoint its suspension wrote
    pool = next(iter(st.pools.values()))
    assert eng.apply(Place("a", pool_candidates(pool, run.job, st.time)[0])) is None
    assert eng.apply(Preempt("b")) is None  # frees b's GPUs; "a" ranks first again
    codec.invalidate(None)
    assert [r.job.job_id for r in codec.running_runs(st)] == ["a"]
    row = dict(zip(RUNNING_FEATURES, codec.encode(st)["running"][0], strict=True))
    assert row["log_restarts"] == pytest.approx(math.log1p(1.0))
    assert row["log_attained_gpu_h"] == pytest.approx(math.log1p(4.0), rel=1e-6)
    assert row["log_run_time_h"] == 0.0 and row["log_checkpoint_age_h"] == 0.0  # restarted now, checkpoint now
    # an empty slot decodes to a preemption the engine refuses
    empty = codec.decode(codec.preempt_offset + 2, st)
    assert isinstance(empty, Preempt) and eng.apply(empty) is not None


def test_env_with_preempt_slots_steps_and_penalises_its_preemptions() -> None:
    from rlsched.envs import GpuPoolEnv

    env = GpuPoolEnv(load_scenario({**SMALL, "preemptible": "all", "load_factor": 1.5}), episode_jobs=120,
                     preempt_slots=4, max_steps=3000)
    obs, _ = env.reset(seed=0)
    assert obs["running"].shape == (4, len(RUNNING_FEATURES))
    rng = np.random.default_rng(0)
    done, preempted, counted = False, 0, 0.0
    while not done:
        mask = env.action_masks()
        pre = np.flatnonzero(mask[env.codec.preempt_offset: env.codec.wait_action])
        chose_preempt = bool(len(pre)) and rng.random() < 0.3
        if chose_preempt:
            a = env.codec.preempt_offset + int(pre[0])
            preempted += 1
        else:
            legal = np.flatnonzero(mask)
            a = int(legal[rng.integers(len(legal))])
        obs, _, term, trunc, info = env.step(a)
        assert env.observation_space.contains(obs)
        assert not info["illegal_action"]
        if chose_preempt:
            assert info["reward_components"]["preemptions"] >= 1.0  # charged at the step that preempted
        counted += info["reward_components"]["preemptions"]
        done = term or trunc
    assert preempted > 0
    assert counted == env.engine.preemptions  # every preemption is charged exactly once
