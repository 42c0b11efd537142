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
    from rlsched.runtime.job_request import JobRequest
    from rlsched.service.admission import AdmissionError
    from rlsched.service.config import ServiceConfig, ServiceMode, default_state_dir
    from rlsched.service.service import SchedulerService

__all__ = ["AdmissionError", "JobRequest", "SchedulerService", "ServiceConfig", "ServiceMode", "default_state_dir"]

_WHERE = {
    "ServiceConfig": "rlsched.service.config",
    "ServiceMode": "rlsched.service.config",
    "default_state_dir": "rlsched.service.config",
    "AdmissionError": "rlsched.service.admission",
    "JobRequest": "rlsched.runtime.job_request",
    "SchedulerService": "rlsched.service.service",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'rlsched.service' has no attribute {name!r}")
