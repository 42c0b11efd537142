"""Configuration of the scheduler service (what ``rlsched serve`` passes in)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

#: Default retention of finished jobs: 30 days, and the newest 100,000 (whichever removes more).
DEFAULT_HISTORY_MAX_AGE_S = 30 * 86400.0
DEFAULT_HISTORY_MAX_JOBS = 100_000


def default_state_dir(spec_path: Path) -> Path:
    """Where a service keeps its store and job logs: ``<spec dir>/.rlsched-service/<spec stem>``.

    Beside the spec (like ``plan``'s state file), one folder per spec, so two
    services for two specs in one directory never share a database.
    """
    spec_path = Path(spec_path)
    base = spec_path if spec_path.is_dir() else spec_path.parent
    stem = spec_path.name if spec_path.is_dir() else spec_path.stem
    return base / ".rlsched-service" / stem


class ServiceMode(str, Enum):
    """How the served policy block acts (``rlsched serve``'s ``--shadow`` / ``--fallback-only``)."""

    #: the block's scheduler decides, guarded by its fallback heuristic
    POLICY = "policy"
    #: the scheduler only advises (audited); the fallback heuristic acts
    SHADOW = "shadow"
    #: the block's fallback heuristic alone (no model is loaded)
    FALLBACK_ONLY = "fallback-only"


@dataclass
class ServiceConfig:
    """Everything a :class:`~rlsched.service.service.SchedulerService` is built from.

    Attributes:
        spec_paths: the pool spec files (or folders of ``*.hcl``).
        state_dir: store (``jobs.db``) and job logs (``logs/``).
        backend: ``nvml``, ``sim:PATH.json`` or ``ray:auto`` / ``ray:HOST:PORT``; None reads ``$RLSCHED_BACKEND``.
        variables: spec variables (as ``--var NAME=VALUE`` would set them).
        policy: which ``policy`` block to serve; default the only one, else ``default``.
        mode: policy, shadow or fallback-only (see :class:`ServiceMode`).
        tick_s: control-loop period.
        grace_s: SIGTERM -> SIGKILL delay when a job is cancelled or preempted.
        max_decision_latency_s: overrides the policy's ``health.max_decision_latency``.
        history_max_age_s: finished jobs (rows, logs, exit files) and decision records older than this are
            removed (None: kept by age). Default 30 days.
        history_max_jobs: at most this many finished jobs are kept, the newest (None: no count limit).
            Default 100,000. The audit trail is append-only and is kept whatever these say.
        retention_every_s: how often the background sweep runs (the first one soon after the start).
        public_read: the dashboard's reads of the fleet and the queue answer without a token, with job-supplied
            secrets redacted (see :mod:`rlsched.service.api`); logs, audit, trace and every change still need
            it. Off by default.
    """

    spec_paths: list[Path]
    state_dir: Path
    backend: str | None = None
    variables: dict[str, Any] = field(default_factory=dict)
    policy: str | None = None
    mode: ServiceMode = ServiceMode.POLICY
    tick_s: float = 0.25
    grace_s: float = 10.0
    max_decision_latency_s: float | None = None
    history_max_age_s: float | None = DEFAULT_HISTORY_MAX_AGE_S
    history_max_jobs: int | None = DEFAULT_HISTORY_MAX_JOBS
    retention_every_s: float = 600.0
    public_read: bool = False

    def __post_init__(self) -> None:
        self.spec_paths = [Path(p) for p in ([self.spec_paths] if isinstance(self.spec_paths, (str, Path))
                                             else self.spec_paths)]
        self.state_dir = Path(self.state_dir)
        if not self.spec_paths:
            raise ValueError("ServiceConfig needs at least one spec path")
        if self.tick_s <= 0 or self.grace_s < 0:
            raise ValueError("tick_s must be > 0 and grace_s >= 0")
        if self.max_decision_latency_s is not None and self.max_decision_latency_s <= 0:
            raise ValueError("max_decision_latency_s must be > 0")
        self.mode = ServiceMode(self.mode)  # (a ValueError names an unknown mode)
        if self.history_max_age_s is not None and not self.history_max_age_s > 0:
            raise ValueError("history_max_age_s must be > 0 (None keeps history of any age)")
        if self.history_max_jobs is not None and self.history_max_jobs < 0:
            raise ValueError("history_max_jobs must be >= 0 (None keeps any number)")
        if not self.retention_every_s > 0:
            raise ValueError("retention_every_s must be > 0")

    def var_args(self) -> list[str]:
        """``variables`` as ``NAME=VALUE`` strings for :func:`rlsched.spec.load_spec` (HCL literals)."""
        out = []
        for name, value in self.variables.items():
            if isinstance(value, str):
                text = value
            elif isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = json.dumps(value)
            out.append(f"{name}={text}")
        return out

    @property
    def db_path(self) -> Path:
        return self.state_dir / "jobs.db"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"
