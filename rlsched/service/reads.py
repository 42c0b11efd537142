"""The read side of the service: job status, job listings, logs, the audit trail and service info.

Reads go to the store without the scheduling lock (SQLite WAL readers never wait); the lock is held only to
explain pending jobs from the in-memory mirror and the last scheduling pass (why a queued job waits, its
place in the queue, the issue of a running one), so a listing never stalls scheduling or submissions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlsched.runtime.audit import AuditRecord
from rlsched.runtime.store import JobRecord, JobState, UnknownJobError
from rlsched.service.admission import AdmissionError
from rlsched.service.context import ServiceContext
from rlsched.service.mirror import JobMirror
from rlsched.service.scheduling import SchedulingPass
from rlsched.service.served_policy import ServedPolicy
from rlsched.service.supervision import Supervisor
from rlsched.service.view import LiveView


class ReadSide:
    """Status, listings and info (see the module doc).

    Args:
        ctx: the service's shared parts.
        policy: the served policy (info).
        mirror, scheduling: what explains a pending job.
        supervisor: where job logs live; what the last recovery did.
        backend_name: the GPU backend's name (info).
    """

    def __init__(self, ctx: ServiceContext, policy: ServedPolicy, mirror: JobMirror, scheduling: SchedulingPass,
                 supervisor: Supervisor, backend_name: str) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.policy = policy
        self.mirror = mirror
        self.scheduling = scheduling
        self.supervisor = supervisor
        self.log_dir = supervisor.executor.log_dir
        self.backend_name = backend_name
        #: (mirror generation, job id -> queue position) of the last :meth:`_positions`.
        self._positions_cache: tuple[int, dict[str, int]] | None = None

    def _positions(self) -> dict[str, int]:
        """Job id -> 1-based place in the queue (priority, then submission), computed once per mirror change."""
        cached = self._positions_cache
        if cached is not None and cached[0] == self.mirror.gen:
            return cached[1]
        order = sorted(self.mirror.queued.values(), key=lambda r: (-r.priority, r.seq))
        positions = {r.id: i for i, r in enumerate(order, 1)}
        self._positions_cache = (self.mirror.gen, positions)
        return positions

    def _reason(self, rec: JobRecord) -> str:
        scheduling = self.scheduling
        if rec.id in scheduling.quota_held:
            return scheduling.quota_held[rec.id]
        if rec.id in scheduling.quota_blocked:
            return scheduling.quota_blocked[rec.id]
        view = self.mirror.view
        if view is None:
            return "waiting for the scheduler's first pass"
        run = view.state.queue.get(rec.id)
        if run is None:
            return "waiting for the next scheduling pass"
        why = view.why_pending(run.job)
        if rec.reason and why.startswith("policy holds it"):
            return f"{why}; last requeued: {rec.reason}"
        return why

    def _by_node(self, node: str, devices: tuple[str, ...]) -> dict[str, Any]:
        """``{"by_node": {node: [UUID...]}}`` for a job whose devices span nodes (a gang on a fleet), from the
        live inventory; empty for a job on one node (``node`` says where)."""
        view = self.mirror.view
        if view is None or len(devices) < 2:
            return {}
        groups: dict[str, list[str]] = {}
        for dev in devices:
            ref = view.devices.get(dev)
            groups.setdefault(ref.node if ref is not None else node, []).append(dev)
        return {"by_node": groups} if len(groups) > 1 else {}

    def _record_dict(self, rec: JobRecord) -> dict[str, Any]:
        opts = dict(rec.options or {})
        alloc = rec.allocation
        return {
            "id": rec.id,
            "seq": rec.seq,
            "state": rec.state.value,
            "user": rec.user,
            "priority": rec.priority,
            "request": {"argv": list(rec.argv), "gpus": None if rec.mig_profile else rec.num_gpus,
                        "mig": rec.mig_profile, "preemptible": rec.preemptible, "deadline": rec.deadline,
                        "cpus": opts.get("cpus"), "memory_gib": opts.get("memory_gib"), "pool": opts.get("pool"),
                        "estimated_duration_s": opts.get("estimated_duration_s"), "cwd": opts.get("cwd"),
                        "idempotency_key": rec.idempotency_key},
            "allocation": None if alloc is None else {
                "node": alloc.node, "pool": alloc.pool, "devices": list(alloc.devices),
                "gpu_indices": list(alloc.gpu_indices), "slice_start": alloc.slice_start,
                **self._by_node(alloc.node, alloc.devices)},
            "devices": list(alloc.devices) if alloc is not None else [],
            "exit_code": rec.exit_code,
            "submitted_at": rec.submitted_at,
            "started_at": rec.started_at,
            "finished_at": rec.finished_at,
            "attempts": rec.attempts,
            "pid": rec.pid,
            "log_path": rec.log_path or str(self.log_dir / f"{rec.id}.log"),
            "cancel_requested": rec.cancel_requested,
            "last_reason": rec.reason,
        }

    def job_status(self, job_id: str) -> dict[str, Any]:
        """A JSON-able picture of one job; a queued one also gets ``reason`` and ``position``.

        The store is read without the service lock (SQLite WAL readers never wait); the lock is held only to
        explain a pending job from the in-memory mirror.

        Raises:
            UnknownJobError: no such job.
        """
        rec = self.store.get(job_id)
        if rec is None:
            raise UnknownJobError(f"no job {job_id!r}")
        out = self._record_dict(rec)
        if rec.state is JobState.RUNNING and rec.cancel_requested:
            out["reason"] = "stopping (cancel requested)"
        elif rec.state is JobState.PREEMPTED:
            out["reason"] = f"stopping ({rec.reason or 'preempted'})"
        if rec.state.holds_gpus or rec.state is JobState.QUEUED:
            with self.ctx.lock:
                self._explain([(rec, out)])
        return out

    def _explain(self, pairs: list[tuple[JobRecord, dict[str, Any]]]) -> None:
        """Add the live view's issue of held jobs and the reason and position of queued ones (under the lock)."""
        positions: dict[str, int] | None = None
        view = self.mirror.view
        for rec, out in pairs:
            if rec.state.holds_gpus:
                issue = view.job_issues.get(rec.id) if view is not None else None
                if issue:
                    out["issue"] = issue
            elif rec.state is JobState.QUEUED:
                if positions is None:
                    positions = self._positions()
                out["reason"] = self._reason(rec)
                out["position"] = positions.get(rec.id, 0)

    def jobs(self, states: list[str] | None = None, limit: int | None = None,
             before: int | None = None) -> list[dict[str, Any]]:
        """Jobs in submission order (optionally only in ``states``), as :meth:`job_status` shows them.

        ``limit``: the last ``limit`` matching jobs; ``before``: only jobs with ``seq`` below it (paging back).
        The read is bounded by ``limit`` in SQL and made without the service lock, which is held only to
        explain the queued jobs of the page: a listing never stalls scheduling or submissions.
        """
        try:
            wanted = [JobState(s) for s in states] if states else None
        except ValueError:
            raise AdmissionError(f"unknown job state in {states!r} "
                                 f"(states: {', '.join(s.value for s in JobState)})") from None
        recs = self.store.jobs(wanted, limit=limit, before=before)
        pairs = [(rec, self._record_dict(rec)) for rec in recs]
        live = [(rec, d) for rec, d in pairs if rec.state is JobState.QUEUED or rec.state.holds_gpus]
        if live:
            with self.ctx.lock:
                self._explain(live)
        for rec, d in live:
            if rec.state is JobState.PREEMPTED:
                d.setdefault("reason", f"stopping ({rec.reason or 'preempted'})")
            elif rec.state is JobState.RUNNING and rec.cancel_requested:
                d.setdefault("reason", "stopping (cancel requested)")
        return [d for _, d in pairs]

    def log_path(self, job_id: str) -> Path:
        """The job's log file (stdout + stderr of every attempt); UnknownJobError for unknown ids."""
        rec = self.store.get(job_id)
        if rec is None:
            raise UnknownJobError(f"no job {job_id!r}")
        return Path(rec.log_path) if rec.log_path else self.log_dir / f"{rec.id}.log"

    def audit(self, since: int | None = None, job: str | None = None, limit: int | None = None) -> list[AuditRecord]:
        """Audit records in id order (``since``: id cursor, exclusive)."""
        return self.store.audit(since, job=job, limit=limit)

    def info(self, *, loop_running: bool, last_tick: float | None) -> dict[str, Any]:
        """Policy, model version, mode, breaker, pools (GPUs total/free), queue length, running count."""
        config = self.ctx.config
        with self.ctx.lock:
            counts = self.mirror.counts()
            decl, guard = self.policy.decl, self.policy.guard
            # the last pass's summary: /v1/info never builds a view (a pass does, and one follows any change)
            view: LiveView | None
            if self.scheduling.pool_summary is not None:
                view, pools = self.mirror.view, self.scheduling.pool_summary
            else:
                view = self.scheduling.current_view()
                pools = view.pool_summary()
            return {
                "policy": decl.name,
                "scheduler": decl.scheduler,
                "fallback": decl.fallback,
                "model": decl.model,
                "model_version": guard.model_version if guard is not None else "",
                "primary_available": guard.primary_available if guard is not None else False,
                "mode": config.mode.value,
                "breaker": guard.breaker_state.value if guard is not None else "n/a",
                "fallbacks_by_reason": dict(guard.fallbacks_by_reason) if guard is not None else {},
                "pools": pools,
                "queue_length": counts.get("queued", 0),
                "running": counts.get("running", 0) + counts.get("preempted", 0),
                "jobs": counts,
                "unhealthy_gpus": dict(view.unhealthy) if view is not None else {},
                "gpu_problems": dict(view.gpu_problems) if view is not None else {},
                "backend": self.backend_name,
                "state_dir": str(config.state_dir),
                "spec": [str(p) for p in config.spec_paths],
                "loop_running": loop_running,
                "last_tick": last_tick,
                "recovered": dict(self.supervisor.recovered),
            }
