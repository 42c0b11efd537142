"""``rlsched train``: MaskablePPO over the simulator, tracked in MLflow, exported as a model folder.

The loop: build training worlds from the experiment, optionally behaviour-clone
the weighted-priority teacher, run MaskablePPO with checkpoints (``--resume``
continues from the last one) and periodic evaluation, then evaluate the final
policy on every evaluation and holdout window against every heuristic, write the
model folder with its card, and log and register it in MLflow.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlsched.envs.trained_actions import TrainedActions
from rlsched.errors import RlschedError
from rlsched.train.config import Experiment
from rlsched.train.evaluate import comparison_markdown, evaluate
from rlsched.train.families import generated_training_worlds
from rlsched.train.forecast_fit import (
    FORECASTER_FILE,
    attach,
    error_markdown,
    error_metrics,
    fit_forecasters,
    forecast_error,
    save_forecaster,
)
from rlsched.train.model_card import CardFacts, build_card, forecast_card, git_commit, model_card_markdown
from rlsched.train.worlds import MultiWorldEnv, World, evaluation_worlds, training_worlds

if TYPE_CHECKING:
    from rlsched.envs.codec import ObservationCodec
    from rlsched.train.tracking import Tracker


@dataclass
class TrainResult:
    model_dir: Path
    steps: int
    wall_s: float
    eval: dict[str, Any]
    holdout: dict[str, Any] | None
    run_id: str | None
    version: int | None


def _env_kwargs(exp: Experiment) -> dict[str, Any]:
    return {"window": exp.window, "max_pools": exp.max_pools, "nominators": exp.nominators,
            **({"preempt_slots": exp.preempt_slots} if exp.preempt_slots else {}),
            **({"extra_globals": exp.extra_globals} if exp.extra_globals else {}),
            "episode_jobs": exp.episode_jobs,
            "reward_weights": exp.reward or None, "max_steps": 20_000, "rules": exp.rule_params()}


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
    codec = _codec(exp)
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


class _Progress:
    """SB3 callback: a live progress bar (reward, fps), checkpoints and periodic evaluation."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
        from stable_baselines3.common.callbacks import BaseCallback

        class Callback(BaseCallback):
            def __init__(self, total: int, ckpt_dir: Path, ckpt_every: int, eval_every: int,
                         on_eval: Callable[[int], None] | None, quiet: bool) -> None:
                super().__init__()
                self.total, self.ckpt_dir, self.ckpt_every = total, ckpt_dir, ckpt_every
                self.eval_every, self.on_eval = eval_every, on_eval
                self.progress = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                                         TextColumn("{task.fields[info]}"), TimeRemainingColumn(), disable=quiet)
                self.task: Any = None
                self.t0 = time.perf_counter()
                self.start_steps = 0
                self.last_ckpt = 0
                self.last_eval = 0

            def _on_training_start(self) -> None:
                self.start_steps = self.num_timesteps
                self.last_ckpt = self.last_eval = self.num_timesteps
                self.progress.start()
                self.task = self.progress.add_task("train", total=self.total, completed=self.num_timesteps,
                                                   info="")

            def _on_step(self) -> bool:
                n = self.num_timesteps
                if n % 64 == 0 or n >= self.total:
                    buf = self.model.ep_info_buffer
                    rew = np.mean([e["r"] for e in buf]) if buf else float("nan")
                    fps = (n - self.start_steps) / max(time.perf_counter() - self.t0, 1e-9)
                    self.progress.update(self.task, completed=n, info=f"reward {rew:9.2f}  {fps:6.0f} steps/s")
                if self.ckpt_every and n - self.last_ckpt >= self.ckpt_every:
                    self.last_ckpt = n
                    save_checkpoint(self.model, self.ckpt_dir, n)
                if self.on_eval is not None and self.eval_every and n - self.last_eval >= self.eval_every:
                    self.last_eval = n
                    self.on_eval(n)
                return True

            def _on_training_end(self) -> None:
                self.progress.stop()

        return Callback(*args, **kwargs)


def save_checkpoint(model: Any, ckpt_dir: Path, steps: int) -> Path:
    """Atomically save a resumable checkpoint and point ``latest`` at it."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step-{steps:09d}.zip"
    tmp = ckpt_dir / f".step-{steps:09d}.tmp.zip"
    model.save(tmp)
    tmp.replace(path)
    latest = ckpt_dir / "latest.json"
    tmp_latest = ckpt_dir / ".latest.json.tmp"
    tmp_latest.write_text(json.dumps({"path": path.name, "steps": steps}))
    tmp_latest.replace(latest)
    return path


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    latest = ckpt_dir / "latest.json"
    if not latest.exists():
        return None
    try:
        name = json.loads(latest.read_text())["path"]
    except (ValueError, KeyError):
        raise RlschedError(f"{latest}: corrupted checkpoint index; delete it to start over") from None
    path = ckpt_dir / name
    return path if path.exists() else None


def worlds_actions(worlds: list[World], exp: Experiment) -> TrainedActions:
    """The action kinds legal somewhere in the training ``worlds`` (the model folder's ``actions.json``)."""
    from rlsched.policies.rules import owned_actions

    layouts = _codec(exp).layouts
    fleets = TrainedActions.of_fleets((w.scenario.pools for w in worlds), max_pools=exp.max_pools, layouts=layouts,
                                      source=f"training worlds of {exp.source or exp.name}: "
                                             + ", ".join(w.label for w in worlds), preempt_slots=exp.preempt_slots)
    return fleets.without(owned_actions(exp.rule_params()))  # a rule's actions are the rule's


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

        return train_selector(exp, run_dir=run_dir, resume=resume, log=log, quiet=quiet, track=track)
    import sb3_contrib  # noqa: F401  (without the train extra, fail before building any world)
    import torch

    ray = None
    if exp.ray:
        from rlsched.ray_connect import connect

        ray = connect(exp.ray)  # fail on a bad address before building any world
    # the same learner threads with or without Ray: a different count may change the float sums of the
    # updates, and a Ray run must learn what the local run learns
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(exp.n_envs, 1)))
    t_start = time.perf_counter()
    worlds = _prepare_worlds(exp, log)
    ckpt_dir = run_dir / "checkpoints"
    ckpt = latest_checkpoint(ckpt_dir) if resume else None
    if resume and ckpt is None:
        log(f"no checkpoint in {ckpt_dir}; starting from scratch")
    scale, data = _reward_scale(exp, run_dir, worlds.training, resumed=ckpt is not None, log=log)
    venv = scaled(make_vec_env(exp, worlds.training, exp.seed, ray=ray), scale)
    if ray is not None:
        log(f"{exp.n_envs} environment actors on the Ray cluster at {ray}")
    ray_tags = {"ray_address": ray, "ray_env_actors": str(exp.n_envs)} if ray is not None else {}
    run = _TrainingRun(exp, worlds, log, _start_tracker(exp, ray_tags) if track and exp.mlflow.enabled else None,
                       ray)
    try:
        model, bc_stats = run.model(venv, ckpt, data, scale)
        policy = _policy_factory(model, exp, worlds.trained_actions)
        run.learn(model, policy, ckpt_dir, data, resumed=ckpt is not None, quiet=quiet)
        venv.close()  # the environments are done: free their workers (Ray actors' CPUs) for the gate's replays
        train_wall = time.perf_counter() - t_start
        ev, ho, table = run.final_evaluation(policy)
        forecast, table = run.forecast_section(int(model.num_timesteps), table)
        codec = _codec(exp)
        card = build_card(exp, CardFacts(codec.signature(), [w.label for w in worlds.training],
                                         int(model.num_timesteps), train_wall, bc_stats, ev, ho,
                                         worlds.trained_actions, forecast))
        out = Path(exp.output) if exp.output else run_dir / "model"
        run.export(out, model, card, table)
        run_id, version = run.register(out, card, codec.signature())
        return TrainResult(out, int(model.num_timesteps), time.perf_counter() - t_start, ev, ho, run_id, version)
    finally:
        venv.close()
        if run.tracker is not None:
            run.tracker.close()


def _codec(exp: Experiment) -> ObservationCodec:
    """The observation codec of the experiment's network."""
    from rlsched.envs.codec import ObservationCodec

    return ObservationCodec(window=exp.window, max_pools=exp.max_pools, nominators=exp.nominators,
                            preempt_slots=exp.preempt_slots, extra_globals=exp.extra_globals)


@dataclass
class _Worlds:
    """The worlds of one training run.

    Attributes:
        training: the training worlds, the generated ones (domain randomisation) last.
        evaluation: the evaluation windows.
        holdout: the holdout windows (unseen shapes), possibly none.
        trained_actions: the action kinds legal somewhere in ``training``.
        fitted: the demand forecaster fitted per scenario (empty without ``forecast``).
    """

    training: list[World]
    evaluation: list[World]
    holdout: list[World]
    trained_actions: TrainedActions
    fitted: dict[str, Any]


def _prepare_worlds(exp: Experiment, log: Callable[[str], None]) -> _Worlds:
    """Build the training, evaluation and holdout worlds; fit and attach the demand forecaster."""
    worlds = training_worlds(exp.scenarios)
    eval_worlds = evaluation_worlds(exp.scenarios, exp.eval_max_jobs)
    holdout_worlds = evaluation_worlds(exp.holdout, exp.eval_max_jobs) if exp.holdout else []
    # Domain randomisation: worlds drawn from whole workload families (they run without a forecaster).
    gen = exp.generated
    gen_worlds = generated_training_worlds(gen.count, gen.jobs, gen.seed, gen.exclude, gen.max_nodes) if gen else []
    log(f"{len(worlds) + len(gen_worlds)} training worlds ({len(gen_worlds)} generated), {len(eval_worlds)} "
        f"evaluation windows, {len(holdout_worlds)} holdout windows")
    # The action kinds the network can learn here: written into the model folder, and masked outside
    # them in every evaluation below, as when the model is served.
    trained_actions = worlds_actions(worlds + gen_worlds, exp)
    log(f"trained actions: {trained_actions.describe()}")
    # The demand forecaster: fitted on the training windows only; every training episode and every
    # evaluation replay (policy and heuristics alike) runs with a fresh copy of it.
    fitted = fit_forecasters(exp)
    if fitted:
        worlds = attach(exp, worlds, fitted)
        eval_worlds = attach(exp, eval_worlds, fitted)
        holdout_worlds = attach(exp, holdout_worlds, fitted, holdout=True)
        log(f"demand forecaster {exp.forecast.model} (horizon {exp.forecast.horizon_s:g} s) fitted on the "
            f"training windows of {', '.join(fitted)}")
    return _Worlds(worlds + gen_worlds, eval_worlds, holdout_worlds, trained_actions, fitted)


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


def _start_tracker(exp: Experiment, extra_tags: dict[str, str] | None = None) -> Tracker:
    """An MLflow run for this experiment, tagged with the code's commit, the experiment file and ``extra_tags``."""
    from rlsched.train.tracking import Tracker

    return Tracker(exp.mlflow.experiment, run_name=exp.name, params=exp.flat_params(),
                   tags={"git_commit": git_commit(), "experiment_file": exp.source, **(extra_tags or {})})


def _policy_factory(model: Any, exp: Experiment, trained_actions: TrainedActions) -> Callable[[], Any]:
    """A function giving the network as it is now as a scheduler (for evaluations during and after training)."""
    from rlsched.learned.ppo import PolicyModel, PpoScheduler
    from rlsched.learned.ppo_net import SlotScorer

    def current_policy() -> PpoScheduler:
        net = model.policy.features_extractor
        assert isinstance(net, SlotScorer)
        c = _codec(exp)
        pm = PolicyModel(net, {"window": c.window, "max_pools": c.max_pools, "layouts": c.layouts,
                              "nominators": exp.nominators, "preempt_slots": exp.preempt_slots,
                              "extra_globals": exp.extra_globals},
                         c.signature(), {}, trained_actions)
        pm.rule_params = exp.rule_params()
        return PpoScheduler(pm)

    return current_policy


@dataclass
class _TrainingRun:
    """The steps of :func:`train` after the worlds and the reward scale: model, learning, evaluation, export."""

    exp: Experiment
    worlds: _Worlds
    log: Callable[[str], None]
    tracker: Tracker | None
    ray: str | None = None

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

                warm_start(model, exp, _codec(exp).signature(), self.log)
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
        cb = _Progress(exp.total_steps, ckpt_dir, exp.checkpoint_every_steps, exp.eval_every_steps,
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

    def final_evaluation(self, policy: Callable[[], Any]) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
        """The policy against every heuristic (and the teacher's and ruled rows) on the evaluation and holdout
        windows, and the comparison tables."""
        exp, w = self.exp, self.worlds
        self.log("evaluating the final policy against every heuristic ...")
        extra = [*_teacher_rows(exp), *ruled_baselines(exp.rule_params())]
        if self.ray is not None:  # one Ray task per window; the policy travels as its PolicyModel
            from rlsched.train.ray_evaluate import evaluate_on_ray

            model = policy().model
            ev = evaluate_on_ray(self.ray, w.evaluation, model, bound=True, extra=extra)
            ho = evaluate_on_ray(self.ray, w.holdout, model, bound=True, extra=extra) if w.holdout else None
        else:
            ev = evaluate(w.evaluation, policy, bound=True, extra=extra)
            ho = evaluate(w.holdout, policy, bound=True, extra=extra) if w.holdout else None
        table = comparison_markdown(ev, f"Evaluation windows ({len(w.evaluation)})")
        if ho is not None:
            table += "\n" + comparison_markdown(ho, f"Holdout (unseen shapes, {len(w.holdout)} windows)")
        self.log(table)
        return ev, ho, table

    def forecast_section(self, step: int, table: str) -> tuple[dict[str, Any] | None, str]:
        """The forecaster's error on the evaluation windows: the card's section and ``table`` with its table."""
        fitted = self.worlds.fitted
        if not fitted:
            return None, table
        report = forecast_error(self.exp, self.worlds.evaluation, fitted)
        fc_table = error_markdown(report)
        self.log(fc_table)
        if self.tracker is not None:
            self.tracker.log_metrics(error_metrics(report), step=step)
        return forecast_card(self.exp, fitted, report), table + "\n" + fc_table

    def export(self, out: Path, model: Any, card: dict[str, Any], table: str) -> None:
        """Write the model folder: network, card (with the family gate's verdict), forecaster, MODEL_CARD.md."""
        from rlsched.learned.ppo import PolicyModel

        exp, fitted = self.exp, self.worlds.fitted
        net = model.policy.features_extractor
        PolicyModel.save(out, net, _codec(exp), card, rules=exp.rule_params(),
                         trained_actions=self.worlds.trained_actions)
        if exp.gate is not None:
            table += "\n" + _family_gate(exp, out, card, self.log, ray=self.ray)
            (out / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
        stale = out / FORECASTER_FILE
        if fitted:
            save_forecaster(out, fitted[exp.scenarios[0].name], float(exp.forecast.horizon_s), exp.scenarios[0].name)
        elif stale.exists():
            stale.unlink()  # a model trained without a forecast must not be served with an old one
        (out / "MODEL_CARD.md").write_text(model_card_markdown(card, table))
        self.log(f"wrote model folder {out}")

    def register(self, out: Path, card: dict[str, Any], signature: str) -> tuple[str | None, int | None]:
        """Log the model folder to MLflow and register it (alias challenger); the run id and version."""
        if self.tracker is None:
            return None, None
        exp = self.exp
        self.tracker.log_artifacts(out)
        run_id = self.tracker.run_id
        version = self.tracker.register(out, exp.mlflow.registered_model,
                                        tags={"observation_signature": signature,
                                              "training_data": ";".join(e.name for e in exp.scenarios)})
        if version is not None:
            self.log(f"registered {exp.mlflow.registered_model} version {version} (alias challenger)")
            card["mlflow"] = {"run_id": run_id, "registered_model": exp.mlflow.registered_model, "version": version}
            (out / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
        return run_id, version


def _teacher_rows(exp: Experiment) -> list[Callable[[], Any]]:
    """The row(s) PPO was cloned from, for the final evaluation: did training improve on imitation?"""
    if exp.bc.steps <= 0:
        return []
    from rlsched.train.teacher import FOLLOW, TeacherScheduler

    def teacher(rule: str) -> Any:
        return TeacherScheduler(rule, exp.window, exp.max_pools, rules=exp.rule_params(), nominators=exp.nominators,
                                preempt_slots=exp.preempt_slots)

    taught = ([f"{FOLLOW}{n}" for n in exp.nominators] if exp.bc.teacher == "best-follow"
              else [f"{FOLLOW}{n}" for n in exp.bc.lookahead_candidates(exp.nominators)]
              if exp.bc.teacher == "lookahead" else [exp.bc.teacher])
    return [functools.partial(teacher, rule) for rule in taught]


def ruled_baselines(rule_params: dict[str, dict[str, Any]]) -> list[Callable[[], Any]]:
    """Every heuristic behind the rules the policy is trained and served behind, as ``NAME+rules`` rows.

    A policy behind a deadline guard or consolidation must beat the heuristics given the same rules,
    or its gain is the rules' (issue 16 item 4). Empty when the policy has no rules.
    """
    if not rule_params:
        return []
    from rlsched.policies import available, make_policy
    from rlsched.policies.rules import RuledScheduler, build_rules

    def ruled(name: str) -> Any:
        sched = RuledScheduler(make_policy(name), build_rules(rule_params))
        sched.name = f"{name}+rules"
        return sched

    return [functools.partial(ruled, name) for name in available()]


def _family_gate(exp: Experiment, folder: Path, card: dict[str, Any], log: Callable[[str], None], *,
                 ray: str | None = None) -> str:
    """Judge the saved policy on the gate's workload families (replays as Ray tasks with ``ray``); store the
    result in ``card``; its markdown."""
    from rlsched.train.families import resolve
    from rlsched.train.generalisation import evaluate_families, family_checks, family_table, verdict

    assert exp.gate is not None
    fams = resolve(list(exp.gate.families))
    log(f"judging the policy on {len(fams)} workload families (promotion gate: <= 1.02x the best heuristic "
        f"on every unseen one) ...")
    report = evaluate_families(fams, str(folder), card=card, windows=exp.gate.windows, max_jobs=exp.gate.max_jobs,
                               ray=ray)
    card["metrics"]["families"] = {"summary": report.summaries, "exposure": report.exposure,
                                   "skipped": report.skipped, "windows": report.windows,
                                   "settings": {"families": list(exp.gate.families), "windows": exp.gate.windows,
                                                "max_jobs": exp.gate.max_jobs}}
    checks = family_checks(report.summaries, report.exposure)
    passed = all(ok for ok, _ in checks)
    lines = [f"### Workload families ({exp.gate.windows} windows each, at most {exp.gate.max_jobs:,} jobs; "
             f"mean of per-window ratios)", "", family_table(report), "",
             *(f"- {line}" for line in verdict(report.summaries, report.exposure)),
             f"- promotion gate: {'PASS' if passed else 'FAIL'}"
             + ("" if passed else " (" + "; ".join(t for ok, t in checks if not ok) + ")")]
    text = "\n".join(lines)
    log(text)
    return text
