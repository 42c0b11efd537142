"""The steps every ``rlsched train`` run shares, whichever network it trains.

:func:`rlsched.train.trainer.train` (the per-slot network) and
:func:`rlsched.train.selector_train.train_selector` (the heuristic selector) build the same
worlds, show the same progress bar, checkpoint the same way, evaluate the final policy
against every heuristic on the same windows, judge it on the same workload families and
register it in the same MLflow model registry; those steps live here, so neither
trainer reaches into the other's private parts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlsched.envs.trained_actions import TrainedActions
from rlsched.errors import RlschedError
from rlsched.train.config import Experiment
from rlsched.train.evaluate import comparison_markdown, evaluate
from rlsched.train.families import (
    generated_market_training_worlds,
    generated_training_worlds,
    market_bases,
    named_family_training_worlds,
    trained_market_families,
)
from rlsched.train.forecast_fit import attach, error_markdown, error_metrics, fit_forecasters, forecast_error
from rlsched.train.model_card import forecast_card, git_commit
from rlsched.train.worlds import World, evaluation_worlds, training_worlds

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


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for one run: a second ``rlsched train`` on the same folder is refused, not interleaved.

    Two runs of one experiment share ``runs/<name>`` by default, and with it the checkpoints
    (``latest.json`` would point at the other run's step), the label cache and the reward scale;
    both runs would finish, each silently resuming or reusing the other's files. The lock is a
    ``flock`` on ``run_dir/.lock`` (the kernel drops it when the holder dies, ``kill -9``
    included), and the file names the holder's pid for the error message.
    """
    from rlsched.posix import try_lock

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if not try_lock(fd):
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise RlschedError(f"{run_dir}: another `rlsched train` (pid {holder}) is using this run folder; "
                               "wait for it or give this run its own --run-dir")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def progress_callback(total: int, ckpt_dir: Path, ckpt_every: int, eval_every: int,
                      on_eval: Callable[[int], None] | None, quiet: bool) -> Any:
    """An SB3 callback: a live progress bar (reward, fps), checkpoints and periodic evaluation.

    A function, not a class here: SB3's ``BaseCallback`` (and torch under it) is imported when a
    run starts, so importing this module stays cheap.
    """
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

    return Callback(total, ckpt_dir, ckpt_every, eval_every, on_eval, quiet)


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


def codec_of(exp: Experiment) -> ObservationCodec:
    """The observation codec of the experiment's network."""
    from rlsched.envs.codec import ObservationCodec

    return ObservationCodec(window=exp.window, max_pools=exp.max_pools, nominators=exp.nominators,
                            preempt_slots=exp.preempt_slots, extra_globals=exp.extra_globals).anchor_to(exp.anchor)


def worlds_actions(worlds: list[World], exp: Experiment) -> TrainedActions:
    """The action kinds legal somewhere in the training ``worlds`` (the model folder's ``actions.json``)."""
    from rlsched.policies.rules import owned_actions

    layouts = codec_of(exp).layouts
    fleets = TrainedActions.of_fleets((w.scenario.pools for w in worlds), max_pools=exp.max_pools, layouts=layouts,
                                      source=f"training worlds of {exp.source or exp.name}: "
                                             + ", ".join(w.label for w in worlds), preempt_slots=exp.preempt_slots)
    return fleets.without(owned_actions(exp.trained_rule_params()))  # a rule's actions are the rule's


@dataclass
class Worlds:
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


def prepare_worlds(exp: Experiment, log: Callable[[str], None]) -> Worlds:
    """Build the training, evaluation and holdout worlds; fit and attach the demand forecaster."""
    worlds = training_worlds(exp.scenarios)
    eval_worlds = evaluation_worlds(exp.scenarios, exp.eval_max_jobs)
    holdout_worlds = evaluation_worlds(exp.holdout, exp.eval_max_jobs) if exp.holdout else []
    # Domain randomisation: worlds drawn from whole workload families (they run without a forecaster).
    gen = exp.generated
    gen_worlds = generated_training_worlds(gen.count, gen.jobs, gen.seed, gen.exclude, gen.max_nodes) if gen else []
    if gen and gen.families:
        gen_worlds += named_family_training_worlds(gen.families, gen.family_count, gen.jobs, gen.seed)
    log(f"{len(worlds) + len(gen_worlds)} training worlds ({len(gen_worlds)} generated), {len(eval_worlds)} "
        f"evaluation windows, {len(holdout_worlds)} holdout windows")
    # The action kinds the network can learn here: written into the model folder, and masked outside
    # them in every evaluation below, as when the model is served.
    trained_actions = worlds_actions(worlds + gen_worlds, exp)
    log(f"trained actions: {trained_actions.describe()}")
    # The demand forecaster: fitted on the training windows only; every training episode and every
    # evaluation replay (policy and heuristics alike) runs with a fresh copy of it.
    gm = exp.generated_markets
    if gm is not None:
        market_bases(worlds)  # refuse a fleet no market can go under before the forecaster's fit
    fitted = fit_forecasters(exp)
    if fitted:
        worlds = attach(exp, worlds, fitted)
        eval_worlds = attach(exp, eval_worlds, fitted)
        holdout_worlds = attach(exp, holdout_worlds, fitted, holdout=True)
        log(f"demand forecaster {exp.forecast.model} (horizon {exp.forecast.horizon_s:g} s) fitted on the "
            f"training windows of {', '.join(fitted)}")
    if gm is not None:
        # the same jobs, fleets and forecasters as the hybrid training worlds, under drawn markets
        market_worlds = generated_market_training_worlds(worlds, gm.count, gm.seed, gm.exclude)
        log(f"{len(market_worlds)} training worlds under generated markets (covering "
            f"{', '.join(trained_market_families(gm.exclude)) or 'no documented kind'})")
        worlds = worlds + market_worlds
    return Worlds(worlds + gen_worlds, eval_worlds, holdout_worlds, trained_actions, fitted)


def start_tracker(exp: Experiment, extra_tags: dict[str, str] | None = None) -> Tracker:
    """An MLflow run for this experiment, tagged with the code's commit, the experiment file and ``extra_tags``."""
    from rlsched.train.tracking import Tracker

    return Tracker(exp.mlflow.experiment, run_name=exp.name, params=exp.flat_params(),
                   tags={"git_commit": git_commit(), "experiment_file": exp.source, **(extra_tags or {})})


@dataclass
class TrainingRun:
    """The steps a run takes after its network has learned, whatever the network: the final evaluation,
    the forecaster's error, registration. :class:`~rlsched.train.trainer.SlotTrainingRun` adds the per-slot
    network's own steps."""

    exp: Experiment
    worlds: Worlds
    log: Callable[[str], None]
    tracker: Tracker | None
    ray: str | None = None

    def final_evaluation(self, policy: Callable[[], Any]) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
        """The policy against every heuristic (and the teacher's and ruled rows) on the evaluation and holdout
        windows, and the comparison tables."""
        exp, w = self.exp, self.worlds
        self.log("evaluating the final policy against every heuristic ...")
        extra = [*teacher_rows(exp), *ruled_baselines(exp.rule_params())]
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




def teacher_rows(exp: Experiment) -> list[Callable[[], Any]]:
    """The row(s) PPO was cloned from or anchored to, for the final evaluation: did training improve on the
    teacher it started from? A spot teacher brings every other spot teacher along."""
    from rlsched.envs.teacher_actions import with_spot_teachers
    from rlsched.train.teacher import FOLLOW, TeacherScheduler

    def teacher(rule: str) -> Any:
        return TeacherScheduler(rule, exp.window, exp.max_pools, rules=exp.rule_params(), nominators=exp.nominators,
                                preempt_slots=exp.preempt_slots)

    taught = [] if exp.bc.steps <= 0 else (
        [f"{FOLLOW}{n}" for n in exp.nominators] if exp.bc.teacher == "best-follow"
        else [f"{FOLLOW}{n}" for n in exp.bc.lookahead_candidates(exp.nominators)]
        if exp.bc.teacher == "lookahead" else [exp.bc.teacher])
    if exp.anchor is not None and exp.anchor not in taught:
        taught.append(exp.anchor)
    # as the family benchmark (``teacher_baselines``): every spot teacher is a baseline
    return [functools.partial(teacher, rule) for rule in with_spot_teachers(taught)]


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


def family_gate(exp: Experiment, folder: Path, card: dict[str, Any], log: Callable[[str], None], *,
                 ray: str | None = None) -> str:
    """Judge the saved policy on the gate's workload families (replays as Ray tasks with ``ray``); store the
    result in ``card``; its markdown."""
    from rlsched.train.families import resolve
    from rlsched.train.generalisation import (
        choice_lines,
        evaluate_families,
        family_checks,
        family_tables,
        gate_rules,
        verdict,
    )

    assert exp.gate is not None
    fams = resolve(list(exp.gate.families))
    log(f"judging the policy on {len(fams)} workload families (promotion gate: "
        f"{gate_rules([f.kind for f in fams])}) ...")
    report = evaluate_families(fams, str(folder), card=card, windows=exp.gate.windows, max_jobs=exp.gate.max_jobs,
                               processes=None, ray=ray)
    card["metrics"]["families"] = {"summary": report.summaries, "exposure": report.exposure,
                                   "skipped": report.skipped, "windows": report.windows,
                                   "spot_windows": report.spot_windows, "choices": report.choices,
                                   "settings": {"families": list(exp.gate.families), "windows": exp.gate.windows,
                                                "max_jobs": exp.gate.max_jobs}}
    checks = family_checks(report.summaries, report.exposure)
    passed = all(ok for ok, _ in checks)
    # a trace family may have fewer windows than asked (those the model saw are never cut): say "up to"
    lines = [f"### Workload families (up to {exp.gate.windows} windows each, at most {exp.gate.max_jobs:,} jobs; "
             f"mean of per-window ratios; 95% bootstrap interval)", "", family_tables(report), "",
             *(f"- {line}" for line in verdict(report.summaries, report.exposure)),
             f"- promotion gate: {'PASS' if passed else 'FAIL'}"
             + ("" if passed else " (" + "; ".join(t for ok, t in checks if not ok) + ")")]
    chosen = choice_lines(report)
    if chosen:
        lines += ["", "The selector's choices (share of its hourly choices over each family's windows):", "",
                  *(f"- {line}" for line in chosen)]
    text = "\n".join(lines)
    log(text)
    return text
