"""``bc.keep``: the imitation loss kept during PPO pulls the policy toward its teacher."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlsched.train.config import ExperimentError, load_experiment

ROOT = Path(__file__).resolve().parents[2]


def _agreement(policy: Any, data: Any) -> float:
    import torch

    obs = {k: torch.as_tensor(v) for k, v in data.obs.items()}
    with torch.no_grad():
        pred = policy.get_distribution(obs, action_masks=data.masks).distribution.probs.argmax(dim=1)
    return float((pred.numpy() == data.actions).mean())


def test_keeper_steps_raise_teacher_agreement_and_anneal_to_nothing() -> None:
    pytest.importorskip("sb3_contrib")
    from sb3_contrib import MaskablePPO

    from rlsched.learned.ppo_net import SlotScoringPolicy
    from rlsched.train.trainer import collect_teacher, imitation_keeper, make_vec_env
    from rlsched.train.worlds import training_worlds

    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    exp = replace(exp, vec_env="dummy", bc=replace(exp.bc, keep=1.0, keep_batches=8, teacher="sjf"))
    worlds = training_worlds(exp.scenarios)
    data = collect_teacher(exp, worlds, 600)
    model = MaskablePPO(SlotScoringPolicy, make_vec_env(exp, worlds, 0), n_steps=64, batch_size=64, seed=0,
                        device="cpu", learning_rate=3e-3,
                        policy_kwargs={"features_extractor_kwargs": {"n_layouts": 6, "hidden": 32}})
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(None, []))
    keeper = imitation_keeper(exp, data, total_steps=1000)
    keeper.init_callback(model)
    keeper.on_training_start({}, {})
    before = _agreement(model.policy, data)
    for _ in range(10):
        keeper.on_rollout_end()
    after = _agreement(model.policy, data)
    assert after > before + 0.1, (before, after)
    assert np.isfinite(keeper.last_loss)
    # at the end of the run the weight is 0: nothing changes
    model.num_timesteps = 1000
    params = [p.detach().clone() for p in model.policy.parameters()]
    keeper.on_rollout_end()
    assert all((a == b).all() for a, b in zip(params, model.policy.parameters(), strict=True))


@pytest.mark.parametrize(("bc", "needle"), [
    ("{steps: 100, keep: -1}", "bc.keep must be >= 0"),
    ("{steps: 0, keep: 0.5}", "bc.keep needs bc.steps > 0"),
    ("{steps: 10, balance: 2}", "bc.balance must be in"),
])
def test_keep_is_validated(tmp_path: Path, bc: str, needle: str) -> None:
    p = tmp_path / "e.yaml"
    p.write_text(f"""
name: t
scenarios:
  - {{name: a, scenario: "bundled:default", train_window_h: [0, 10], eval_windows_h: [[20, 30]]}}
bc: {bc}
""")
    with pytest.raises(ExperimentError, match=needle):
        load_experiment(p)


def test_imitation_weights_balance_action_kinds() -> None:
    from rlsched.envs.codec import ObservationCodec
    from rlsched.train.trainer import imitation_weights

    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    codec = ObservationCodec(window=exp.window, max_pools=exp.max_pools)
    buy = codec.scale_offset  # scale pool 0 up
    acts = np.array([codec.wait_action] * 60 + [0] * 30 + [buy] * 10)
    w = imitation_weights(exp, acts)
    assert w.mean() == pytest.approx(1.0)
    # each kind's total weight is equal (no cap reached at these frequencies)
    assert w[:60].sum() == pytest.approx(w[60:90].sum(), rel=1e-5)
    assert w[:60].sum() == pytest.approx(w[90:].sum(), rel=1e-5)
    # a 1-in-100 decision is capped at 20x the mean before renormalising
    rare = imitation_weights(exp, np.array([codec.wait_action] * 99 + [buy]))
    assert rare[99] / rare[0] < 99.0 and rare.mean() == pytest.approx(1.0)
    # balance 0.5: square-root weights; 0: plain cross-entropy
    half = imitation_weights(replace(exp, bc=replace(exp.bc, balance=0.5)), acts)
    assert half[90] / half[0] == pytest.approx(np.sqrt(6.0), rel=1e-5)
    assert (imitation_weights(replace(exp, bc=replace(exp.bc, balance=0.0)), acts) == 1.0).all()
    # a place in pool 0 and a place in pool 1 are different kinds
    two = imitation_weights(exp, np.array([0, 0, 0, 1]))
    assert two[3] > two[0]


def test_behaviour_clone_reports_agreement_on_choices_apart() -> None:
    """The clone's agreement over every sample and over the samples with more than one legal action."""
    pytest.importorskip("sb3_contrib")
    from sb3_contrib import MaskablePPO

    from rlsched.learned.ppo_net import SlotScoringPolicy
    from rlsched.train.trainer import behaviour_clone, collect_teacher, make_vec_env
    from rlsched.train.worlds import training_worlds

    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    # 400 samples are two mini-batches: 5 epochs give the clone ten updates (3 left its argmax where it started
    # once the codec stopped offering buys beyond what a pool cannot take)
    exp = replace(exp, vec_env="dummy", bc=replace(exp.bc, epochs=5, teacher="sjf"))
    worlds = training_worlds(exp.scenarios)
    data = collect_teacher(exp, worlds, 400)
    model = MaskablePPO(SlotScoringPolicy, make_vec_env(exp, worlds, 0), n_steps=64, batch_size=64, seed=0,
                        device="cpu", policy_kwargs={"features_extractor_kwargs": {"n_layouts": 6, "hidden": 32}})
    stats = behaviour_clone(model, exp, data, 1.0, lambda _: None)
    choices = data.masks.sum(axis=1) > 1
    assert stats["bc/choices"] == choices.sum() > 0
    assert stats["bc/agreement_after"] == pytest.approx(_agreement(model.policy, data), abs=1e-6)
    sub = type(data)({k: v[choices] for k, v in data.obs.items()}, data.masks[choices], data.actions[choices],
                     data.returns[choices])
    assert stats["bc/choice_agreement_after"] == pytest.approx(_agreement(model.policy, sub), abs=1e-6)
    assert stats["bc/choice_agreement_after"] > stats["bc/choice_agreement_before"]
