"""``rlsched train``: MaskablePPO over the simulator, tracked in MLflow, exported as a model folder.

The loop: build training worlds from the experiment, optionally behaviour-clone
the weighted-priority teacher, run MaskablePPO with checkpoints (``--resume``
continues from the last one) and periodic evaluation, then evaluate the final
policy on every evaluation and holdout window against every heuristic, write the
model folder with its card, and log and register it in MLflow. The steps a heuristic selector's
run shares with this one are in :mod:`rlsched.train.run_steps`.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.envs.trained_actions import TrainedActions
from rlsched.train.config import Experiment
from rlsched.train.evaluate import evaluate
from rlsched.train.forecast_fit import FORECASTER_FILE, save_forecaster
from rlsched.train.model_card import CardFacts, build_card, model_card_markdown
from rlsched.train.run_steps import (
    TrainingRun,
    TrainResult,
    codec_of,
    family_gate,
    hold_run_dir,
    latest_checkpoint,
    prepare_worlds,
    progress_callback,
    save_checkpoint,
    start_tracker,
)
from rlsched.train.worlds import MultiWorldEnv, World


def _env_kwargs(exp: Experiment) -> dict[str, Any]:
    return {"window": exp.window, "max_pools": exp.max_pools, "nominators": exp.nominators,
            **({"preempt_slots": exp.preempt_slots} if exp.preempt_slots else {}),
            **({"extra_globals": exp.extra_globals} if exp.extra_globals else {}),
            **({"anchor": exp.anchor} if exp.anchor else {}),
            "episode_jobs": exp.episode_jobs,
            "reward_weights": exp.reward or None, "max_steps": 20_000, "rules": exp.trained_rule_params()}


def make_vec_env(exp: Experiment, worlds: list[World], seed: int, *, ray: str | None = None,
                 actor_cpus: float | None = None) -> Any:
    """``n_envs`` copies of the multi-world env (subprocesses unless ``vec_env: dummy``).

    With ``ray`` (a Ray address, ``auto`` or ``HOST:PORT``) each copy lives in a Ray actor of
    ``actor_cpus`` CPUs (:class:`~rlsched.train.ray_vec_env.RayVecEnv`), built by the same factory and
    seed as here, so its rollouts are those of ``DummyVecEnv``.
    """
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    kwargs = _env_kwargs(exp)

    def factory(i: int) -> Callable[[], Any]:
        def make() -> Any:
            env = Monitor(MultiWorldEnv(worlds, **kwargs))
            env.reset(seed=seed + i)
            return env

        return make

    fns = [factory(i) for i in range(exp.n_envs)]
    if ray is not None:
        from rlsched.ray_connect import connect
        from rlsched.train.ray_vec_env import DEFAULT_ACTOR_CPUS, RayVecEnv

        connect(ray)
        return RayVecEnv(fns, num_cpus=DEFAULT_ACTOR_CPUS if actor_cpus is None else actor_cpus)
    if exp.vec_env == "subproc" and exp.n_envs > 1:
        return SubprocVecEnv(fns, start_method="fork" if platform.system() == "Linux" else "spawn")
    return DummyVecEnv(fns)


@dataclass
class TeacherData:
    """Transitions of the heuristic teacher (for cloning and for the reward scale)."""

    obs: dict[str, np.ndarray]
    masks: np.ndarray
    actions: np.ndarray
    returns: np.ndarray  # discounted, unscaled
    #: the lookahead teacher's picks per candidate nominator (empty for the other teachers)
    labels: dict[str, int] = field(default_factory=dict)


def collect_teacher(exp: Experiment, worlds: list[World], steps: int,
                    log: Callable[[str], None] = print) -> TeacherData:
    """Roll the teacher through training worlds and compute its discounted returns."""
    from rlsched.train.lookahead import LookaheadTeacher
    from rlsched.train.teacher import best_follow_rules, teacher_action

    env = MultiWorldEnv(worlds, **_env_kwargs(exp))
    rule_of: dict[int, str] = {}
    lookahead = None
    if exp.bc.teacher == "lookahead":
        lookahead = LookaheadTeacher(exp.bc.lookahead_candidates(exp.nominators),
                                     horizon_s=float(exp.bc.label_horizon_s), margin=float(exp.bc.label_margin),
                                     every=int(exp.bc.label_every), log=log)
    if exp.bc.teacher == "best-follow":
        picked = best_follow_rules(env.envs, exp.nominators, episodes=exp.bc.select_episodes,
                                   seed=exp.seed + 20_000, jobs=exp.bc.select_jobs or None)
        rule_of = {id(e): r for e, r in zip(env.envs, picked, strict=True)}
        for label, rule in zip(env.labels, picked, strict=True):
            log(f"teacher for {label}: {rule}")
    obs, _ = env.reset(seed=exp.seed + 10_000)
    observations: dict[str, list[np.ndarray]] = {k: [] for k in obs}
    masks, actions, rewards, dones = [], [], [], []
    for i in range(steps):
        inner = env.current
        mask = inner.action_masks()
        rule = lookahead.rule_for(inner, mask) if lookahead else rule_of.get(id(inner), exp.bc.teacher)
        a = teacher_action(inner.codec, inner.engine.state, mask, rule=rule)
        for k, v in obs.items():
            observations[k].append(v)
        masks.append(mask.copy())
        actions.append(a)
        obs, r, term, trunc, _ = env.step(a)
        rewards.append(r)
        dones.append(term or trunc or i == steps - 1)
        if term or trunc:
            obs, _ = env.reset()
    returns = np.zeros(len(rewards), dtype=np.float32)
    acc = 0.0
    for i in range(len(rewards) - 1, -1, -1):
        acc = rewards[i] + (0.0 if dones[i] else exp.ppo.gamma * acc)
        returns[i] = acc
    if lookahead is not None:
        log(lookahead.summary())
    return TeacherData({k: np.stack(v) for k, v in observations.items()}, np.stack(masks),
                       np.array(actions), returns, dict(lookahead.labels) if lookahead else {})


def reward_scale_from(returns: np.ndarray) -> float:
    """A fixed reward multiplier giving the teacher's returns unit spread.

    Job-hour penalties span orders of magnitude between a quiet and a saturated
    cluster; PPO's critic (and so its advantages) behave far better on unit-scale
    returns. A fixed factor (saved with the checkpoints) keeps the objective the
    same for the whole run, unlike running normalisation.
    """
    spread = float(np.std(returns)) if len(returns) > 1 else 0.0
    return 1.0 / spread if spread > 1e-9 else 1.0


def imitation_weights(exp: Experiment, actions: np.ndarray, cap: float = 20.0) -> np.ndarray:
    """Per-sample weights balancing the teacher's action kinds (place per pool, scale, wait).

    Buying capacity and placing on on-demand are rare among a spot teacher's decisions, yet
    they decide cost and deadlines, and an unweighted clone agrees on almost every decision
    while skipping many of the buys (BENCHMARKS.md, "Design notes moved from docstrings").
    Each kind gets weight ``(1 / its frequency) ** bc.balance``
    (normalised to mean 1, capped at ``cap``): at 1 rare decisions count as much as common ones,
    which also makes the clone take them too often (a full-balance spot clone bought on-demand
    nodes in quiet hours); 0.5 is the usual compromise.
    """
    codec = codec_of(exp)
    kp = codec.window * codec.max_pools
    kinds = np.where(actions == codec.wait_action, 0,
                     np.where(actions >= codec.scale_offset, 1 + (actions - codec.scale_offset),
                              np.where(actions >= kp, 1 + 2 * codec.max_pools,
                                       2 + 2 * codec.max_pools + actions % codec.max_pools)))
    if codec.preempt_slots:  # every preempt slot is one kind (past the place kinds)
        pre = (actions >= codec.preempt_offset) & (actions < codec.wait_action)
        kinds = np.where(pre, 2 + 3 * codec.max_pools, kinds)
    _, inverse, counts = np.unique(kinds, return_inverse=True, return_counts=True)
    w = ((len(actions) / counts.astype(np.float64)) ** exp.bc.balance)[inverse]
    w = np.minimum(w / w.mean(), cap)
    return (w / w.mean()).astype(np.float32)


def _weighted_nll(policy: Any, obs: dict[str, Any], masks: np.ndarray, actions: Any, weights: Any) -> Any:
    """Class-weighted negative log-likelihood of the teacher's actions (cloning and keeping share it)."""
    return -(weights * policy.get_distribution(obs, action_masks=masks).log_prob(actions)).mean()


def behaviour_clone(model: Any, exp: Experiment, data: TeacherData, scale: float,
                    log: Callable[[str], None]) -> dict[str, float]:
    """Warm start: imitate the heuristic teacher (DL2-style) and fit the critic to its returns.

    A cloned actor with an untrained critic gets garbage advantages, and PPO then
    unlearns the clone in its first updates; fitting the value head to the teacher's
    (scaled) returns avoids that. Returns teacher agreement before and after, over every
    sample and over the *choices* only (samples with more than one legal action, where a
    clone can depart from its teacher).
    """
    import torch

    policy = model.policy
    obs_t = {k: torch.as_tensor(v) for k, v in data.obs.items()}
    mask_np = data.masks
    act_t = torch.as_tensor(data.actions)
    ret_t = torch.as_tensor(data.returns * scale)
    w_t = torch.as_tensor(imitation_weights(exp, data.actions))

    choices = torch.as_tensor(mask_np.sum(axis=1) > 1)

    def accuracy() -> tuple[float, float]:
        with torch.no_grad():
            dist = policy.get_distribution(obs_t, action_masks=mask_np)
            hit = (dist.distribution.probs.argmax(dim=1) == act_t).float()
        return float(hit.mean()), float(hit[choices].mean()) if bool(choices.any()) else float("nan")

    before, before_choices = accuracy()
    # The reward scale gives the returns unit *spread*, but their mean can sit hundreds of units
    # from 0 (long, costly episodes); a few hundred Adam steps cannot move the value head's bias
    # that far, and PPO would start from a critic that is off by the mean. Start it at the mean.
    value_net = getattr(policy, "value_net", None)
    if isinstance(value_net, torch.nn.Linear) and value_net.bias is not None:
        with torch.no_grad():
            value_net.bias.fill_(float(ret_t.mean()))
    opt = torch.optim.Adam(policy.parameters(), lr=exp.bc.learning_rate)
    n = len(data.actions)
    batch = 256
    rng = np.random.default_rng(exp.seed)
    for epoch in range(exp.bc.epochs):
        perm = rng.permutation(n)
        total = 0.0
        for i in range(0, n, batch):
            idx = perm[i: i + batch]
            batch_obs = {k: v[idx] for k, v in obs_t.items()}
            values = policy.predict_values(batch_obs).flatten()
            imitation = _weighted_nll(policy, batch_obs, mask_np[idx], act_t[idx], w_t[idx])
            loss = imitation + 0.5 * torch.nn.functional.mse_loss(values, ret_t[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        log(f"behaviour cloning epoch {epoch + 1}/{exp.bc.epochs}: loss {total / n:.4f}")
    after, after_choices = accuracy()
    return {"bc/agreement_before": before, "bc/agreement_after": after, "bc/samples": float(n),
            "bc/choice_agreement_before": before_choices, "bc/choice_agreement_after": after_choices,
            "bc/choices": float(choices.sum())}


def imitation_keeper(exp: Experiment, data: TeacherData, total_steps: int) -> Any:
    """SB3 callback: a few imitation minibatches after each rollout, annealed to 0 over the run.

    PPO after a behaviour clone can drift from it before the sparse reward can say which
    way is better. Keeping the teacher's cross-entropy in the objective - weighted
    ``bc.keep`` at the start, nothing at the end - lets PPO move where the advantage is
    clear and stay near the teacher elsewhere (the DAPG recipe, without its demonstration
    advantages). Its effect alone is not isolated (BENCHMARKS.md, "Design notes moved
    from docstrings").
    """
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    obs_t = {k: torch.as_tensor(v) for k, v in data.obs.items()}
    act_t = torch.as_tensor(data.actions)
    w_t = torch.as_tensor(imitation_weights(exp, data.actions))
    rng = np.random.default_rng(exp.seed + 1)

    class Keeper(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.start = 0
            self.last_loss = float("nan")

        def _on_training_start(self) -> None:
            self.start = self.model.num_timesteps

        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            done = (self.model.num_timesteps - self.start) / max(total_steps, 1)
            weight = exp.bc.keep * max(0.0, 1.0 - done)
            if weight <= 0:
                return
            policy: Any = self.model.policy
            total = 0.0
            for _ in range(exp.bc.keep_batches):
                idx = rng.integers(0, len(act_t), size=min(256, len(act_t)))
                batch_obs = {k: v[idx] for k, v in obs_t.items()}
                loss = weight * _weighted_nll(policy, batch_obs, data.masks[idx], act_t[idx], w_t[idx])
                policy.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), exp.ppo.max_grad_norm)
                policy.optimizer.step()
                total += float(loss.detach()) / weight
            self.last_loss = total / exp.bc.keep_batches
            self.logger.record("losses/imitation", self.last_loss)
            self.logger.record("losses/imitation_weight", weight)

    return Keeper()


def scaled(venv: Any, scale: float) -> Any:
    """``venv`` with every reward multiplied by ``scale``."""
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class ScaleReward(VecEnvWrapper):
        def reset(self) -> Any:
            return self.venv.reset()

        def step_wait(self) -> Any:
            obs, rew, done, info = self.venv.step_wait()
            return obs, rew * scale, done, info

    return ScaleReward(venv)


def train(
    exp: Experiment,
    *,
    run_dir: Path,
    resume: bool = False,
    log: Callable[[str], None] = print,
    quiet: bool = False,
    track: bool = True,
) -> TrainResult:
    """Train, evaluate, export and (with ``track``) log and register one policy.

    With ``exp.ray`` (a Ray address: ``auto`` or ``HOST:PORT``) the rollout environments run as Ray actors,
    and the final evaluation's windows and the promotion gate's family replays as Ray tasks; the
    learner, the periodic evaluation and the MLflow run stay in this process. The MLflow run is tagged
    with the address and the number of environment actors.
    """
    if exp.selector is not None:  # the policy chooses a heuristic, not a job: its own environment and network
        from rlsched.train.selector_train import train_selector

        with hold_run_dir(run_dir):
            return train_selector(exp, run_dir=run_dir, resume=resume, log=log, quiet=quiet, track=track)
    import sb3_contrib  # noqa: F401  (without the train extra, fail before building any world)

    if exp.ray:
        from dataclasses import replace

        from rlsched.ray_connect import connect

        # fail on a bad address before building anything, the run folder included; the run then uses the
        # address connected to (``auto`` resolved)
        exp = replace(exp, ray=connect(exp.ray))
    with hold_run_dir(run_dir):
        return _train_slots(exp, run_dir=run_dir, resume=resume, log=log, quiet=quiet, track=track)


def _train_slots(exp: Experiment, *, run_dir: Path, resume: bool, log: Callable[[str], None], quiet: bool,
                 track: bool) -> TrainResult:
    """:func:`train` for the per-slot network, on the Ray cluster at ``exp.ray`` (connected) or locally; the
    run folder is held."""
    import torch

    ray = exp.ray or None
    # the same learner threads with or without Ray: a different count may change the float sums of the
    # updates, and a Ray run must learn what the local run learns
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(exp.n_envs, 1)))
    t_start = time.perf_counter()
    worlds = prepare_worlds(exp, log)
    ckpt_dir = run_dir / "checkpoints"
    ckpt = latest_checkpoint(ckpt_dir) if resume else None
    if resume and ckpt is None:
        log(f"no checkpoint in {ckpt_dir}; starting from scratch")
    scale, data = _reward_scale(exp, run_dir, worlds.training, resumed=ckpt is not None, log=log)
    venv = scaled(make_vec_env(exp, worlds.training, exp.seed, ray=ray), scale)
    if ray is not None:
        log(f"{exp.n_envs} environment actors on the Ray cluster at {ray}")
    ray_tags = {"ray_address": ray, "ray_env_actors": str(exp.n_envs)} if ray is not None else {}
    run = SlotTrainingRun(exp, worlds, log, start_tracker(exp, ray_tags) if track and exp.mlflow.enabled else None,
                       ray)
    try:
        model, bc_stats = run.model(venv, ckpt, data, scale)
        policy = _policy_factory(model, exp, worlds.trained_actions)
        run.learn(model, policy, ckpt_dir, data, resumed=ckpt is not None, quiet=quiet)
        venv.close()  # the environments are done: free their workers (Ray actors' CPUs) for the gate's replays
        train_wall = time.perf_counter() - t_start
        ev, ho, table = run.final_evaluation(policy)
        forecast, table = run.forecast_section(int(model.num_timesteps), table)
        codec = codec_of(exp)
        card = build_card(exp, CardFacts(codec.signature(), [w.label for w in worlds.training],
                                         int(model.num_timesteps), train_wall, bc_stats, ev, ho,
                                         worlds.trained_actions, forecast, ckpt.name if ckpt else None))
        out = Path(exp.output) if exp.output else run_dir / "model"
        run.export(out, model, card, table)
        run_id, version = run.register(out, card, codec.signature())
        return TrainResult(out, int(model.num_timesteps), time.perf_counter() - t_start, ev, ho, run_id, version)
    finally:
        venv.close()
        if run.tracker is not None:
            run.tracker.close()


def _reward_scale(exp: Experiment, run_dir: Path, worlds: list[World], *, resumed: bool,
                  log: Callable[[str], None]) -> tuple[float, TeacherData | None]:
    """The reward scale (and the teacher's samples it was computed from, unless a resumed run reuses its own)."""
    scale_file = run_dir / "reward_scale.json"
    data = None
    if resumed and scale_file.exists():
        scale = float(json.loads(scale_file.read_text())["reward_scale"])
    else:
        data = collect_teacher(exp, worlds, max(exp.bc.steps, 2000), log)
        scale = reward_scale_from(data.returns)
        run_dir.mkdir(parents=True, exist_ok=True)
        scale_file.write_text(json.dumps({"reward_scale": scale}))
    log(f"reward scale {scale:.4g} (unit spread of the teacher's discounted returns)")
    return scale, data


def _policy_factory(model: Any, exp: Experiment, trained_actions: TrainedActions) -> Callable[[], Any]:
    """A function giving the network as it is now as a scheduler (for evaluations during and after training)."""
    from rlsched.learned.ppo import PolicyModel, PpoScheduler
    from rlsched.learned.ppo_net import SlotScorer

    def current_policy() -> PpoScheduler:
        net = model.policy.features_extractor
        assert isinstance(net, SlotScorer)
        c = codec_of(exp)
        pm = PolicyModel(net, {"window": c.window, "max_pools": c.max_pools, "layouts": c.layouts,
                              "nominators": exp.nominators, "preempt_slots": exp.preempt_slots,
                              "extra_globals": exp.extra_globals, "anchor": exp.anchor},
                         c.signature(), {}, trained_actions)
        pm.rule_params = exp.rule_params()
        return PpoScheduler(pm)

    return current_policy


class SlotTrainingRun(TrainingRun):
    """The per-slot network's own steps of :func:`train`: its model (new, resumed, cloned or warm-started),
    PPO with the imitation keeper, and its folder (network, codec, forecaster); the shared steps are
    :class:`~rlsched.train.run_steps.TrainingRun`'s."""

    def model(self, venv: Any, ckpt: Path | None, data: TeacherData | None,
              scale: float) -> tuple[Any, dict[str, float]]:
        """The network: resumed from ``ckpt``, or new and (with ``bc``) behaviour-cloned; the cloning statistics."""
        from sb3_contrib import MaskablePPO

        from rlsched.learned.ppo_net import SlotScoringPolicy

        exp = self.exp
        bc_stats: dict[str, float] = {}
        if ckpt is not None:
            model = MaskablePPO.load(ckpt, env=venv, device="cpu")
            self.log(f"resumed from {ckpt.name} at step {model.num_timesteps}")
            if exp.bc.steps > 0 and not exp.init_from:
                # Cloned before the checkpoint (its statistics are in that run's log). The card must still name
                # the teacher: the family gate replays it as a baseline (generalisation.cloned_teacher), and a
                # resumed run that forgot it judged its network without its own teacher.
                bc_stats = {"bc/resumed": 1.0}
        else:
            p = exp.ppo
            model = MaskablePPO(
                SlotScoringPolicy, venv, learning_rate=p.learning_rate, n_steps=p.n_steps, batch_size=p.batch_size,
                n_epochs=p.n_epochs, gamma=p.gamma, gae_lambda=p.gae_lambda, clip_range=p.clip_range,
                ent_coef=p.ent_coef, vf_coef=p.vf_coef, max_grad_norm=p.max_grad_norm, seed=exp.seed, device="cpu",
                policy_kwargs={"features_extractor_kwargs": {"n_layouts": 6, "hidden": exp.network.get("hidden", 64)}},
                verbose=0,
            )
            if exp.init_from:
                from rlsched.train.warm_start import warm_start

                warm_start(model, exp, codec_of(exp).signature(), self.log)
            elif exp.bc.steps > 0 and data is not None:
                bc_stats = behaviour_clone(model, exp, data, scale, self.log)
                bc_stats.update({f"bc/labels_{name}": float(n) for name, n in data.labels.items()})
                self.log(f"behaviour cloning: teacher agreement {bc_stats['bc/agreement_before']:.1%} -> "
                         f"{bc_stats['bc/agreement_after']:.1%} on {int(bc_stats['bc/samples'])} samples, "
                         f"{bc_stats['bc/choice_agreement_before']:.1%} -> "
                         f"{bc_stats['bc/choice_agreement_after']:.1%} on the {int(bc_stats['bc/choices'])} "
                         "with more than one legal action")
        if self.tracker is not None:
            self.tracker.attach(model)
            if bc_stats:
                self.tracker.log_metrics(bc_stats, step=0)
        return model, bc_stats

    def learn(self, model: Any, policy: Callable[[], Any], ckpt_dir: Path, data: TeacherData | None, *,
              resumed: bool, quiet: bool) -> None:
        """PPO up to ``total_steps`` with checkpoints, periodic evaluation and the imitation keeper, then a
        last checkpoint."""
        exp = self.exp

        def periodic_eval(step: int) -> None:
            res = evaluate(self.worlds.evaluation[:2], policy, heuristics=["weighted-priority"])
            if self.tracker is not None:
                self.tracker.log_eval(res["summary"], step)
            s = res["summary"]
            self.log(f"step {step}: eval mean JCT ppo {s['ppo']['mean_jct_s'] / 3600:.2f} h vs "
                     f"weighted-priority {s['weighted-priority']['mean_jct_s'] / 3600:.2f} h")

        remaining = max(exp.total_steps - model.num_timesteps, 0)
        cb = progress_callback(exp.total_steps, ckpt_dir, exp.checkpoint_every_steps, exp.eval_every_steps,
                       periodic_eval if exp.eval_every_steps else None, quiet)
        callbacks: Any = cb
        if exp.bc.keep > 0:
            if data is None:  # resumed: the teacher's samples are not in the checkpoint
                data = collect_teacher(exp, self.worlds.training, max(exp.bc.steps, 2000), self.log)
            from stable_baselines3.common.callbacks import CallbackList

            callbacks = CallbackList([cb, imitation_keeper(exp, data, exp.total_steps)])
            self.log(f"imitation kept during PPO: weight {exp.bc.keep:g} annealed to 0 over {exp.total_steps:,} "
                     "steps")
        if remaining:
            model.learn(total_timesteps=remaining, callback=callbacks, reset_num_timesteps=not resumed)
        save_checkpoint(model, ckpt_dir, model.num_timesteps)

    def export(self, out: Path, model: Any, card: dict[str, Any], table: str) -> None:
        """Write the model folder: network, card (with the family gate's verdict), forecaster, MODEL_CARD.md."""
        from rlsched.learned.ppo import PolicyModel

        exp, fitted = self.exp, self.worlds.fitted
        net = model.policy.features_extractor
        PolicyModel.save(out, net, codec_of(exp), card, rules=exp.rule_params(),
                         trained_actions=self.worlds.trained_actions)
        # The forecaster goes in before the gate loads the folder: spot families replay every competitor
        # with the model's forecaster, so a gate run before it would judge worlds without one (a fresh
        # folder) or with an older run's (a reused one) - not the worlds the benchmark replays.
        stale = out / FORECASTER_FILE
        if fitted:
            save_forecaster(out, fitted[exp.scenarios[0].name], float(exp.forecast.horizon_s), exp.scenarios[0].name)
        elif stale.exists():
            stale.unlink()  # a model trained without a forecast must not be served with an old one
        if exp.gate is not None:
            table += "\n" + family_gate(exp, out, card, self.log, ray=self.ray)
            (out / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
        (out / "MODEL_CARD.md").write_text(model_card_markdown(card, table))
        self.log(f"wrote model folder {out}")


