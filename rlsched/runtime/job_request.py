"""The one type of a job submission, from the HTTP API through the service's admission to the store.

A :class:`JobRequest` is what a user asks for; the API builds it from the request body, the
service validates it against the live pools and quotas, and :meth:`Store.submit_record
<rlsched.runtime.store.Store.submit_record>` queues it. One type for all three keeps the fields
(and their defaults) in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The request fields the store keeps in a job's ``options`` (beyond its columns), in this order.
OPTION_FIELDS = ("cpus", "memory_gib", "pool", "estimated_duration_s", "cwd")


@dataclass
class JobRequest:
    """A job to queue: an argv and either ``gpus`` whole GPUs, a MIG instance, or a fraction of one GPU.

    Attributes:
        argv: the program and its arguments (run without a shell).
        gpus: whole GPUs (None: one, or the one GPU a ``mig`` instance or a fraction lives on).
        mig: a MIG profile instead of whole GPUs (``"3g.40gb"``).
        gpu_milli: a fraction of one GPU in thousandths (1000: a whole GPU); the store derives it for ``mig``.
        gpu_models: GPU models the job may run on (empty: any).
        priority: higher runs first.
        user: who submits (quotas are per user or principal).
        preemptible: may be stopped and requeued.
        deadline: wanted completion, unix time in seconds.
        cpus, memory_gib: host resources.
        pool: run only in this pool.
        estimated_duration_s: the submitter's run-time estimate.
        cwd: the job's working directory (default: the service's).
        idempotency_key: a retry with the same key returns the first submission's job.
    """

    argv: Sequence[str]
    gpus: int | None = None
    mig: str | None = None
    gpu_milli: int = 1000
    gpu_models: Sequence[str] = ()
    priority: int = 0
    user: str = "anonymous"
    preemptible: bool = False
    deadline: float | None = None
    cpus: float | None = None
    memory_gib: float | None = None
    pool: str | None = None
    estimated_duration_s: float | None = None
    cwd: str | None = None
    idempotency_key: str | None = None

    def options(self) -> dict[str, Any]:
        """The set fields of :data:`OPTION_FIELDS` (what the store keeps in the job's ``options``)."""
        return {name: value for name in OPTION_FIELDS if (value := getattr(self, name)) is not None}
