"""``rlsched retrain``: the weekly loop - export the cluster's history, fine-tune, evaluate, gate, register.

One command a team can run from cron (:func:`retrain`):

1. **export** the service's last ``days`` of history as a canonical trace (:mod:`rlsched.workload.history`,
   read-only: the service keeps running);
2. **write an experiment** (kept beside the trace, so the run is reproducible with ``rlsched train``) that
   trains on that trace's earlier part, mixed with generated families so the policy does not forget the
   workloads it knew, evaluates on its later part (the cluster's own later days), warm-starts from the
   source model (``init_from``) with the source's codec, network width and rules, and runs the
   workload-family gate on a family it never trained on;
3. **train** with a small budget (:func:`rlsched.train.trainer.train`, not registered yet);
4. **gate** the result with ``rlsched promote``'s checks - the promotion rule against weighted-priority
   and against the source model, both replayed on the cluster's own later days, and the workload-family
   gate - and
5. **register** it as a new version (alias ``challenger``) only if every check passes, with the source
   model's numbers on the challenger's evaluation windows in its ``champion_eval`` tag
   (:class:`~rlsched.train.registry.ChampionReplay`: the source's registered name and version, None for a
   folder). ``rlsched promote`` then applies the same functions to the registered numbers; the champion's
   own were measured on its own evaluation windows, so while the source is still the champion it compares
   with the replayed numbers instead (rule 5), and promotes the challenger without ``--force``. A
   challenger of a folder, or of a version that is no longer the champion, is refused as not comparable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlsched.errors import RlschedError
from rlsched.train.config import ExperimentError, load_experiment

#: The retrain experiment's budget and evaluation, small enough for a weekly run on a couple of cores.
DEFAULTS: dict[str, Any] = {
    "episode_jobs": 100,
    "eval_max_jobs": 1000,
    "n_envs": 1,
    "vec_env": "dummy",
    "ppo": {"n_steps": 256, "batch_size": 128, "n_epochs": 2, "learning_rate": 1e-4},
    "bc": {"steps": 0},
    "forecast": {"model": "none"},
    "checkpoint_every_steps": 100_000,
}


@dataclass
class RetrainOptions:
    """What ``rlsched retrain`` was asked for.

    Attributes:
        state_dir: the service's state dir.
        source: the model to start from (``models:/NAME@ALIAS`` or a model folder).
        fleet: the pools the history ran on, as a ``--cluster`` string.
        work_dir: where the trace, the experiment, the run and the model folder go.
        days: days of history to export.
        steps: PPO steps of the fine-tune.
        eval_fraction: the later share of the history kept for evaluation.
        generated: generated training families mixed in (0: the cluster's trace only).
        registered_model: the registered model name versions go to (default: the source's).
    """

    state_dir: Path
    source: str
    fleet: str
    work_dir: Path
    days: float = 7.0
    steps: int = 2048
    eval_fraction: float = 0.25
    generated: int = 4
    registered_model: str = ""


@dataclass
class RetrainResult:
    """What :func:`retrain` did: files written, the gate's checks, the registered version (None: refused)."""

    trace: Path
    experiment: Path
    model: Path | None = None
    jobs: int = 0
    checks: list[Any] = field(default_factory=list)
    version: int | None = None
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def _source_settings(source: str, work_dir: Path) -> tuple[dict[str, Any], str, Path, int | None]:
    """The experiment keys that must match the source model (codec, width, rules), its registered name, its
    model folder (a registered version is downloaded into ``work_dir/source``) and its registered version
    (None for a folder)."""
    from rlsched.learned.ppo import ModelError, PolicyModel

    try:
        if source.startswith("models:/"):
            from rlsched.train.registry import ModelRef, download_model, resolve_version

            mv = resolve_version(source)
            folder = download_model(f"models:/{mv.name}/{mv.version}", work_dir / "source")
            name = ModelRef.parse(source).name
            version: int | None = int(mv.version)
        else:
            folder = Path(source)
            name = "rlsched-ppo"
            version = None
        model = PolicyModel.load(folder)
    except ModelError as exc:
        raise RlschedError(f"--from {source}: {exc}") from None
    c = model.codec_params
    keys: dict[str, Any] = {"window": int(c["window"]), "max_pools": int(c["max_pools"]),
                            "network": {"hidden": int(getattr(model.net, "hidden", 64))}}
    if c.get("nominators"):
        keys["nominators"] = list(c["nominators"])
    if c.get("preempt_slots"):
        keys["preempt_slots"] = int(c["preempt_slots"])
    if c.get("extra_globals"):
        keys["extra_globals"] = list(c["extra_globals"])
    if c.get("anchor"):
        keys["anchor"] = str(c["anchor"])
    # the rules as the source trained behind them, and its serving-only changes as they were
    trained = model.card.get("trained_rules") or model.rule_params
    keys.update({rule: dict(params) for rule, params in trained.items()})
    if model.card.get("serve_rules"):
        keys["serve_rules"] = {rule: dict(changes) for rule, changes in model.card["serve_rules"].items()}
    return keys, name, folder, version


def write_experiment(opts: RetrainOptions, trace: Path, name: str, source_keys: dict[str, Any]) -> Path:
    """The retrain experiment YAML (see the module doc); returns its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    exp: dict[str, Any] = {
        "name": f"retrain-{stamp}",
        "description": f"fine-tune of {opts.source} on the last {opts.days:g} days of {opts.state_dir}",
        "trace_families": [{"path": str(trace.resolve()), "fleet": opts.fleet, "name": "own-cluster",
                            "eval_fraction": opts.eval_fraction}],
        **DEFAULTS,
        **source_keys,
        "total_steps": opts.steps,
        "init_from": opts.source if opts.source.startswith("models:/") else str(Path(opts.source).resolve()),
        # judged on a family it never trained on (the generated mix leaves tiny fleets out)
        "gate": {"families": ["gen-tiny-fleet"], "windows": 1, "max_jobs": 200},
        "mlflow": {"experiment": "rlsched-retrain", "registered_model": opts.registered_model or name},
        "output": str((opts.work_dir / "model").resolve()),
    }
    if opts.generated > 0:
        exp["generated"] = {"count": opts.generated, "jobs": 200, "max_nodes": 16, "exclude": ["tiny-fleet"]}
    path = opts.work_dir / "experiment.yaml"
    path.write_text("# written by rlsched retrain: rerun with `rlsched train " + str(path) + "`\n"
                    + yaml.safe_dump(exp, sort_keys=False))
    return path


def gate_checks(card: dict[str, Any], champion_eval: dict[str, Any] | None = None) -> list[Any]:
    """``rlsched promote``'s checks: the promotion rule (against weighted-priority and, given its results on
    the same windows, the source model) on the cluster's own later days, and the workload-family gate."""
    from rlsched.train.registry import card_eval, card_families, check_promotion, family_gate_checks

    return check_promotion(card_eval(card), champion_eval) + family_gate_checks(card_families(card))


def source_on_same_days(exp: Any, folder: Path) -> dict[str, Any]:
    """The source model's evaluation summary on the experiment's evaluation windows (the candidate's)."""
    from rlsched.learned.ppo import make_ppo_policy
    from rlsched.train.evaluate import evaluate
    from rlsched.train.worlds import evaluation_worlds

    worlds = evaluation_worlds(exp.scenarios, exp.eval_max_jobs)
    summary: dict[str, Any] = evaluate(worlds, lambda: make_ppo_policy(str(folder), name="ppo"),
                                       heuristics=[])["summary"]
    return summary


def retrain(opts: RetrainOptions, log: Callable[[str], None] = print) -> RetrainResult:
    """Export, write the experiment, train, gate, and register when the gate passes (see the module doc).

    Raises:
        RlschedError: no history, a source model that cannot be loaded, a training failure.
    """
    import json

    from rlsched.train.trainer import train
    from rlsched.workload.history import db_path_of, read_history, write_history

    t0 = time.monotonic()
    opts.work_dir.mkdir(parents=True, exist_ok=True)
    history = read_history(db_path_of(opts.state_dir), since_s=opts.days * 86400.0)
    finished = sum(1 for j in history.jobs if not j.censored)
    if finished < 8:
        raise RlschedError(f"{opts.state_dir}: {finished} finished jobs in the last {opts.days:g} days; "
                           "too few to fine-tune on")
    trace = opts.work_dir / "jobs.csv"
    write_history(trace, history)
    log(f"exported {len(history.jobs)} jobs of the last {opts.days:g} days to {trace}")
    source_keys, name, source_folder, source_version = _source_settings(opts.source, opts.work_dir)
    path = write_experiment(opts, trace, name, source_keys)
    log(f"wrote experiment {path}")
    try:
        exp = load_experiment(path)
    except ExperimentError as exc:
        raise RlschedError(str(exc)) from None
    res = train(exp, run_dir=opts.work_dir / "run", log=log, quiet=True, track=False)
    card = json.loads((res.model_dir / "card.json").read_text())
    log(f"evaluating {opts.source} on the same later days ...")
    source_eval = source_on_same_days(exp, source_folder)
    result = RetrainResult(trace, path, res.model_dir, len(history.jobs), gate_checks(card, source_eval))
    if result.passed:
        from rlsched.train.registry import CHAMPION_EVAL_TAG, ChampionReplay, eval_set_id, register_policy

        replay = ChampionReplay(name if source_version is not None else None, source_version, source_eval,
                                eval_set_id(card))
        result.version = register_policy(res.model_dir, name=exp.mlflow.registered_model,
                                         tags={"retrained_from": opts.source, "retrain_trace": str(trace),
                                               CHAMPION_EVAL_TAG: replay.tag()})
    result.wall_s = time.monotonic() - t0
    return result
