"""Training a heuristic selector: ``rlsched train`` on an experiment with a ``selector:`` section.

The same run as the per-slot network's (:func:`rlsched.train.trainer.train`) where it can be,
through the steps both share (:mod:`rlsched.train.run_steps`): the same training worlds (trace
windows and generated families), MaskablePPO with the experiment's ``ppo:`` settings, resumable
checkpoints and the live progress bar, the final evaluation against every heuristic on the
evaluation and holdout windows, the model card, the workload-family promotion gate, MLflow
tracking and registration. What differs is the environment
(:class:`~rlsched.envs.selector_env.SelectorEnv`: one step is one choice of heuristic for
``selector.hold_s`` seconds), the network (SB3's ``MlpPolicy`` on the regime features) and the
folder (:class:`~rlsched.learned.selector.SelectorModel`). No single teacher is cloned (the
candidates are each one action away); the warm start imitates counterfactual labels instead
(:mod:`rlsched.train.selector_labels`: which candidate did best from each labelled state).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlsched.errors import RlschedError
from rlsched.train.config import Experiment, SelectorParams

if TYPE_CHECKING:
    from rlsched.learned.selector import SelectorModel, SelectorScheduler
    from rlsched.train.run_steps import TrainResult
    from rlsched.train.selector_labels import SelectorLabels
    from rlsched.train.worlds import World


def selector_venv(worlds: list[World], params: SelectorParams, n_envs: int, seed: int) -> Any:
    """``n_envs`` monitored selector environments over ``worlds`` in this process (a choice of heuristic
    replays a whole hour in milliseconds, so worker processes would cost more than they save)."""
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlsched.envs.selector_env import SelectorEnv

    scenarios = [w.scenario for w in worlds]

    def factory(i: int) -> Callable[[], Any]:
        def make() -> Any:
            env = SelectorEnv(scenarios, params.candidates, hold_s=params.hold_s, episode_jobs=params.episode_jobs)
            env.reset(seed=seed + i)
            return Monitor(env)

        return make

    venv = DummyVecEnv([factory(i) for i in range(n_envs)])
    venv.seed(seed)
    return venv


def new_model(exp: Experiment, venv: Any) -> Any:
    """A MaskablePPO ``MlpPolicy`` (two tanh layers of ``network.hidden``) with the experiment's PPO settings."""
    from sb3_contrib import MaskablePPO

    p, hidden = exp.ppo, int(exp.network.get("hidden", 64))
    return MaskablePPO("MlpPolicy", venv, learning_rate=p.learning_rate, n_steps=p.n_steps, batch_size=p.batch_size,
                       n_epochs=p.n_epochs, gamma=p.gamma, gae_lambda=p.gae_lambda, clip_range=p.clip_range,
                       ent_coef=p.ent_coef, vf_coef=p.vf_coef, max_grad_norm=p.max_grad_norm, seed=exp.seed,
                       device="cpu", policy_kwargs={"net_arch": [hidden, hidden]}, verbose=0)


def export(model: Any, params: SelectorParams, card: dict[str, Any] | None = None,
           default: str | None = None) -> SelectorModel:
    """The trained network as a :class:`SelectorModel` (numpy weights), with ``default`` and the margin when
    the experiment sets one."""
    from rlsched.learned.selector import SelectorModel

    return SelectorModel.from_sb3(model.policy, params.candidates, params.hold_s, card,
                                  default=default if params.margin > 0 else None, margin=params.margin)


def resolve_default(params: SelectorParams, safest: int | None, log: Callable[[str], None]) -> str | None:
    """The experiment's ``selector.default`` (None without a margin): a named candidate, or for ``auto`` the
    labels' safest one."""
    if params.margin <= 0:
        return None
    if params.default != "auto":
        name = params.default
    elif safest is None:  # resumed, and the run dir no longer holds this run's labels
        raise RlschedError("selector.default: auto needs this run's labels, and the run directory holds none for "
                           "these settings; train without --resume or name the default candidate")
    else:
        name = params.candidates[safest]
    log(f"unsure choices (probability within {params.margin:g} of {name}'s) go to {name}")
    return name


def train_selector(exp: Experiment, *, run_dir: Path, resume: bool = False, log: Callable[[str], None] = print,
                   quiet: bool = False, track: bool = True) -> TrainResult:
    """Train, evaluate, export and (with ``track``) log and register one heuristic selector."""
    import sb3_contrib  # noqa: F401  (without the train extra, fail before building any world)

    from rlsched.train.model_card import CardFacts, build_card, model_card_markdown
    from rlsched.train.run_steps import (
        TrainingRun,
        TrainResult,
        family_gate,
        latest_checkpoint,
        prepare_worlds,
        progress_callback,
        save_checkpoint,
        start_tracker,
    )

    params = exp.selector
    assert params is not None
    if exp.ray:
        log("selector training runs in this process (its environments are cheap); --ray is not used")
    t_start = time.perf_counter()
    worlds = prepare_worlds(exp, log)
    log(f"selector over {', '.join(params.candidates)}: one choice per {params.hold_s:g} s, episodes of "
        f"{params.episode_jobs:,} jobs")
    venv = selector_venv(worlds.training, params, exp.n_envs, exp.seed)
    ckpt_dir = run_dir / "checkpoints"
    ckpt = latest_checkpoint(ckpt_dir) if resume else None
    if resume and ckpt is None:
        log(f"no checkpoint in {ckpt_dir}; starting from scratch")
    run = TrainingRun(exp, worlds, log, start_tracker(exp) if track and exp.mlflow.enabled else None)
    bc_stats: dict[str, float] = {}
    safest: int | None = None
    try:
        if ckpt is not None:
            from sb3_contrib import MaskablePPO

            model = MaskablePPO.load(ckpt, env=venv, device="cpu")
            log(f"resumed from {ckpt.name} at step {model.num_timesteps}")
            safest = cached_safest(params, worlds.training, run_dir, exp.seed)
        else:
            model = new_model(exp, venv)
            if params.label_count > 0:
                bc_stats, safest = warm_start(model, params, worlds.training, run_dir, exp.seed, log)
        default = resolve_default(params, safest, log)  # before PPO: a resumed run without its labels stops now
        if run.tracker is not None:
            run.tracker.attach(model)
            if bc_stats:
                run.tracker.log_metrics(bc_stats, step=0)
        remaining = max(exp.total_steps - model.num_timesteps, 0)
        if remaining:
            cb = progress_callback(exp.total_steps, ckpt_dir, exp.checkpoint_every_steps, 0, None, quiet)
            model.learn(total_timesteps=remaining, callback=cb, reset_num_timesteps=ckpt is None)
        save_checkpoint(model, ckpt_dir, model.num_timesteps)
        train_wall = time.perf_counter() - t_start
        if bc_stats.get("selector/labels_reused"):
            train_wall += bc_stats["selector/label_wall_s"]  # what those labels cost when they were made

        def policy() -> SelectorScheduler:
            return export(model, params, default=default).scheduler("ppo")

        ev, ho, table = run.final_evaluation(policy)
        selector = export(model, params, default=default)
        card = build_card(exp, CardFacts(selector.signature, [w.label for w in worlds.training],
                                         int(model.num_timesteps), train_wall, bc_stats, ev, ho,
                                         worlds.trained_actions,
                                         None))
        card["behaviour_cloning"] = {"teacher": "selector-labels", **bc_stats} if bc_stats else None
        card["selector"] = {"candidates": list(params.candidates), "hold_s": params.hold_s,
                            "episode_jobs": params.episode_jobs, "features": list(selector.features),
                            "default": default, "margin": params.margin,
                            "choices": _choices(worlds.evaluation, policy)}
        out = Path(exp.output) if exp.output else run_dir / "model"
        selector.card = card
        selector.save(out)
        if exp.gate is not None:
            table += "\n" + family_gate(exp, out, card, log)
            selector.save(out)
        (out / "MODEL_CARD.md").write_text(model_card_markdown(card, table))
        log(f"wrote selector folder {out}")
        run_id, version = run.register(out, card, selector.signature)
        return TrainResult(out, int(model.num_timesteps), time.perf_counter() - t_start, ev, ho, run_id, version)
    finally:
        venv.close()
        if run.tracker is not None:
            run.tracker.close()


def warm_start(model: Any, params: SelectorParams, worlds: list[World], run_dir: Path, seed: int,
               log: Callable[[str], None]) -> tuple[dict[str, float], int]:
    """Clone the policy on counterfactual labels (:mod:`rlsched.train.selector_labels`); the statistics and
    the index of the labels' safest candidate (:meth:`~rlsched.train.selector_labels.SelectorLabels.safest`).

    The labels are saved in ``run_dir`` (``selector_labels.npz``) and reused by a later run with the
    same labelling settings and training worlds, since labelling is most of a run's time.
    """
    import numpy as np

    from rlsched.train.selector_labels import clone_labels, collect_labels

    key = _labels_key(params, worlds, seed)
    cache = run_dir / "selector_labels.npz"
    labels = _cached_labels(cache, key)
    cache_hit = labels is not None
    if labels is not None:
        log(f"reusing {len(labels.obs):,} labelled states from {cache}")
    else:
        log(f"labelling {params.label_count:,} states: each candidate rolled {params.label_horizon_s:g} s ahead "
            f"every {params.label_every} choices ...")
        labels = collect_labels([w.scenario for w in worlds], params, seed, log)
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / ".selector_labels.tmp.npz"
        np.savez(tmp, key=key, obs=labels.obs, costs=labels.costs, wall_s=labels.wall_s)
        tmp.replace(cache)
    cached_wall = labels.wall_s
    safest = labels.safest()  # of the first round's labels, which a resumed run finds in the cache too
    for rnd in range(params.label_rounds + 1):
        if rnd:
            # DAgger: label the states the policy cloned so far reaches by its own choices
            log(f"labelling round {rnd + 1}: {params.label_count:,} states along the cloned policy's own "
                f"trajectories ...")
            labels = labels + collect_labels([w.scenario for w in worlds], params, seed + 1000 * rnd, log,
                                             follow=_greedy(model.policy))
        best = labels.costs.argmin(axis=1)
        wins = {name: int((best == k).sum()) for k, name in enumerate(params.candidates)}
        log("labels won by: " + ", ".join(f"{n} {c}" for n, c in wins.items()) + f" ({labels.wall_s:.0f} s)")
        stats = clone_labels(model.policy, labels, params, seed=seed)
        log(f"cloned the labels: greedy choice within {params.label_temperature:.0%} of the best on "
            f"{stats['selector/agreement_before']:.1%} -> {stats['selector/agreement_after']:.1%} of them")
    stats.update({f"selector/labels_{n}": float(c) for n, c in wins.items()})
    # the card's wall time counts what reused labels cost when they were made, and says so: a rerun
    # must not look 20x cheaper than training from scratch (later rounds are never reused)
    stats["selector/labels_reused"] = float(cache_hit)
    stats["selector/label_wall_s"] = cached_wall if cache_hit else labels.wall_s
    log(f"safest candidate on the labels (mildest worst state): {params.candidates[safest]}")
    return stats, safest


def _labels_key(params: SelectorParams, worlds: list[World], seed: int) -> str:
    """What the first round of labels depends on, hashed (the cache holds labels for one key)."""
    import hashlib
    import json

    from rlsched.envs.regime import REGIME_FEATURES

    return hashlib.sha256(json.dumps({
        "candidates": params.candidates, "hold_s": params.hold_s, "episode_jobs": params.episode_jobs,
        "count": params.label_count, "every": params.label_every, "horizon_s": params.label_horizon_s,
        "seed": seed, "worlds": [w.label for w in worlds], "features": REGIME_FEATURES}).encode()).hexdigest()[:16]


def _cached_labels(cache: Path, key: str) -> SelectorLabels | None:
    """The labels ``cache`` holds for ``key`` (None: no cache, or one made for other settings)."""
    import numpy as np

    from rlsched.train.selector_labels import SelectorLabels

    if not cache.exists():
        return None
    with np.load(cache) as z:
        if str(z["key"]) != key:
            return None
        return SelectorLabels(z["obs"], z["costs"], wall_s=float(z["wall_s"]))


def cached_safest(params: SelectorParams, worlds: list[World], run_dir: Path, seed: int) -> int | None:
    """The safest candidate of the labels cached in ``run_dir`` for this run (a resumed run's default)."""
    labels = _cached_labels(run_dir / "selector_labels.npz", _labels_key(params, worlds, seed))
    return None if labels is None else labels.safest()


def _greedy(policy: Any) -> Callable[[Any], int]:
    """The SB3 policy's greedy choice for one observation (the labelled trajectories follow it)."""
    return lambda obs: int(policy.predict(obs, deterministic=True)[0])


def _choices(worlds: list[World], policy: Callable[[], SelectorScheduler]) -> dict[str, dict[str, int]]:
    """How often the final selector chose each candidate on each evaluation window (for the card)."""
    from rlsched.train.evaluate import run_world

    out: dict[str, dict[str, int]] = {}
    for w in worlds:
        sched = policy()
        run_world(w, sched)
        out[w.label] = dict(sched.choices)
    return out
