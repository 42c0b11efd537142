"""Experiment tracking with MLflow: where runs go, how SB3's metrics are named, fast failure.

Where runs go (:func:`tracking_uri`):

* ``$MLFLOW_TRACKING_URI`` when set - typically a shared ``mlflow server``
  (``http://host:5000``); the server decides where artifacts live.
* otherwise an *embedded* store that needs no server: the SQLite database
  ``./mlruns.db`` (absolute path of the current directory) with artifacts under
  ``./mlruns-artifacts``. SQLite rather than MLflow's plain file store because the
  model registry (aliases, version tags) only exists on a database backend.
  ``mlflow ui --backend-store-uri sqlite:///mlruns.db`` browses it.

Metric names follow the CleanRL convention so dashboards of different projects
line up: SB3's ``rollout/*`` and ``time/*`` become ``charts/*`` (with
``rollout/ep_rew_mean`` -> ``charts/episodic_return``, ``rollout/ep_len_mean`` ->
``charts/episodic_length``, ``time/fps`` -> ``charts/SPS``), ``train/*`` optimisation
statistics become ``losses/*`` (``train/learning_rate`` -> ``charts/learning_rate``),
and evaluation results are ``eval/<policy>/<metric>``.

A tracking server that is down must fail in seconds with a clear
:class:`TrackingError`, not after MLflow's default seven exponential-backoff
retries (minutes): :func:`configure` sets ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` and
a short ``MLFLOW_HTTP_REQUEST_TIMEOUT`` unless the user set them, and probes the
server's ``/health`` endpoint before doing anything.

MLflow and SB3 are imported lazily (inside functions; :class:`MlflowWriter` is built
on first access) so that importing this module - and the CLI commands that do -
stays cheap, and ``rlsched validate/plan/simulate`` never import either.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlsched.errors import RlschedError

if TYPE_CHECKING:
    from stable_baselines3.common.logger import KVWriter

log = logging.getLogger(__name__)

#: Embedded store used when ``MLFLOW_TRACKING_URI`` is not set (relative to the current directory).
DEFAULT_DB = "mlruns.db"
#: Where the embedded store keeps artifacts (relative to the current directory).
DEFAULT_ARTIFACTS = "mlruns-artifacts"
#: Seconds to wait for the tracking server's health probe and (by default) any HTTP request.
CONNECT_TIMEOUT_S = 5.0
DEFAULT_HTTP_TIMEOUT_S = 30

#: SB3 keys renamed explicitly; other ``rollout/``/``time/``/``train/`` keys follow :func:`metric_key`'s rule.
SB3_RENAMES: dict[str, str] = {
    "rollout/ep_rew_mean": "charts/episodic_return",
    "rollout/ep_len_mean": "charts/episodic_length",
    "time/fps": "charts/SPS",
    "train/learning_rate": "charts/learning_rate",
}
_PREFIXES = {"rollout": "charts", "time": "charts", "train": "losses"}
_MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter value


class TrackingError(RlschedError):
    """The tracking server cannot be reached or refused a request (message says which and what to do)."""


# ---------------------------------------------------------------------- configuration
def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, or the embedded SQLite store ``sqlite:///<cwd>/mlruns.db``.

    The default is absolute so that a process changing directory later (SB3 subprocess
    workers, test fixtures) keeps writing to the same database.
    """
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env:
        return env
    return f"sqlite:///{(Path.cwd() / DEFAULT_DB).resolve()}"


def is_embedded(uri: str | None = None) -> bool:
    """Whether ``uri`` (default: the current one) is a local store rather than a server."""
    uri = uri or tracking_uri()
    return not uri.startswith(("http://", "https://", "databricks"))


def default_artifact_location() -> str | None:
    """Artifact root for new experiments: ``./mlruns-artifacts`` for the embedded store, else the server's choice."""
    if is_embedded():
        return (Path.cwd() / DEFAULT_ARTIFACTS).resolve().as_uri()
    return None


def check_reachable(uri: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`TrackingError` unless an HTTP tracking server answers its ``/health`` probe.

    Only connection-level failures (refused, DNS, timeout) count: a server that answers
    at all - even 401/404 behind a proxy - is up, and MLflow reports anything else itself.
    """
    if not uri.startswith(("http://", "https://")):
        return
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(
            f"MLflow tracking server {uri} is not reachable ({reason}); start it "
            f"(`mlflow server --backend-store-uri sqlite:///mlflow.db --port ...`) or unset "
            f"MLFLOW_TRACKING_URI to use the local store ./{DEFAULT_DB}"
        ) from None


def configure(check: bool = True) -> str:
    """Point MLflow at :func:`tracking_uri` with short HTTP retries; returns the URI.

    Environment defaults are only set when the user has not chosen them, so a
    long-running job can still opt into retries (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=5``).

    Args:
        check: probe a tracking server's ``/health`` first (fails in seconds when it is down).
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(DEFAULT_HTTP_TIMEOUT_S))
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    if check:
        check_reachable(uri)
    return uri


def tracking_error(exc: BaseException, doing: str) -> TrackingError:
    """A :class:`TrackingError` for an MLflow/requests failure while ``doing`` something.

    MLflow's own messages embed a full URL and the urllib3 retry history; the first
    line is what a user needs.
    """
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if len(msg) > 400:
        msg = msg[:400] + "..."
    return TrackingError(f"MLflow ({tracking_uri()}) failed {doing}: {msg}")


def ensure_experiment(name: str) -> str:
    """The id of experiment ``name``, created (with the embedded artifact root if local) when missing."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    try:
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                raise TrackingError(f"MLflow experiment {name!r} is deleted; restore it or choose another name")
            return str(exp.experiment_id)
        return str(client.create_experiment(name, artifact_location=default_artifact_location()))
    except MlflowException as exc:
        raise tracking_error(exc, f"to open experiment {name!r}") from None


# ---------------------------------------------------------------------- params and metrics
def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mappings as dotted keys (``ppo.learning_rate``) with string values MLflow accepts.

    MLflow params are flat strings; flattening keeps every knob searchable
    (``params.ppo.gamma = '0.99'``) instead of one opaque JSON blob.
    """
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if value:
                out.update(flatten_params(value, prefix=name + "."))
            else:
                out[name] = "{}"
            continue
        text = "" if value is None else str(value)
        out[name] = text if len(text) <= _MAX_PARAM_CHARS else text[: _MAX_PARAM_CHARS - 3] + "..."
    return out


def metric_key(key: str) -> str:
    """The MLflow name of an SB3 logger key (see the module docstring for the convention)."""
    if key in SB3_RENAMES:
        return SB3_RENAMES[key]
    head, sep, tail = key.partition("/")
    if sep and head in _PREFIXES:
        return f"{_PREFIXES[head]}/{tail}"
    return key


def as_number(value: Any) -> float | None:
    """``value`` as a float when it is a real scalar (numpy/torch 0-d included), else None.

    Booleans, strings, videos, figures and multi-element arrays are not metrics.
    """
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    size = getattr(value, "size", None)
    numel = getattr(value, "numel", None)
    n = numel() if callable(numel) else size if isinstance(size, int) else None
    if n == 1 and hasattr(value, "item"):
        item = value.item()
        if isinstance(item, numbers.Real) and not isinstance(item, bool):
            return float(item)
    return None


def _safe_name(text: str) -> str:
    """MLflow metric names allow alphanumerics and ``_ - . / : space``; anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "_-./: " else "_" for c in text)


def eval_metrics(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """``{"eval/<policy>/<metric>": value}`` for every numeric, finite metric of every policy."""
    out: dict[str, float] = {}
    for policy, metrics in results.items():
        for metric, value in metrics.items():
            v = as_number(value)
            if v is not None and math.isfinite(v):
                out[f"eval/{_safe_name(str(policy))}/{_safe_name(str(metric))}"] = v
    return out


def _active_run_id(run_id: str | None, what: str) -> str:
    import mlflow

    if run_id is not None:
        return run_id
    run = mlflow.active_run()
    if run is None:
        raise TrackingError(f"{what} needs an MLflow run: call inside `start_run(...)` or pass run_id")
    return str(run.info.run_id)


def log_metrics(metrics: Mapping[str, Any], step: int = 0, run_id: str | None = None) -> None:
    """Log numeric ``metrics`` at ``step`` in one batch (non-numeric values skipped)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException

    rid = _active_run_id(run_id, "log_metrics")
    ts = int(time.time() * 1000)
    batch = []
    for k, v in metrics.items():
        num = as_number(v)
        if num is not None:
            batch.append(Metric(_safe_name(k), num, ts, int(step)))
    if not batch:
        return
    try:
        client = MlflowClient()
        for i in range(0, len(batch), 1000):  # MLflow's per-request limit
            client.log_batch(rid, metrics=batch[i : i + 1000])
    except MlflowException as exc:
        raise tracking_error(exc, "to log metrics") from None


def log_eval(results: Mapping[str, Mapping[str, Any]], step: int = 0, run_id: str | None = None) -> None:
    """Log an evaluation summary ``{policy: {metric: value}}`` as ``eval/<policy>/<metric>``.

    Args:
        results: e.g. ``evaluate(...)["summary"]``.
        step: the training step the evaluation belongs to (x axis of the charts).
        run_id: the run; default the active one.
    """
    log_metrics(eval_metrics(results), step=step, run_id=run_id)


# ---------------------------------------------------------------------- runs
@contextmanager
def start_run(
    experiment: str,
    run_name: str | None = None,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
) -> Iterator[Any]:
    """Start (and on exit end) an MLflow run with flattened ``params`` and ``tags``; yields the run.

    A failure inside the block marks the run FAILED (MLflow's own context manager
    does that); a tracking server that is down raises :class:`TrackingError` here,
    before any training time is spent.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    configure()
    exp_id = ensure_experiment(experiment)
    try:
        run_cm = mlflow.start_run(experiment_id=exp_id, run_name=run_name,
                                  tags={k: str(v) for k, v in (tags or {}).items()})
        run = run_cm.__enter__()
    except MlflowException as exc:
        raise tracking_error(exc, f"to start a run in {experiment!r}") from None
    try:
        if params:
            flat = flatten_params(params)
            items = list(flat.items())
            from mlflow.entities import Param

            client = mlflow.MlflowClient()
            for i in range(0, len(items), 100):  # MLflow's per-request limit on params
                client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in items[i : i + 100]])
    except MlflowException as exc:
        run_cm.__exit__(*sys.exc_info())
        raise tracking_error(exc, "to log run parameters") from None
    except BaseException:
        run_cm.__exit__(*sys.exc_info())
        raise
    with run_cm:
        yield run


# ---------------------------------------------------------------------- SB3 logger output
class _MlflowWriterImpl:
    """The body of :class:`MlflowWriter` (kept apart so SB3 is only imported when one is made).

    Args:
        run_id: the run to log into; default the active run at construction time.
        strict: raise :class:`TrackingError` when a write fails. Off by default: a
            tracking server hiccup should cost a few chart points, not hours of training;
            the first failure is logged as a warning and the rest are counted in
            :attr:`dropped`.
    """

    def __init__(self, run_id: str | None = None, *, strict: bool = False) -> None:
        self.run_id = _active_run_id(run_id, "MlflowWriter")
        self.strict = strict
        self.dropped = 0

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        """Log every numeric value not excluded for ``mlflow``, under its namespaced key."""
        metrics: dict[str, float] = {}
        for key, value in sorted(key_values.items()):
            excluded = key_excluded.get(key)
            if excluded is not None and "mlflow" in excluded:
                continue
            num = as_number(value)
            if num is not None:
                metrics[metric_key(key)] = num
        if not metrics:
            return
        try:
            log_metrics(metrics, step=step, run_id=self.run_id)
        except TrackingError as exc:
            if self.strict:
                raise
            if self.dropped == 0:
                log.warning("MLflow metrics dropped (training continues): %s", exc)
            self.dropped += 1

    def close(self) -> None:
        """Nothing to release: every write is one synchronous batch."""


if TYPE_CHECKING:

    class MlflowWriter(_MlflowWriterImpl, KVWriter):
        """An SB3 ``KVWriter`` logging the SB3 logger's records as MLflow metrics."""


def _writer_class() -> type[Any]:
    cls = globals().get("MlflowWriter")
    if cls is None:
        from stable_baselines3.common.logger import KVWriter as _KVWriter

        cls = type("MlflowWriter", (_MlflowWriterImpl, _KVWriter), {
            "__module__": __name__,
            "__qualname__": "MlflowWriter",
            "__doc__": "An SB3 ``KVWriter`` logging the SB3 logger's records as MLflow metrics "
                       "(see :class:`_MlflowWriterImpl` for the arguments).",
        })
        globals()["MlflowWriter"] = cls
    return cls


def __getattr__(name: str) -> Any:
    """Build :class:`MlflowWriter` (an SB3 ``KVWriter`` subclass) on first access only."""
    if name == "MlflowWriter":
        return _writer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------- the trainer's handle
class Tracker:
    """One training run's tracking: started at construction, ended by :meth:`close`.

    The trainer holds one of these for the whole of ``rlsched train``; it is a class
    rather than a ``with`` block because the run spans checkpoint/resume logic and
    must be closed from a ``finally`` (a run ended during an exception is marked
    FAILED, KILLED on Ctrl-C).

    Args:
        experiment: MLflow experiment name (created when missing).
        run_name: the run's display name.
        params: hyper-parameters, nested mappings allowed (flattened with dots).
        tags: run tags.
    """

    def __init__(self, experiment: str, *, run_name: str | None = None, params: Mapping[str, Any] | None = None,
                 tags: Mapping[str, Any] | None = None) -> None:
        self._stack = ExitStack()
        self.run = self._stack.enter_context(start_run(experiment, run_name=run_name, params=params, tags=tags))
        self.run_id: str = str(self.run.info.run_id)
        self.experiment = experiment
        self._writer: Any = None

    def attach(self, model: Any) -> None:
        """Send the SB3 ``model``'s logger records to this run (replacing SB3's own outputs)."""
        from stable_baselines3.common.logger import Logger

        self._writer = _writer_class()(self.run_id)
        model.set_logger(Logger(folder=None, output_formats=[self._writer]))

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> None:
        """Log numeric metrics at ``step``."""
        log_metrics(metrics, step=step, run_id=self.run_id)

    def log_eval(self, results: Mapping[str, Mapping[str, Any]], step: int = 0) -> None:
        """Log an evaluation summary as ``eval/<policy>/<metric>``."""
        log_eval(results, step=step, run_id=self.run_id)

    def log_artifacts(self, folder: Path | str, artifact_path: str | None = "model") -> None:
        """Upload a folder (the exported model folder, plots) to the run's artifacts."""
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        try:
            MlflowClient().log_artifacts(self.run_id, str(folder), artifact_path=artifact_path)
        except (MlflowException, OSError) as exc:
            raise tracking_error(exc, f"to upload {folder}") from None

    def register(self, folder: Path | str, name: str, *, tags: Mapping[str, Any] | None = None) -> int | None:
        """Register the model folder as a new version of ``name`` (alias ``challenger``).

        Returns the version, or None when registration failed: the model folder is
        already on disk and training is over, so a registry problem is reported (a logged
        warning) rather than thrown away with the run; register it later with
        ``rlsched models register FOLDER --name NAME``.
        """
        from rlsched.train.registry import register_policy

        try:
            return register_policy(folder, run_id=self.run_id, name=name, tags=tags)
        except RlschedError as exc:
            log.warning("model not registered: %s (register later: rlsched models register %s --name %s)",
                        exc, folder, name)
            return None

    def close(self) -> None:
        """End the run (idempotent): FAILED if an exception is propagating, KILLED on Ctrl-C, else FINISHED."""
        exc = sys.exc_info()[1]
        if exc is not None:
            import mlflow

            active = mlflow.active_run()
            if active is not None and active.info.run_id == self.run_id:
                try:
                    mlflow.end_run(status="KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
                except Exception as err:  # the original exception matters more than this one
                    log.warning("could not mark MLflow run %s as failed: %s", self.run_id, err)
        self._stack.close()
