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
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.envs.trained_actions import TrainedActions
from rlsched.errors import RlschedError
from rlsched.train.config import RULE_PARAMS, Experiment
from rlsched.train.evaluate import ORACLE_BOUND, comparison_markdown, evaluate, is_reference, ratio_text
from rlsched.train.families import generated_training_worlds, trained_generator_families
from rlsched.train.forecasting import (
    FORECASTER_FILE,
    attach,
    error_markdown,
    error_metrics,
    fit_forecasters,
    forecast_error,
    save_forecaster,
)
from rlsched.train.worlds import MultiWorldEnv, World, evaluation_worlds, training_worlds


@dataclass
class TrainResult:
    model_dir: Path
    steps: int
    wall_s: float
    eval: dict[str, Any]
    holdout: dict[str, Any] | None
    run_id: str | None
    version: int | None


#: how the card names each rule and says where it acts
_RULE_LINES = (
    ("deadline_guard", "deadline guard", "runs before the network at every decision point, in training and serving"),
    ("consolidate", "node consolidation", "runs after the guard, before the network"),
    ("preempt_long", "long-job preemption", "runs after the other rules, before the network"),
)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _env_kwargs(exp: Experiment) -> dict[str, Any]:
    return {"window": exp.window, "max_pools": exp.max_pools, "episode_jobs": exp.episode_jobs,
            "reward_weights": exp.reward or None, "max_steps": 20_000, "rules": exp.rule_params()}


def make_vec_env(exp: Experiment, worlds: list[World], seed: int) -> Any:
    """``n_envs`` copies of the multi-world env (subprocesses unless ``vec_env: dummy``)."""
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


def collect_teacher(exp: Experiment, worlds: list[World], steps: int) -> TeacherData:
    """Roll the teacher through training worlds and compute its discounted returns."""
    from rlsched.train.teacher import teacher_action

    env = MultiWorldEnv(worlds, **_env_kwargs(exp))
    obs, _ = env.reset(seed=exp.seed + 10_000)
    observations: dict[str, list[np.ndarray]] = {k: [] for k in obs}
    masks, actions, rewards, dones = [], [], [], []
    for i in range(steps):
        inner = env.current
        mask = inner.action_masks()
        a = teacher_action(inner.codec, inner.engine.state, mask, rule=exp.bc.teacher)
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
    return TeacherData({k: np.stack(v) for k, v in observations.items()}, np.stack(masks),
                       np.array(actions), returns)


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

    Buying capacity is ~4% of a spot teacher's decisions and placing on on-demand ~2%, yet
    they decide cost and deadlines; an unweighted clone agreed on 94.6% of all decisions
    while skipping a third of the buys. Each kind gets weight ``(1 / its frequency) ** bc.balance``
    (normalised to mean 1, capped at ``cap``): at 1 rare decisions count as much as common ones,
    which also makes the clone take them too often (a full-balance spot clone bought on-demand
    nodes in quiet hours); 0.5 is the usual compromise.
    """
    from rlsched.envs.codec import ObservationCodec

    codec = ObservationCodec(window=exp.window, max_pools=exp.max_pools)
    kp = codec.window * codec.max_pools
    kinds = np.where(actions == codec.wait_action, 0,
                     np.where(actions >= codec.scale_offset, 1 + (actions - codec.scale_offset),
                              np.where(actions >= kp, 1 + 2 * codec.max_pools,
                                       2 + 2 * codec.max_pools + actions % codec.max_pools)))
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
    (scaled) returns avoids that. Returns teacher agreement before and after.
    """
    import torch

    policy = model.policy
    obs_t = {k: torch.as_tensor(v) for k, v in data.obs.items()}
    mask_np = data.masks
    act_t = torch.as_tensor(data.actions)
    ret_t = torch.as_tensor(data.returns * scale)
    w_t = torch.as_tensor(imitation_weights(exp, data.actions))

    def accuracy() -> float:
        with torch.no_grad():
            dist = policy.get_distribution(obs_t, action_masks=mask_np)
            pred = dist.distribution.probs.argmax(dim=1)
        return float((pred == act_t).float().mean())

    before = accuracy()
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
    after = accuracy()
    return {"bc/agreement_before": before, "bc/agreement_after": after, "bc/samples": float(n)}


def imitation_keeper(exp: Experiment, data: TeacherData, total_steps: int) -> Any:
    """SB3 callback: a few imitation minibatches after each rollout, annealed to 0 over the run.

    PPO after a behaviour clone can drift from it before the sparse reward can say which
    way is better (measured on codec v3: the default experiment's clone at 0.996x WP went
    to 0.998x after PPO). Keeping the teacher's cross-entropy in the objective - weighted
    ``bc.keep`` at the start, nothing at the end - lets PPO move where the advantage is
    clear and stay near the teacher elsewhere (the DAPG recipe, without its demonstration
    advantages). Its effect alone is not isolated yet: on the current default recipe it
    changed nothing (0.973x vs 0.972x), and the spot runs changed other things at once.
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
    from rlsched.envs.codec import ObservationCodec

    layouts = ObservationCodec(window=exp.window, max_pools=exp.max_pools).layouts
    return TrainedActions.of_fleets((w.scenario.pools for w in worlds), max_pools=exp.max_pools, layouts=layouts,
                                    source=f"training worlds of {exp.source or exp.name}: "
                                           + ", ".join(w.label for w in worlds))


def train(
    exp: Experiment,
    *,
    run_dir: Path,
    resume: bool = False,
    log: Callable[[str], None] = print,
    quiet: bool = False,
    track: bool = True,
) -> TrainResult:
    """Train, evaluate, export and (with ``track``) log and register one policy."""
    import torch
    from sb3_contrib import MaskablePPO

    from rlsched.policies.ppo import PolicyModel, PpoScheduler
    from rlsched.policies.ppo_net import SlotScorer, SlotScoringPolicy

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(exp.n_envs, 1)))
    t_start = time.perf_counter()
    worlds = training_worlds(exp.scenarios)
    eval_worlds = evaluation_worlds(exp.scenarios, exp.eval_max_jobs)
    holdout_worlds = evaluation_worlds(exp.holdout, exp.eval_max_jobs) if exp.holdout else []
    # Domain randomisation: worlds drawn from whole workload families (they run without a forecaster).
    gen = exp.generated
    gen_worlds = generated_training_worlds(gen.count, gen.jobs, gen.seed, gen.exclude) if gen else []
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
    worlds = worlds + gen_worlds
    ckpt_dir = run_dir / "checkpoints"
    ckpt = latest_checkpoint(ckpt_dir) if resume else None
    if resume and ckpt is None:
        log(f"no checkpoint in {ckpt_dir}; starting from scratch")
    scale_file = run_dir / "reward_scale.json"
    data = None
    if ckpt is not None and scale_file.exists():
        scale = float(json.loads(scale_file.read_text())["reward_scale"])
    else:
        data = collect_teacher(exp, worlds, max(exp.bc.steps, 2000))
        scale = reward_scale_from(data.returns)
        run_dir.mkdir(parents=True, exist_ok=True)
        scale_file.write_text(json.dumps({"reward_scale": scale}))
    log(f"reward scale {scale:.4g} (unit spread of the teacher's discounted returns)")
    venv = scaled(make_vec_env(exp, worlds, exp.seed), scale)
    tracker = None
    if track and exp.mlflow.enabled:
        from rlsched.train.tracking import Tracker

        tracker = Tracker(exp.mlflow.experiment, run_name=exp.name, params=exp.flat_params(),
                          tags={"git_commit": _git_commit(), "experiment_file": exp.source})
    try:
        bc_stats: dict[str, float] = {}
        if ckpt is not None:
            model = MaskablePPO.load(ckpt, env=venv, device="cpu")
            log(f"resumed from {ckpt.name} at step {model.num_timesteps}")
        else:
            p = exp.ppo
            model = MaskablePPO(
                SlotScoringPolicy, venv, learning_rate=p.learning_rate, n_steps=p.n_steps, batch_size=p.batch_size,
                n_epochs=p.n_epochs, gamma=p.gamma, gae_lambda=p.gae_lambda, clip_range=p.clip_range,
                ent_coef=p.ent_coef, vf_coef=p.vf_coef, max_grad_norm=p.max_grad_norm, seed=exp.seed, device="cpu",
                policy_kwargs={"features_extractor_kwargs": {"n_layouts": 6, "hidden": exp.network.get("hidden", 64)}},
                verbose=0,
            )
            if exp.bc.steps > 0 and data is not None:
                bc_stats = behaviour_clone(model, exp, data, scale, log)
                log(f"behaviour cloning: teacher agreement {bc_stats['bc/agreement_before']:.1%} -> "
                    f"{bc_stats['bc/agreement_after']:.1%} on {int(bc_stats['bc/samples'])} samples")
        if tracker is not None:
            tracker.attach(model)
            if bc_stats:
                tracker.log_metrics(bc_stats, step=0)

        def current_policy() -> PpoScheduler:
            net = model.policy.features_extractor
            assert isinstance(net, SlotScorer)
            from rlsched.envs.codec import ObservationCodec

            c = ObservationCodec(window=exp.window, max_pools=exp.max_pools)
            pm = PolicyModel(net, {"window": c.window, "max_pools": c.max_pools, "layouts": c.layouts},
                             c.signature(), {}, trained_actions)
            pm.rule_params = exp.rule_params()
            return PpoScheduler(pm)

        def periodic_eval(step: int) -> None:
            res = evaluate(eval_worlds[:2], current_policy, heuristics=["weighted-priority"])
            if tracker is not None:
                tracker.log_eval(res["summary"], step)
            s = res["summary"]
            log(f"step {step}: eval mean JCT ppo {s['ppo']['mean_jct_s'] / 3600:.2f} h vs "
                f"weighted-priority {s['weighted-priority']['mean_jct_s'] / 3600:.2f} h")

        remaining = max(exp.total_steps - model.num_timesteps, 0)
        cb = _Progress(exp.total_steps, ckpt_dir, exp.checkpoint_every_steps, exp.eval_every_steps,
                       periodic_eval if exp.eval_every_steps else None, quiet)
        callbacks: Any = cb
        if exp.bc.keep > 0:
            if data is None:  # resumed: the teacher's samples are not in the checkpoint
                data = collect_teacher(exp, worlds, max(exp.bc.steps, 2000))
            from stable_baselines3.common.callbacks import CallbackList

            callbacks = CallbackList([cb, imitation_keeper(exp, data, exp.total_steps)])
            log(f"imitation kept during PPO: weight {exp.bc.keep:g} annealed to 0 over {exp.total_steps:,} steps")
        if remaining:
            model.learn(total_timesteps=remaining, callback=callbacks, reset_num_timesteps=ckpt is None)
        save_checkpoint(model, ckpt_dir, model.num_timesteps)
        train_wall = time.perf_counter() - t_start
        log("evaluating the final policy against every heuristic ...")
        extra: list[Any] = []
        if exp.bc.steps > 0:
            from rlsched.train.teacher import TeacherScheduler

            # the row PPO was cloned from: did training improve on imitation?
            extra.append(lambda: TeacherScheduler(exp.bc.teacher, exp.window, exp.max_pools,
                                                  rules=exp.rule_params()))
        extra.extend(ruled_baselines(exp.rule_params()))
        ev = evaluate(eval_worlds, current_policy, bound=True, extra=extra)
        ho = evaluate(holdout_worlds, current_policy, bound=True, extra=extra) if holdout_worlds else None
        table = comparison_markdown(ev, f"Evaluation windows ({len(eval_worlds)})")
        if ho is not None:
            table += "\n" + comparison_markdown(ho, f"Holdout (unseen shapes, {len(holdout_worlds)} windows)")
        log(table)
        forecast_card: dict[str, Any] | None = None
        if fitted:
            fc_report = forecast_error(exp, eval_worlds, fitted)
            fc_table = error_markdown(fc_report)
            log(fc_table)
            table += "\n" + fc_table
            first = exp.scenarios[0]
            forecast_card = {
                "model": exp.forecast.model, "horizon_s": exp.forecast.horizon_s, "file": FORECASTER_FILE,
                "params": exp.forecast.model_params(), "saved": first.name,
                "fitted_on": {name: {"train_window_h": next(e.train_window_h for e in exp.scenarios
                                                            if e.name == name),
                                     "fit_range_s": getattr(f, "fit_range", None)} for name, f in fitted.items()},
                "error": {"baseline": fc_report["baseline"], "step_s": fc_report["step_s"],
                          "origins": fc_report["origins"], "mean": fc_report["mean"],
                          "windows": {k: ({"origins": v["origins"], "mean_actual": v["mean_actual"],
                                           "model": v["forecaster"], "baseline": v["baseline"]}
                                          if v.get("origins") else {"origins": 0})
                                      for k, v in fc_report["windows"].items()}},
            }
            if tracker is not None:
                tracker.log_metrics(error_metrics(fc_report), step=int(model.num_timesteps))
        from rlsched.envs.codec import ObservationCodec

        codec = ObservationCodec(window=exp.window, max_pools=exp.max_pools)
        card = {
            "name": exp.name,
            "description": exp.description,
            "observation_signature": codec.signature(),
            "experiment": exp.source,
            "scenarios": [{"name": e.name, "scenario": e.scenario, "train_window_h": e.train_window_h,
                           "eval_windows_h": e.eval_windows_h, "clusters": e.clusters,
                           "load_factors": e.load_factors} for e in exp.scenarios],
            "holdout": [{"name": e.name, "scenario": e.scenario, "eval_windows_h": e.eval_windows_h,
                         "clusters": e.clusters, "load_factors": e.load_factors} for e in exp.holdout],
            "training_worlds": [w.label for w in worlds],
            "families": trained_generator_families(gen.exclude) if gen else [],
            "generated": {"count": gen.count, "jobs": gen.jobs, "seed": gen.seed, "exclude": list(gen.exclude)}
            if gen else None,
            "steps": int(model.num_timesteps),
            "seed": exp.seed,
            "wall_s": round(train_wall, 1),
            "behaviour_cloning": {"teacher": exp.bc.teacher, **bc_stats} if bc_stats else None,
            "git_commit": _git_commit(),
            "metrics": {"eval": ev["summary"], "eval_relative": ev["relative"],
                        "holdout": ho["summary"] if ho else None,
                        "holdout_relative": ho["relative"] if ho else None},
            "per_window": {"eval": ev["worlds"], "holdout": ho["worlds"] if ho else None},
            "command": f"rlsched train {exp.source}",
            "trained_actions": trained_actions.to_dict(),
            "forecast": forecast_card,
            **{name: exp.rule_params().get(name) for name in RULE_PARAMS},
        }
        out = Path(exp.output) if exp.output else run_dir / "model"
        net = model.policy.features_extractor
        PolicyModel.save(out, net, codec, card, rules=exp.rule_params(), trained_actions=trained_actions)
        if exp.gate is not None:
            table += "\n" + _family_gate(exp, out, card, log)
            (out / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
        stale = out / FORECASTER_FILE
        if fitted:
            save_forecaster(out, fitted[exp.scenarios[0].name], float(exp.forecast.horizon_s), exp.scenarios[0].name)
        elif stale.exists():
            stale.unlink()  # a model trained without a forecast must not be served with an old one
        (out / "MODEL_CARD.md").write_text(model_card_markdown(card, table))
        log(f"wrote model folder {out}")
        run_id = version = None
        if tracker is not None:
            tracker.log_artifacts(out)
            run_id = tracker.run_id
            version = tracker.register(out, exp.mlflow.registered_model,
                                       tags={"observation_signature": codec.signature(),
                                             "training_data": ";".join(e.name for e in exp.scenarios)})
            if version is not None:
                log(f"registered {exp.mlflow.registered_model} version {version} (alias challenger)")
                card["mlflow"] = {"run_id": run_id, "registered_model": exp.mlflow.registered_model,
                                  "version": version}
                (out / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
        return TrainResult(out, int(model.num_timesteps), time.perf_counter() - t_start, ev, ho, run_id, version)
    finally:
        venv.close()
        if tracker is not None:
            tracker.close()


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


def _family_gate(exp: Experiment, folder: Path, card: dict[str, Any], log: Callable[[str], None]) -> str:
    """Judge the saved policy on the gate's workload families; store the result in ``card``; its markdown."""
    from rlsched.train.families import resolve
    from rlsched.train.generalisation import evaluate_families, family_checks, family_table, verdict

    assert exp.gate is not None
    fams = resolve(list(exp.gate.families))
    log(f"judging the policy on {len(fams)} workload families (promotion gate: <= 1.02x the best heuristic "
        f"on every unseen one) ...")
    report = evaluate_families(fams, str(folder), card=card, windows=exp.gate.windows, max_jobs=exp.gate.max_jobs)
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


def spot_summary(card: dict[str, Any]) -> list[str]:
    """Card lines on spot economics, when the evaluation has the on-demand-only reference.

    Cost and JCT against on-demand-only capacity, deadline misses against Uniform
    Progress (issue 6's yardstick), and every policy that is both cheaper and misses
    no more deadlines - where a baseline wins, the card says so.
    """
    rel, ev = card["metrics"]["eval_relative"], card["metrics"]["eval"]
    mine = rel.get("ppo", {})
    if "cost_vs_ondemand" not in mine:
        return []
    misses = ev["ppo"]["deadline_misses"]
    up = ev.get("uniform-progress", {}).get("deadline_misses")
    better = sorted(p for p, r in rel.items() if p != "ppo" and not is_reference(p)
                    and r.get("cost_vs_ondemand", float("inf")) < mine["cost_vs_ondemand"]
                    and ev[p]["deadline_misses"] <= misses)
    return [
        f"Against on-demand-only capacity (`ondemand-autoscale`), mean over the evaluation windows: cost "
        f"{mine['cost_vs_ondemand']:.3f}x, mean JCT {mine['jct_vs_ondemand']:.3f}x, {misses:.1f} deadline misses "
        f"per window" + (f" (uniform-progress: {up:.1f})." if up is not None else "."),
        "",
        "Cheaper than it with no more deadline misses: " + (", ".join(better) if better else "none") + ".",
        "",
    ]


def model_card_markdown(card: dict[str, Any], table: str) -> str:
    """The human model card (MODEL_CARD.md) next to card.json."""
    rel = card["metrics"]["eval_relative"].get("ppo", {})
    wins = []
    for p, s in card["metrics"]["eval"].items():
        if p != "ppo" and not is_reference(p) and s["mean_jct_s"] < card["metrics"]["eval"]["ppo"]["mean_jct_s"]:
            wins.append(p)
    bound = card["metrics"]["eval_relative"].get(ORACLE_BOUND, {}).get("jct_vs_weighted_priority")
    lines = [
        f"# Model card: {card['name']}",
        "",
        card.get("description") or "",
        "",
        f"- observation signature: `{card['observation_signature']}`",
        f"- produced by: `{card['command']}` (git {card['git_commit'][:12]})",
        f"- steps: {card['steps']:,}, seed {card['seed']}, training wall time {card['wall_s']:.0f} s",
        f"- training worlds: {len(card['training_worlds'])} ({', '.join(card['training_worlds'][:6])}"
        f"{', ...' if len(card['training_worlds']) > 6 else ''})",
        f"- behaviour cloning: {card['behaviour_cloning'] or 'off'}",
        *([f"- trained actions (`actions.json`; the rest is masked and left to weighted-priority when served): "
           f"{TrainedActions.from_dict(card['trained_actions']).describe()}"] if card.get("trained_actions") else []),
        *(f"- {title}: {card[name]} ({where}; `{name}.json`)" for name, title, where in _RULE_LINES if card.get(name)),
        "",
        f"On the evaluation windows the policy's mean JCT is {ratio_text(rel.get('jct_vs_weighted_priority'))}x "
        + (f"weighted-priority's at {ratio_text(rel.get('cost_vs_weighted_priority'))}x its cost."
           if ratio_text(rel.get("cost_vs_weighted_priority")) != "-"
           else "weighted-priority's (which paid nothing for capacity there, so there is no cost ratio)."),
        "",
        "Heuristics that still beat it on mean JCT: " + (", ".join(sorted(wins)) if wins else "none") + ".",
        "",
        *spot_summary(card),
        *([f"Headroom: `{ORACLE_BOUND}` (SJF told every job's true duration - information no scheduler has) "
           f"reaches {bound:.3f}x weighted-priority's mean JCT on these windows; it bounds what job ordering "
           "alone can gain here and is a reference row, not a competitor.", ""] if bound is not None else []),
        table,
    ]
    return "\n".join(lines) + "\n"
