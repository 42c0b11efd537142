"""The MLflow model registry for trained policies: register, download, serve and promote.

A registered version is an MLflow *pyfunc* model whose only artifact, ``policy``,
is the exported model folder (``policy.pt``, ``codec.json``, ``card.json``), so the
same bytes serve three ways: ``--policy ppo:models:/NAME@ALIAS`` (:func:`download_model`
+ :class:`~rlsched.learned.ppo.PolicyModel`), ``mlflow.pyfunc.load_model`` /
``mlflow models serve`` (:class:`PolicyPyfunc`: encoded observation + mask -> action),
and plain file copies.

Aliases:

* ``challenger`` - set on every newly registered version;
* ``champion`` - what production serves; only :func:`promote` moves it.

Promotion rule (:func:`check_promotion`), on the evaluation metrics the trainer
stored in the version's card (copied into its ``eval_metrics`` tag at registration;
``ppo`` is the candidate's entry, ``weighted-priority`` the baseline's), all must hold:

1. candidate ``mean_jct_s`` < weighted-priority ``mean_jct_s`` (strictly better JCT);
2. candidate ``cost_usd`` <= weighted-priority ``cost_usd`` x (1 + 1e-9) (no dearer);
3. candidate ``jobs_completed`` >= weighted-priority's (when both report it): mean JCT
   is over *completed* jobs, so a policy that leaves jobs queued would otherwise
   "win" by finishing only the short ones;
4. if a champion exists: candidate ``mean_jct_s`` < champion ``mean_jct_s`` and
   candidate ``cost_usd`` <= champion ``cost_usd`` x (1 + 1e-9);
5. if both versions record an ``eval_set`` (a hash of their evaluation windows), they
   are equal: numbers measured on different workloads are not comparable. One exception
   keeps rules 4 and 5 on one workload: a candidate whose ``champion_eval`` tag
   (:class:`ChampionReplay`, set by ``rlsched retrain``) holds the numbers of exactly the
   current champion version replayed on the candidate's own evaluation windows is compared
   with those numbers instead ("champion replayed on the candidate's evaluation windows");
   a replay of another version (the champion moved since) or on other windows is refused
   as before;
6. the **workload-family gate** (:mod:`rlsched.train.generalisation`): on every family
   of workloads the candidate never trained or was tuned on, its mean JCT is at most
   1.02 times the best heuristic's (mean of per-window ratios). The results come from the
   version's ``family_gate`` tag (set at registration from the card's
   ``metrics.families``, or later by ``rlsched models gate NAME VERSION``); a version
   without them is refused - a gate that judged nothing lets nothing through.

Any non-finite or missing number fails its check. ``force=True`` skips the rule,
but a forced promotion is audited: tags on the version (``promoted_by``,
``promoted_at``, ``forced``, ``promote_reason``, ``previous_champion``) and a JSON
line in the local audit file (``rlsched-audit.jsonl``; ``$RLSCHED_AUDIT_FILE``).
Every promotion, forced or not, is tagged and audited the same way.

MLflow is imported lazily (inside functions; :class:`PolicyPyfunc` is built on first
access) so importing this module costs neither MLflow nor torch.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlsched.learned.ppo import CODEC_FILE, ModelError, PolicyModel, load_model_folder
from rlsched.learned.selector import SELECTOR_FILE, SelectorModel
from rlsched.train.tracking import TrackingError, configure, ensure_experiment, tracking_uri

if TYPE_CHECKING:
    from mlflow.pyfunc import PythonModel

CHAMPION = "champion"
CHALLENGER = "challenger"
#: The candidate's own entry in the card's ``metrics.eval`` (the trainer's PpoScheduler name).
CANDIDATE_POLICY = "ppo"
#: The heuristic a candidate must beat.
BASELINE_POLICY = "weighted-priority"
#: Name of the pyfunc artifact holding the model folder.
POLICY_ARTIFACT = "policy"
#: Name of the logged MLflow model inside the run.
LOGGED_MODEL_NAME = "policy_model"
#: Experiment used when registering without a run (``rlsched models register``).
REGISTRY_EXPERIMENT = "rlsched-registry"
DEFAULT_AUDIT_FILE = "rlsched-audit.jsonl"
REL_TOL = 1e-9
#: Summary metrics copied from the card into ``eval_*`` tags (for ``rlsched models list`` and search).
TAG_METRICS = ("mean_jct_s", "p95_jct_s", "cost_usd", "gpu_utilization", "jobs_completed", "deadline_misses")
_MAX_TAG_CHARS = 5000
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


class ModelRegistryUnavailable(TrackingError, ModelError):
    """The registry's tracking server is down: both a tracking and a model-loading problem.

    Deriving from both lets ``--policy ppo:models:/...`` callers (who catch
    :class:`ModelError` and keep the fallback heuristic) and tracking code (which
    catches :class:`TrackingError`) each handle it their own way.
    """


# ---------------------------------------------------------------------- the pyfunc model
def predict_selections(model: SelectorModel, model_input: Any) -> np.ndarray:
    """A selector's pyfunc ``predict``: regime feature rows (N, F) or one row (F,) -> candidate indices (N,).

    The candidates' names are in the model's ``selector.json`` (artifact ``policy``), in index order.
    Raises :class:`ModelError` for a row of the wrong width or non-finite values.
    """
    x = np.asarray(model_input.get("features") if isinstance(model_input, Mapping) else model_input, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    width = len(model.features)
    if x.ndim != 2 or x.shape[1] != width:
        raise ModelError(f"predict expects rows of {width} regime features ({', '.join(model.features)}), "
                         f"got shape {tuple(x.shape)}")
    if not np.isfinite(x).all():
        raise ModelError("predict input has non-finite regime features")
    return np.asarray([model.choose_features(row) for row in x], dtype=np.int64)  # as served: margin too


def predict_actions(model: PolicyModel, model_input: Any) -> np.ndarray:
    """Greedy legal actions for encoded observations: the pyfunc model's ``predict``.

    Args:
        model: the loaded policy.
        model_input: a mapping with ``jobs`` (K, Fj), ``pools`` (P, Fp), ``globals`` (G,)
            and ``mask`` (A,) - or each with a leading batch dimension N. The mask may be
            booleans or 0/1 numbers.

    Returns:
        int64 actions of shape (N,) (N = 1 for an unbatched observation), so a serving
        endpoint always answers with a list.

    Raises:
        ModelError: missing keys, shapes that do not match the model's codec, a row with
            no legal action, or non-finite network output.
    """
    if not isinstance(model_input, Mapping):
        raise ModelError(
            f"predict expects a mapping with jobs, pools, globals and mask arrays, got {type(model_input).__name__}"
        )
    missing = [k for k in ("jobs", "pools", "globals", "mask") if k not in model_input]
    if missing:
        raise ModelError(f"predict input lacks {', '.join(missing)} (expects jobs, pools, globals, mask)")
    space = model.new_codec().observation_space
    expected = {k: tuple(space[k].shape or ()) for k in ("jobs", "pools", "globals")}
    n_actions = int(model.net.n_actions)
    arrays = {k: np.asarray(model_input[k], dtype=np.float32) for k in ("jobs", "pools", "globals")}
    mask = np.asarray(model_input["mask"])
    batched = arrays["jobs"].ndim == len(expected["jobs"]) + 1
    if not batched:
        arrays = {k: v[None] for k, v in arrays.items()}
        mask = mask[None]
    n = arrays["jobs"].shape[0]
    for k, shape in expected.items():
        if arrays[k].shape != (n, *shape):
            raise ModelError(f"predict input {k!r} has shape {np.shape(model_input[k])}; this model expects "
                             f"{shape} or (N, {', '.join(map(str, shape))})")
    if mask.shape != (n, n_actions):
        raise ModelError(f"predict input 'mask' has shape {np.shape(model_input['mask'])}; this model expects "
                         f"({n_actions},) or (N, {n_actions})")
    mask = mask.astype(bool)
    if not mask.any(axis=1).all():
        raise ModelError("predict input has a mask with no legal action (waiting is always legal)")
    import torch

    with torch.no_grad():
        out = model.net({k: torch.as_tensor(v) for k, v in arrays.items()})[:, :n_actions].numpy()
    if not np.all(np.isfinite(out)):
        raise ModelError("policy produced non-finite logits")
    return np.asarray(np.argmax(np.where(mask, out, -np.inf), axis=1), dtype=np.int64)


class _PolicyPyfuncImpl:
    """The body of :class:`PolicyPyfunc` (kept apart so MLflow is only imported when one is made)."""

    model: PolicyModel | SelectorModel | None = None

    def load_context(self, context: Any) -> None:
        """Load the model folder MLflow unpacked as the ``policy`` artifact (either kind of model)."""
        self.model = load_model_folder(context.artifacts[POLICY_ARTIFACT])

    def predict(self, context, model_input, params=None):
        """Encoded observation(s) + mask(s) -> greedy legal action(s); see :func:`predict_actions`.

        Deliberately unannotated: MLflow derives a model signature from ``predict``'s type
        hints and warns at every registration because no hint it supports describes a
        dict of differently shaped tensors, single or batched. :func:`predict_actions`
        (typed) does the validation instead.
        """
        if self.model is None:
            raise ModelError("PolicyPyfunc.predict called before load_context")
        if isinstance(self.model, SelectorModel):
            return predict_selections(self.model, model_input)
        return predict_actions(self.model, model_input)


if TYPE_CHECKING:

    class PolicyPyfunc(_PolicyPyfuncImpl, PythonModel):
        """The MLflow pyfunc wrapper of a policy model folder."""


def _pyfunc_class() -> type[Any]:
    cls = globals().get("PolicyPyfunc")
    if cls is None:
        from mlflow.pyfunc import PythonModel as _PythonModel

        cls = type("PolicyPyfunc", (_PolicyPyfuncImpl, _PythonModel), {
            "__module__": __name__,
            "__qualname__": "PolicyPyfunc",
            "__doc__": "The MLflow pyfunc wrapper of a policy model folder (artifact ``policy``).",
        })
        globals()["PolicyPyfunc"] = cls
    return cls


def __getattr__(name: str) -> Any:
    """Build :class:`PolicyPyfunc` (an ``mlflow.pyfunc.PythonModel`` subclass) on first access only."""
    if name == "PolicyPyfunc":
        return _pyfunc_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The "model from code" file logged with every version: MLflow imports it to build the
#: model instead of unpickling one (no cloudpickle of rlsched classes, no pickle warning).
_MODEL_CODE = '''"""rlsched policy pyfunc (MLflow model from code); needs the rlsched package installed."""
import mlflow

from rlsched.train.registry import PolicyPyfunc

mlflow.models.set_model(PolicyPyfunc())
'''


# ---------------------------------------------------------------------- helpers
def _client() -> Any:
    from mlflow import MlflowClient

    return MlflowClient()


def _mlflow_exception() -> type[Exception]:
    from mlflow.exceptions import MlflowException

    return MlflowException


def _error_code(exc: BaseException) -> str:
    return str(getattr(exc, "error_code", "") or "")


def _not_found(exc: BaseException) -> bool:
    return _error_code(exc) in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND") or "not found" in str(exc).lower()


def _git_head() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    head = out.stdout.strip()
    return head if out.returncode == 0 and head else None


def _tag_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _MAX_TAG_CHARS else text[: _MAX_TAG_CHARS - 3] + "..."


def eval_set_id(card: Mapping[str, Any]) -> str | None:
    """A short hash naming the evaluation windows a card's metrics were measured on (None if unknown)."""
    if card.get("eval_set"):
        return str(card["eval_set"])
    windows = (card.get("per_window") or {}).get("eval")
    if isinstance(windows, Mapping) and windows:
        return hashlib.sha256(json.dumps(sorted(windows)).encode()).hexdigest()[:16]
    return None


#: The version tag holding the champion's numbers replayed on the version's own evaluation windows.
CHAMPION_EVAL_TAG = "champion_eval"


@dataclass(frozen=True)
class ChampionReplay:
    """A model's evaluation on a candidate's evaluation windows: the candidate's ``champion_eval`` tag.

    ``rlsched retrain`` evaluates its source model on the challenger's own evaluation windows;
    recording those numbers with the challenger lets :func:`promote` compare the two on one
    workload (rule 5) when the source is still the champion.

    Attributes:
        model: registered model name of the replayed version (None: a model folder, never a champion).
        version: its version number (None with ``model``).
        metrics: its evaluation summary there (``{policy: {metric: value}}``; ``ppo`` is the model).
        eval_set: the evaluation-set id (:func:`eval_set_id`) of the windows it was measured on.
    """

    model: str | None
    version: int | None
    metrics: dict[str, dict[str, Any]]
    eval_set: str | None

    def tag(self) -> str:
        """The tag value (compact JSON); per policy only :data:`TAG_METRICS` when the whole would not fit."""
        def encode(metrics: Mapping[str, Mapping[str, Any]]) -> str:
            return json.dumps({"model": self.model, "version": self.version, "eval_metrics": metrics,
                               "eval_set": self.eval_set}, sort_keys=True, default=str)

        text = encode(self.metrics)
        if len(text) > _MAX_TAG_CHARS:
            text = encode({p: {k: m[k] for k in TAG_METRICS if k in m} for p, m in self.metrics.items()})
        return text

    @classmethod
    def parse(cls, raw: str | None) -> ChampionReplay | None:
        """The replay a tag value records; None when absent or malformed (then it is simply not used)."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
            metrics = data["eval_metrics"]
            version = data.get("version")
            return cls(None if data.get("model") is None else str(data["model"]),
                       None if version is None else int(version),
                       {str(p): dict(m) for p, m in metrics.items() if isinstance(m, Mapping)},
                       None if data.get("eval_set") is None else str(data["eval_set"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def card_eval(card: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``card["metrics"]["eval"]`` (``{policy: {metric: value}}``), empty when absent."""
    ev = (card.get("metrics") or {}).get("eval") or {}
    return {str(p): dict(m) for p, m in ev.items() if isinstance(m, Mapping)}


#: The version tag holding the workload-family gate's results (compact JSON).
FAMILY_TAG = "family_gate"


def card_families(card: Mapping[str, Any]) -> dict[str, Any] | None:
    """``card["metrics"]["families"]`` (``{"summary", "exposure", "spot_model"}``), None when absent.

    ``spot_model`` says whether the card describes a spot model
    (:func:`~rlsched.train.families.is_spot_model`): the gate then asks for an unseen spot family.
    """
    from rlsched.train.families import is_spot_model

    fam = (card.get("metrics") or {}).get("families")
    if isinstance(fam, Mapping) and isinstance(fam.get("summary"), Mapping):
        return {"summary": dict(fam["summary"]), "exposure": dict(fam.get("exposure") or {}),
                "spot_model": is_spot_model(dict(card))}
    return None


#: Per-family summary keys the ``family_gate`` tag keeps (on-prem, then spot families).
_TAG_KEYS = ("windows", "best", "best_vs_wp", "bound_vs_wp", "model_vs_best", "model_vs_wp",
             "kind", "best_cost_vs_od", "best_misses", "best_lost_gpu_h", "cheapest", "cheapest_cost_vs_od",
             "model_cost_vs_od", "model_cost_vs_best", "model_cost_vs_cheapest", "model_misses", "model_lost_gpu_h")


def family_tag(fam: Mapping[str, Any]) -> str:
    """The ``family_gate`` tag: per family only what the gate and a reader need (fits MLflow's tag limit)."""
    summary = {f: {k: s[k] for k in _TAG_KEYS if k in s} for f, s in fam["summary"].items()}
    out: dict[str, Any] = {"summary": summary, "exposure": fam.get("exposure", {})}
    if fam.get("spot_model"):
        out["spot_model"] = True
    return json.dumps(out, sort_keys=True)


def family_gate_checks(fam: Mapping[str, Any] | None) -> list[Check]:
    """Rule 6 as checks; a version without family results fails it.

    Spot families are judged by the spot rule (no more deadline misses than the best
    baseline), and a spot model's results must include an unseen spot family.
    """
    if fam is None:
        return [Check(False, "no workload-family evaluation: run `rlsched models gate NAME VERSION` first")]
    from rlsched.train.generalisation import family_checks

    return [Check(ok, text) for ok, text in family_checks(fam["summary"], fam.get("exposure", {}),
                                                          spot_model=bool(fam.get("spot_model")))]


def candidate_entry(ev: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The candidate's own metrics: ``ppo``, else the only key starting with ``ppo``."""
    if CANDIDATE_POLICY in ev:
        return ev[CANDIDATE_POLICY]
    keys = [k for k in ev if k.startswith(CANDIDATE_POLICY)]
    return ev[keys[0]] if len(keys) == 1 else None


def registration_tags(model: PolicyModel | SelectorModel, extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The tags a new version gets: signature, training data, commit, eval summary (+ ``extra``).

    ``eval_metrics`` carries the whole evaluation summary as JSON (what :func:`promote`
    compares); ``eval_<metric>`` the candidate's headline numbers and
    ``eval_baseline_<metric>`` weighted-priority's, for ``rlsched models list`` and
    registry searches.
    """
    card = model.card
    tags: dict[str, str] = {}
    scen = card.get("scenarios")
    training = card.get("training_data") or (
        ";".join(str(s.get("name")) for s in scen if isinstance(s, Mapping)) if isinstance(scen, list) else None
    )
    tags["training_data"] = _tag_value(training or "unknown")
    commit = card.get("git_commit")
    tags["git_commit"] = str(commit) if commit and commit != "unknown" else (_git_head() or "unknown")
    ev = card_eval(card)
    if ev:
        tags["eval_metrics"] = json.dumps(ev, sort_keys=True, default=str)
        for prefix, entry in (("eval_", candidate_entry(ev)), ("eval_baseline_", ev.get(BASELINE_POLICY))):
            for metric in TAG_METRICS:
                if entry is not None and metric in entry:
                    tags[prefix + metric] = str(entry[metric])
    es = eval_set_id(card)
    if es:
        tags["eval_set"] = es
    fam = card_families(card)
    if fam is not None:
        tags[FAMILY_TAG] = family_tag(fam)
    for k, v in (extra or {}).items():
        tags[str(k)] = _tag_value(v)
    if tags.get("observation_signature", model.signature) != model.signature:
        raise ModelError(f"tag observation_signature={tags['observation_signature']} contradicts the model's "
                         f"own signature {model.signature}")
    tags["observation_signature"] = model.signature
    return tags


@contextlib.contextmanager
def _run_for_logging(run_id: str | None) -> Iterator[str]:
    """The run to log the model into: ``run_id``, else the active run, else a new one.

    A given run that is not the active one is resumed for the duration and then ended
    with the status it had (MLflow's fluent ``log_model`` only logs into the active run).
    """
    import mlflow

    active = mlflow.active_run()
    if run_id is None and active is not None:
        yield str(active.info.run_id)
        return
    if run_id is not None and active is not None and active.info.run_id == run_id:
        yield run_id
        return
    if run_id is None:
        with mlflow.start_run(experiment_id=ensure_experiment(REGISTRY_EXPERIMENT),
                              run_name="register", nested=active is not None) as run:
            yield str(run.info.run_id)
        return
    previous = _client().get_run(run_id).info.status
    mlflow.start_run(run_id=run_id, nested=active is not None)
    try:
        yield run_id
    finally:
        mlflow.end_run(status=previous)


# ---------------------------------------------------------------------- register
def register_policy(
    folder: Path | str,
    *,
    name: str,
    run_id: str | None = None,
    tags: Mapping[str, Any] | None = None,
) -> int:
    """Log a model folder as a pyfunc model and register it as a new version of ``name``.

    The version gets :func:`registration_tags` (plus ``tags``) and the alias
    ``challenger``. It is all or nothing: when any step after the version's creation
    fails (tags, alias), the version is deleted again - and the registered model too
    if this call created it - so the registry never shows a half-registered version
    that ``models:/NAME@challenger`` would not resolve to.

    Args:
        folder: the model folder (validated by loading it first).
        name: registered model name (created when missing).
        run_id: run to log the model into; default the active run, else a new run in
            the ``rlsched-registry`` experiment.
        tags: extra version tags (e.g. ``training_data``); ``observation_signature`` is
            always the model's own.

    Returns:
        The new version number.

    Raises:
        ModelError: the folder is not a loadable model folder.
        TrackingError: the server is down or refused a step (nothing left registered).
    """
    folder = Path(folder)
    model = load_model_folder(folder)
    version_tags = registration_tags(model, tags)
    configure()
    import mlflow

    mlflow_exc = _mlflow_exception()
    client = _client()
    try:
        with _run_for_logging(run_id) as rid, tempfile.TemporaryDirectory(prefix="rlsched-pyfunc-") as tmp:
            code = Path(tmp) / "rlsched_policy_model.py"
            code.write_text(_MODEL_CODE)
            info = mlflow.pyfunc.log_model(
                name=LOGGED_MODEL_NAME,
                python_model=str(code),
                artifacts={POLICY_ARTIFACT: str(folder.resolve())},
                pip_requirements=_pip_requirements(),
                metadata={"observation_signature": model.signature},
            )
    except mlflow_exc as exc:
        raise TrackingError(f"could not log model {folder} to MLflow ({tracking_uri()}): "
                            f"{str(exc).splitlines()[0]}") from None
    created_model = False
    try:
        client.create_registered_model(name, description="rlsched PPO scheduling policy (pyfunc + model folder)")
        created_model = True
    except mlflow_exc as exc:
        if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
            raise TrackingError(f"could not create registered model {name!r}: {str(exc).splitlines()[0]}") from None
    version: int | None = None
    try:
        mv = client.create_model_version(name, source=info.model_uri, run_id=rid, tags=version_tags,
                                         model_id=info.model_id)
        version = int(mv.version)
        _await_ready(client, name, version)
        client.set_registered_model_alias(name, CHALLENGER, str(version))
    except BaseException as exc:
        _rollback(client, name, version, created_model, info.model_id)
        if isinstance(exc, mlflow_exc):
            raise TrackingError(f"registering {folder} as {name!r} failed (nothing left registered): "
                                f"{str(exc).splitlines()[0]}") from None
        raise
    return version


def _pip_requirements() -> list[str]:
    """Requirements written into the logged model (explicit: MLflow's inference would load the model)."""
    from importlib.metadata import PackageNotFoundError, version

    reqs = []
    for dist in ("rlsched", "mlflow", "torch", "numpy", "gymnasium", "stable-baselines3", "sb3-contrib"):
        try:
            reqs.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            reqs.append(dist)
    return reqs


def _await_ready(client: Any, name: str, version: int, timeout_s: float = 60.0) -> None:
    """Wait while a version is PENDING_REGISTRATION (instant on OSS stores; some backends copy first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        mv = client.get_model_version(name, str(version))
        status = str(mv.status)
        if status == "READY":
            return
        if status == "FAILED_REGISTRATION":
            raise TrackingError(f"{name} version {version} failed registration: {mv.status_message}")
        if time.monotonic() > deadline:
            raise TrackingError(f"{name} version {version} still {status} after {timeout_s:.0f} s")
        time.sleep(0.5)


def _rollback(client: Any, name: str, version: int | None, created_model: bool, model_id: str | None) -> None:
    """Best-effort removal of what a failed :func:`register_policy` created (errors here are secondary)."""
    with contextlib.suppress(Exception):
        if version is not None:
            client.delete_model_version(name, str(version))
    with contextlib.suppress(Exception):
        if created_model and not client.search_model_versions(f"name='{name}'"):
            client.delete_registered_model(name)
    with contextlib.suppress(Exception):
        if model_id:
            client.delete_logged_model(model_id)


# ---------------------------------------------------------------------- resolve and download
@dataclass(frozen=True)
class ModelRef:
    """A parsed ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``."""

    name: str
    alias: str | None = None
    version: int | None = None

    @classmethod
    def parse(cls, uri: str) -> ModelRef:
        m = _URI.match(uri.strip())
        if m is None:
            raise ModelError(f"{uri!r}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
        v = m.group("version")
        return cls(m.group("name"), m.group("alias"), int(v) if v is not None else None)

    def __str__(self) -> str:
        return f"models:/{self.name}@{self.alias}" if self.alias else f"models:/{self.name}/{self.version}"


def _connect_for_models() -> None:
    try:
        configure()
    except ModelRegistryUnavailable:
        raise
    except TrackingError as exc:
        raise ModelRegistryUnavailable(str(exc)) from None


def resolve_version(uri: str | ModelRef) -> Any:
    """The ``ModelVersion`` a models:/ URI names; unknown model/alias/version is a :class:`ModelError`."""
    ref = uri if isinstance(uri, ModelRef) else ModelRef.parse(uri)
    _connect_for_models()
    client = _client()
    mlflow_exc = _mlflow_exception()
    try:
        if ref.alias is not None:
            return client.get_model_version_by_alias(ref.name, ref.alias)
        return client.get_model_version(ref.name, str(ref.version))
    except mlflow_exc as exc:
        if not (_not_found(exc) or _error_code(exc) == "INVALID_PARAMETER_VALUE"):
            raise ModelRegistryUnavailable(f"{ref}: registry request failed: {str(exc).splitlines()[0]}") from None
    # Say precisely what is missing: the model, or only the alias/version.
    try:
        rm = client.get_registered_model(ref.name)
    except mlflow_exc:
        raise ModelError(f"{ref}: no registered model {ref.name!r} in {tracking_uri()}") from None
    aliases = ", ".join(f"{a}->v{v}" for a, v in sorted((getattr(rm, "aliases", None) or {}).items())) or "none"
    what = f"alias {ref.alias!r}" if ref.alias else f"version {ref.version}"
    raise ModelError(f"{ref}: model {ref.name!r} has no {what} (aliases: {aliases})")


def model_cache_dir() -> Path:
    """``$RLSCHED_MODEL_CACHE``, else ``~/.cache/rlsched/models``."""
    env = os.environ.get("RLSCHED_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "rlsched" / "models"


def download_model(uri: str, dst: Path | str | None = None) -> Path:
    """Download a registered version and return its local model folder (the ``policy`` artifact).

    Args:
        uri: ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``.
        dst: directory to download into. Default: the model cache
            (:func:`model_cache_dir`) under ``<hash of the tracking URI>/NAME/vVERSION``;
            a registered version's files never change (deleted version numbers are
            not reused), so a cached copy is reused instead of downloaded again -
            the alias is still resolved on the server every time.

    Raises:
        ModelError: malformed URI, unknown model/alias/version, a version that is not an
            rlsched policy, or the server is down (:class:`ModelRegistryUnavailable`).
    """
    ref = ModelRef.parse(uri)
    mv = resolve_version(ref)
    what = f"{ref} (version {mv.version})"
    if dst is not None:
        return _download(mv, Path(dst), what)
    key = hashlib.sha256(tracking_uri().encode()).hexdigest()[:12]
    final = model_cache_dir() / key / ref.name / f"v{mv.version}"
    if (final / "MLmodel").exists():
        return _policy_folder(final, what)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{mv.version}-", dir=final.parent))
    try:
        _download(mv, tmp, what)
        try:
            tmp.rename(final)  # atomic: a concurrent loader sees all of it or nothing
        except OSError:
            if not (final / "MLmodel").exists():  # lost a race only if the winner finished
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return _policy_folder(final, what)


def _download(mv: Any, target: Path, what: str) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    import mlflow

    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=str(mv.source), dst_path=str(target)))
    except _mlflow_exception() as exc:
        raise ModelRegistryUnavailable(f"{what}: download failed: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise ModelError(f"{what}: download failed: {exc}") from None
    return _policy_folder(local, what)


def _policy_folder(root: Path, what: str) -> Path:
    """The ``policy`` artifact inside a downloaded pyfunc model (per its MLmodel file)."""
    import yaml

    mlmodel = root / "MLmodel"
    try:
        meta = yaml.safe_load(mlmodel.read_text()) or {}
        rel = meta["flavors"]["python_function"]["artifacts"][POLICY_ARTIFACT]["path"]
        folder = root / rel
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        hits = sorted({p.parent for name in (CODEC_FILE, SELECTOR_FILE) for p in root.rglob(name)})
        if len(hits) != 1:
            raise ModelError(f"{what}: not an rlsched policy (no '{POLICY_ARTIFACT}' artifact)") from None
        folder = hits[0]
    if not (folder / CODEC_FILE).exists() and not (folder / SELECTOR_FILE).exists():
        raise ModelError(f"{what}: artifact '{POLICY_ARTIFACT}' is not a model folder (no {CODEC_FILE} "
                         f"or {SELECTOR_FILE})")
    return folder


# ---------------------------------------------------------------------- promote
@dataclass(frozen=True)
class Check:
    """One comparison of the promotion rule."""

    ok: bool
    text: str


@dataclass(frozen=True)
class PromoteResult:
    """What :func:`promote` did.

    Attributes:
        name, version: the model version asked for.
        promoted: ``champion`` points at ``version`` now (also when it already did).
        forced: the rule was skipped (``force=True``).
        previous_champion: the version ``champion`` pointed at before (None: none).
        reason: one line: why it was refused, or what happened.
        checks: every comparison made, passed or failed (empty when forced).
    """

    name: str
    version: int
    promoted: bool
    forced: bool
    previous_champion: int | None
    reason: str
    checks: tuple[Check, ...] = field(default_factory=tuple)


def _num(entry: Mapping[str, Any] | None, metric: str) -> float | None:
    if entry is None or metric not in entry:
        return None
    try:
        v = float(entry[metric])
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _compare(checks: list[Check], label: str, cand: float | None, op: str, ref: float | None, ref_label: str) -> None:
    if cand is None or ref is None:
        checks.append(Check(False, f"{label}: missing or non-finite ({cand} {op} {ref_label} {ref})"))
        return
    if op == "<":
        ok = cand < ref
    elif op == "<=":
        ok = cand <= ref * (1 + REL_TOL)
    else:  # ">="
        ok = cand >= ref * (1 - REL_TOL)
    checks.append(Check(ok, f"{label}: candidate {cand:.6g} {op if ok else 'NOT ' + op} {ref_label} {ref:.6g}"))


def check_promotion(
    candidate_eval: Mapping[str, Mapping[str, Any]],
    champion_eval: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    candidate_eval_set: str | None = None,
    champion_eval_set: str | None = None,
    champion: tuple[str, int] | None = None,
    champion_replay: ChampionReplay | None = None,
) -> list[Check]:
    """The promotion rule (module docstring) as a list of checks; promote only if all pass.

    Args:
        candidate_eval: the candidate card's ``metrics.eval`` (``{policy: {metric: value}}``).
        champion_eval: the current champion's, or None when there is no champion.
        candidate_eval_set, champion_eval_set: evaluation-set ids (see :func:`eval_set_id`).
        champion: the current champion's (registered name, version).
        champion_replay: the candidate's ``champion_eval`` tag; used instead of ``champion_eval``
            only when the evaluation sets differ and it replays exactly ``champion`` on
            ``candidate_eval_set``.
    """
    checks: list[Check] = []
    cand = candidate_entry(candidate_eval)
    if cand is None:
        return [Check(False, f"no candidate metrics ('{CANDIDATE_POLICY}') in the evaluation results")]
    wp = candidate_eval.get(BASELINE_POLICY)
    if wp is None:
        checks.append(Check(False, f"no '{BASELINE_POLICY}' baseline in the evaluation results"))
    else:
        _compare(checks, "mean JCT vs weighted-priority", _num(cand, "mean_jct_s"), "<",
                 _num(wp, "mean_jct_s"), "weighted-priority")
        _compare(checks, "cost vs weighted-priority", _num(cand, "cost_usd"), "<=",
                 _num(wp, "cost_usd"), "weighted-priority")
        if "jobs_completed" in cand and "jobs_completed" in wp:
            _compare(checks, "jobs completed vs weighted-priority", _num(cand, "jobs_completed"), ">=",
                     _num(wp, "jobs_completed"), "weighted-priority")
    if champion_eval is not None:
        champ = candidate_entry(champion_eval)
        vs = "champion"
        if candidate_eval_set and champion_eval_set and candidate_eval_set != champion_eval_set:
            differs = f"evaluation set differs from the champion's ({candidate_eval_set} vs {champion_eval_set})"
            unusable = _replay_unusable(champion_replay, champion, candidate_eval_set)
            if unusable is None and champion_replay is not None and champion is not None:
                champ = candidate_entry(champion_replay.metrics)
                vs = "champion replayed on the candidate's evaluation windows"
                checks.append(Check(True, f"{differs}: comparing with {champion[0]} version {champion[1]} "
                                          f"replayed on the candidate's evaluation windows ({CHAMPION_EVAL_TAG} tag)"))
            else:
                checks.append(Check(False, f"{differs}: metrics are not comparable{unusable or ''}"))
        _compare(checks, f"mean JCT vs {vs}", _num(cand, "mean_jct_s"), "<", _num(champ, "mean_jct_s"), "champion")
        _compare(checks, f"cost vs {vs}", _num(cand, "cost_usd"), "<=", _num(champ, "cost_usd"), "champion")
    return checks


def _replay_unusable(replay: ChampionReplay | None, champion: tuple[str, int] | None,
                     candidate_eval_set: str) -> str | None:
    """Why a candidate's champion replay cannot stand in for the champion's numbers ("" when it has none).

    None means it can: it replays exactly the current champion version, on the candidate's
    own evaluation windows, and holds that model's metrics.
    """
    if replay is None or champion is None:
        return ""
    who = (f"{replay.model} version {replay.version}" if replay.model is not None and replay.version is not None
           else "a model folder")
    if (replay.model, replay.version) != champion:
        return f" (its {CHAMPION_EVAL_TAG} replays {who}, not the champion {champion[0]} version {champion[1]})"
    if replay.eval_set != candidate_eval_set:
        return f" (its {CHAMPION_EVAL_TAG} was measured on {replay.eval_set}, not on the candidate's evaluation set)"
    if candidate_entry(replay.metrics) is None:
        return f" (its {CHAMPION_EVAL_TAG} has no '{CANDIDATE_POLICY}' metrics)"
    return None


def _version_eval(mv: Any) -> tuple[dict[str, dict[str, Any]], str | None]:
    """A version's evaluation summary and eval-set id: from its tags, else from its card."""
    tags = dict(mv.tags or {})
    raw = tags.get("eval_metrics")
    if raw:
        try:
            ev = json.loads(raw)
            if isinstance(ev, dict):
                return {str(k): dict(v) for k, v in ev.items() if isinstance(v, Mapping)}, tags.get("eval_set")
        except ValueError:
            pass
    with tempfile.TemporaryDirectory(prefix="rlsched-card-") as tmp:
        folder = download_model(f"models:/{mv.name}/{mv.version}", tmp)
        card = load_model_folder(folder).card
    return card_eval(card), eval_set_id(card)


def _version_families(mv: Any) -> dict[str, Any] | None:
    """A version's family-gate results: its ``family_gate`` tag, else its card."""
    raw = dict(mv.tags or {}).get(FAMILY_TAG)
    if raw:
        try:
            fam = json.loads(raw)
        except ValueError:
            fam = None
        if isinstance(fam, dict) and isinstance(fam.get("summary"), dict):
            return fam
    with tempfile.TemporaryDirectory(prefix="rlsched-card-") as tmp:
        folder = download_model(f"models:/{mv.name}/{mv.version}", tmp)
        return card_families(load_model_folder(folder).card)


def gate_version(name: str, version: int | str, *, families: list[str] | None = None, windows: int = 3,
                 max_jobs: int = 1000, processes: int = 1, progress: Any = None) -> tuple[Any, list[Check]]:
    """Run the workload-family evaluation on a registered version and store it in its ``family_gate`` tag.

    ``families`` defaults to the ``spot`` group for a spot model (its card says so:
    :func:`~rlsched.train.families.is_spot_model`), else ``generated``.
    Returns the :class:`~rlsched.train.generalisation.FamilyReport` and the gate's checks.
    """
    from rlsched.train.families import is_spot_model, resolve
    from rlsched.train.generalisation import evaluate_families

    mv = resolve_version(ModelRef(name, version=int(version)))
    with tempfile.TemporaryDirectory(prefix="rlsched-gate-") as tmp:
        folder = download_model(f"models:/{mv.name}/{mv.version}", tmp)
        card = load_model_folder(folder).card
        spot = is_spot_model(dict(card))
        fams = resolve(families or (["spot"] if spot else ["generated"]))
        report = evaluate_families(fams, str(folder), card=card, windows=windows, max_jobs=max_jobs,
                                   processes=processes, progress=progress)
    fam = {"summary": report.summaries, "exposure": report.exposure, "spot_model": spot}
    mlflow_exc = _mlflow_exception()
    try:
        _client().set_model_version_tag(mv.name, str(mv.version), FAMILY_TAG, family_tag(fam))
    except mlflow_exc as exc:
        raise TrackingError(f"storing the family gate of {name} version {version} failed: "
                            f"{str(exc).splitlines()[0]}") from None
    return report, family_gate_checks(fam)


def default_audit_path() -> Path:
    """``$RLSCHED_AUDIT_FILE``, else ``./rlsched-audit.jsonl``."""
    return Path(os.environ.get("RLSCHED_AUDIT_FILE") or DEFAULT_AUDIT_FILE)


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    if os.environ.get("RLSCHED_ACTOR"):
        return os.environ["RLSCHED_ACTOR"]
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def promote(
    name: str,
    version: int | str,
    *,
    force: bool = False,
    actor: str | None = None,
    reason: str | None = None,
    audit_path: Path | str | None = None,
) -> PromoteResult:
    """Move alias ``champion`` to ``version`` if it passes :func:`check_promotion` (or ``force``).

    A refusal changes nothing and says which comparison failed. A promotion first
    opens the audit file (so an unwritable audit log stops it before anything
    changes), tags the version, moves the alias (removing the tags again if that
    fails), then appends the audit line.

    Args:
        name: registered model name.
        version: the version to promote.
        force: skip the rule (audited: ``forced=true`` tag and audit line).
        actor: who promotes; default ``$RLSCHED_ACTOR`` or the login name.
        reason: why (recorded; expected with ``force``).
        audit_path: the JSON-lines audit file; default :func:`default_audit_path`.

    Raises:
        ModelError: unknown model or version.
        TrackingError: the server is down or refused a change.
    """
    v = int(version)
    mv = resolve_version(ModelRef(name, version=v))
    client = _client()
    mlflow_exc = _mlflow_exception()
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except mlflow_exc as exc:
        if not (_not_found(exc) or _error_code(exc) == "INVALID_PARAMETER_VALUE"):
            raise TrackingError(f"reading {name}@{CHAMPION} failed: {str(exc).splitlines()[0]}") from None
        champion = None
    previous = int(champion.version) if champion is not None else None
    if previous == v:
        return PromoteResult(name, v, True, False, previous, f"{name} version {v} is already the champion")
    checks: tuple[Check, ...] = ()
    if not force:
        cand_ev, cand_set = _version_eval(mv)
        champ_ev, champ_set = _version_eval(champion) if champion is not None else (None, None)
        champ_ref = (str(champion.name), int(champion.version)) if champion is not None else None
        replay = ChampionReplay.parse(dict(mv.tags or {}).get(CHAMPION_EVAL_TAG))
        checks = tuple(check_promotion(cand_ev, champ_ev, candidate_eval_set=cand_set, champion_eval_set=champ_set,
                                       champion=champ_ref, champion_replay=replay)
                       + family_gate_checks(_version_families(mv)))
        failed = [c.text for c in checks if not c.ok]
        if failed:
            return PromoteResult(name, v, False, False, previous,
                                 f"refused to promote {name} version {v}: " + "; ".join(failed), checks)
    who = _actor(actor)
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    audit = Path(audit_path) if audit_path is not None else default_audit_path()
    record = {"time": when, "action": "promote", "model": name, "version": v, "previous_champion": previous,
              "forced": force, "actor": who, "reason": reason or "", "tracking_uri": tracking_uri(),
              "checks": [{"ok": c.ok, "text": c.text} for c in checks]}
    tags = {"promoted_by": who, "promoted_at": when, "forced": "true" if force else "false",
            "promote_reason": _tag_value(reason or ""), "previous_champion": str(previous or "")}
    try:
        audit.parent.mkdir(parents=True, exist_ok=True)
        fh = audit.open("a", encoding="utf-8")
    except OSError as exc:
        raise TrackingError(f"audit file {audit} is not writable ({exc}); nothing was promoted") from None
    with fh:
        old_tags = dict(mv.tags or {})
        try:
            for k, val in tags.items():
                client.set_model_version_tag(name, str(v), k, val)
            client.set_registered_model_alias(name, CHAMPION, str(v))
        except mlflow_exc as exc:
            with contextlib.suppress(Exception):
                for k in tags:
                    if k in old_tags:
                        client.set_model_version_tag(name, str(v), k, old_tags[k])
                    else:
                        client.delete_model_version_tag(name, str(v), k)
            raise TrackingError(f"promoting {name} version {v} failed (champion unchanged): "
                                f"{str(exc).splitlines()[0]}") from None
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    what = "force-promoted" if force else "promoted"
    prev = f" (was version {previous})" if previous is not None else " (first champion)"
    return PromoteResult(name, v, True, force, previous, f"{what} {name} version {v} to {CHAMPION}{prev}", checks)


# ---------------------------------------------------------------------- listing
def _all_registered_models(client: Any) -> list[Any]:
    """Every registered model, following MLflow's result pages."""
    out: list[Any] = []
    token = None
    while True:
        page = client.search_registered_models(max_results=100, page_token=token)
        out.extend(page)
        token = getattr(page, "token", None)
        if not token:
            return out


def list_versions(name: str | None = None) -> list[dict[str, Any]]:
    """Every version (of ``name``, or of every registered model) with aliases and headline tags.

    Rows are plain dicts (``name``, ``version``, ``aliases``, ``created``, ``run_id``,
    ``tags``) sorted by name then version, ready for a table or ``--json``.
    """
    _connect_for_models()
    client = _client()
    mlflow_exc = _mlflow_exception()
    # Aliases come from the registered model: search_model_versions leaves them empty on some stores.
    versions: list[Any] = []
    aliases: dict[tuple[str, int], list[str]] = {}
    try:
        models = [client.get_registered_model(name)] if name is not None else _all_registered_models(client)
        for rm in models:
            for alias, ver in (getattr(rm, "aliases", None) or {}).items():
                aliases.setdefault((rm.name, int(ver)), []).append(alias)
            versions.extend(client.search_model_versions(f"name='{rm.name}'"))
    except mlflow_exc as exc:
        if name is not None and _not_found(exc):
            raise ModelError(f"no registered model {name!r} in {tracking_uri()}") from None
        raise TrackingError(f"listing models failed: {str(exc).splitlines()[0]}") from None
    rows = []
    for mv in versions:
        ts = mv.creation_timestamp
        created = datetime.fromtimestamp(ts / 1000, tz=timezone.utc) if ts else None
        key = (str(mv.name), int(mv.version))
        rows.append({"name": mv.name, "version": int(mv.version), "aliases": sorted(aliases.get(key, [])),
                     "created": created.isoformat(timespec="seconds") if created else None,
                     "run_id": mv.run_id, "tags": dict(mv.tags or {})})
    return sorted(rows, key=lambda r: (r["name"], r["version"]))


__all__ = [
    "BASELINE_POLICY",
    "CANDIDATE_POLICY",
    "CHALLENGER",
    "CHAMPION",
    "CHAMPION_EVAL_TAG",
    "ChampionReplay",
    "Check",
    "ModelRef",
    "ModelRegistryUnavailable",
    "PolicyPyfunc",
    "PromoteResult",
    "card_families",
    "check_promotion",
    "download_model",
    "family_gate_checks",
    "gate_version",
    "list_versions",
    "predict_actions",
    "promote",
    "register_policy",
    "resolve_version",
]
