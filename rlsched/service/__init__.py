"""The long-running scheduler service behind ``rlsched serve``.

:class:`~rlsched.service.service.SchedulerService` places submitted jobs on live
GPUs and MIG instances with the spec's policy (guarded by the heuristic
fallback), runs them through the local executor and records every decision in the
SQLite store. Submodules are imported lazily: importing this package pulls in
neither fastapi, torch, mlflow nor pynvml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rlsched.service.config import ServiceConfig, default_state_dir
    from rlsched.service.service import AdmissionError, SchedulerService, SubmitRequest

__all__ = ["AdmissionError", "SchedulerService", "ServiceConfig", "SubmitRequest", "default_state_dir"]

_WHERE = {
    "ServiceConfig": "rlsched.service.config",
    "default_state_dir": "rlsched.service.config",
    "AdmissionError": "rlsched.service.service",
    "SchedulerService": "rlsched.service.service",
    "SubmitRequest": "rlsched.service.service",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'rlsched.service' has no attribute {name!r}")
