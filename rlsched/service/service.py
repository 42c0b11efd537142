"""The scheduler service: a façade over its parts, and the control loop.

:class:`SchedulerService` is the object ``rlsched serve`` runs (the HTTP API and the CLI are thin layers
over it). It wires its parts, each in its own module and owning its own state:

* :mod:`~rlsched.service.served_policy` - the spec, the served policy block and its guarded scheduler;
* :mod:`~rlsched.service.mirror` - the in-memory mirror of every unfinished job, and the live view;
* :mod:`~rlsched.service.inventory` - what the GPU backend says (nodes, health events, telemetry);
* :mod:`~rlsched.service.supervision` - job processes: launches, exits, stops, and recovery after a restart;
* :mod:`~rlsched.service.scheduling` - one scheduling pass: quotas, health, the policy's decisions;
* :mod:`~rlsched.service.durations` - the duration estimator the views carry, learnt from finished jobs;
* :mod:`~rlsched.service.reconfigure` - MIG re-splits a policy asks for, with crash-safe intents;
* :mod:`~rlsched.service.admission` - submissions (group-committed) and cancels;
* :mod:`~rlsched.service.reads` - job status, listings, logs, audit, info;
* :mod:`~rlsched.service.retention` - the history sweep;

and shares with them only :class:`~rlsched.service.context.ServiceContext` (store, scheduling lock,
wake-up, error reporting, the one-transaction batch).

Each loop iteration (:meth:`SchedulerService.tick`), under the scheduling lock:

1. polls job processes (one store transaction);
2. refreshes inventory, GPU health events and telemetry from the backend;
3. runs a scheduling pass (one store transaction) when something changed;
4. updates the metrics;

then, after the lock is released, launches the processes of the jobs the pass placed and records their
pids (one transaction). Nothing about allocations lives only in memory: the SQLite store is the source of
truth, every state change is committed there before it is acted upon (a launch, a signal, an exit file
consumed) or acknowledged, a transaction that fails reloads the mirror from the store, and a ``kill -9``
of the service at any instant is repaired by :meth:`SchedulerService.recover`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlsched.runtime.audit import AuditEvent, AuditRecord
from rlsched.runtime.backend import GpuBackend
from rlsched.runtime.executor import LocalExecutor, private_dir
from rlsched.runtime.job_executor import JobExecutor
from rlsched.runtime.job_request import JobRequest
from rlsched.runtime.select import get_backend
from rlsched.runtime.store import Allocation, JobRecord, JobState, Store, UnknownJobError
from rlsched.service.admission import Admission, AdmissionError
from rlsched.service.config import ServiceConfig
from rlsched.service.context import LOG, ServiceContext
from rlsched.service.inventory import Inventory
from rlsched.service.metrics import ServiceMetrics
from rlsched.service.mirror import JobMirror
from rlsched.service.notes import DecisionNotes
from rlsched.service.reads import ReadSide
from rlsched.service.reconfigure import MigReconfigurer
from rlsched.service.retention import HistoryRetention
from rlsched.service.scheduling import SchedulingPass
from rlsched.service.served_policy import ServedPolicy, ServiceError, load_spec_policy
from rlsched.service.supervision import Supervisor
from rlsched.service.twin import DigitalTwin
from rlsched.spec.model import PolicyDecl, Spec, SpecError

__all__ = ["AdmissionError", "JobRequest", "SchedulerService", "ServiceError", "SpecError", "UnknownJobError"]

#: Wake-ups (submissions, launches) start a loop iteration at most this often (capped by ``tick_s``):
#: a burst of submissions is folded into one scheduling pass instead of one pass each.
MIN_PASS_S = 0.05


class SchedulerService:
    """The scheduler service (see the module doc); thread-safe.

    Args:
        config: what to serve and where to keep state.
        clock: wall-clock source (store timestamps, the cluster's time).
        local_hostname: what ``localhost`` in a pool's nodes means (default: this host's name).

    Raises:
        SpecError: the spec does not load.
        BackendError: no usable backend.
        ServiceError: the named policy block does not exist.
    """

    def __init__(self, config: ServiceConfig, *, clock: Callable[[], float] = time.time,
                 local_hostname: str | None = None) -> None:
        self.config = config
        self.clock = clock
        private_dir(config.state_dir)
        self.metrics = ServiceMetrics()
        self.registry = self.metrics.registry
        self.backend: GpuBackend = get_backend(config.backend)
        spec, decl = load_spec_policy(config, config.spec_paths, config.policy)
        self.store = Store(config.db_path, clock=clock)
        self.executor: JobExecutor = getattr(self.backend, "job_executor", LocalExecutor)(config.log_dir)
        self.policy = ServedPolicy(config, self.store, spec, decl)
        self.ctx = ServiceContext(config, self.store, clock, self.metrics, lambda: self.policy.decl.fallback)
        self.ctx.resync = self._resync
        self.mirror = JobMirror(self.store)
        self.inventory = Inventory(self.ctx, self.backend)
        self.supervisor = Supervisor(self.ctx, self.executor, self.mirror)
        notes = DecisionNotes(self.store)
        self.reconfigurer = MigReconfigurer(self.ctx, self.backend, self.inventory, self.mirror, self.supervisor,
                                            notes, forget_pass=lambda: self.scheduling.forget())
        self.scheduling = SchedulingPass(self.ctx, self.policy, self.inventory, self.mirror, self.supervisor,
                                         self.reconfigurer, notes, local_hostname)
        self.admission = Admission(self.ctx, self.policy, self.mirror, self.scheduling, self.supervisor)
        self.reads = ReadSide(self.ctx, self.policy, self.mirror, self.scheduling, self.supervisor,
                              getattr(self.backend, "name", ""))
        self.retention = HistoryRetention(self.ctx, self.mirror, config.log_dir)
        self.twin = DigitalTwin(self, switch=lambda decl, reason, extra: self.serve_block(decl, reason, extra))
        #: the duration estimator every live view carries: warmed up from the store's history once, before
        #: recovery settles anything, then fed each finish as it commits (exactly once either way).
        self.durations = self.scheduling.durations
        self.supervisor.on_done = self.durations.learn
        #: the digital twin's schedule, while the loop runs.
        self._twin_thread: threading.Thread | None = None
        self._last_tick: float | None = None
        self._thread: threading.Thread | None = None
        #: the history retention sweeper, while the loop runs.
        self._retention: threading.Thread | None = None
        #: one loop iteration at a time (a test may tick while the loop thread runs).
        self._tick_lock = threading.Lock()
        self.mirror.load()
        self.durations.warm_up()

    @property
    def lock(self) -> threading.RLock:
        """The scheduling lock (see :class:`~rlsched.service.context.ServiceContext`)."""
        return self.ctx.lock

    @property
    def mode(self) -> str:
        """``policy``, ``shadow`` or ``fallback-only``."""
        return self.config.mode.value

    @property
    def recovered(self) -> dict[str, int]:
        """What recovery did: jobs adopted, finished, requeued; MIG intents closed."""
        return self.supervisor.recovered

    # ================================================================== life
    def start(self) -> None:
        """Recover, then run the control loop in a daemon thread (idempotent)."""
        with self.ctx.lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self.recover()
            self.ctx.stopping.clear()
            self._thread = threading.Thread(target=self._loop, name="rlsched-scheduler", daemon=True)
            self._thread.start()
            if self.retention.enabled:
                self._retention = threading.Thread(target=self.retention.run, name="rlsched-retention",
                                                   daemon=True)
                self._retention.start()
            self._twin_thread = threading.Thread(target=self.twin.loop, args=(self.ctx.stopping,),
                                                 name="rlsched-twin", daemon=True)
            self._twin_thread.start()

    def _loop(self) -> None:
        min_gap = min(self.config.tick_s, MIN_PASS_S)
        stopping, wake = self.ctx.stopping, self.ctx.wake
        while not stopping.is_set():
            t0 = time.monotonic()
            self.tick()
            wake.wait(self.config.tick_s)
            wake.clear()
            rest = min_gap - (time.monotonic() - t0)
            if rest > 0:
                stopping.wait(rest)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop; job processes keep running (a restarted service adopts them)."""
        self.ctx.stopping.set()
        self.ctx.wake.set()
        for t in (self._thread, self._retention, self._twin_thread):
            if t is not None and t is not threading.current_thread():
                t.join(timeout)
        self._thread = self._retention = self._twin_thread = None

    def close(self) -> None:
        """Stop the loop and close the store (job processes keep running)."""
        self.stop()
        closing = getattr(self.executor, "close", None)
        if callable(closing):  # a fleet executor: last log copies, and the cluster's lease given back
            closing()
        self.store.close()

    @property
    def running_loop(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def prune_history(self, now: float | None = None, *, background: bool = False) -> dict[str, int]:
        """Sweep finished jobs and decision records past the retention settings (see
        :mod:`~rlsched.service.retention`); returns ``{"jobs": N, "decisions": M}``."""
        return self.retention.prune(now, background=background)

    # ================================================================== recovery
    def recover(self) -> None:
        """Repair the store's picture after a restart (processes, then MIG intents); safe to call twice."""
        with self.ctx.lock:
            self.mirror.load()
            self.ctx.batch(self.supervisor.recover_jobs)
            self.ctx.batch(self.reconfigurer.recover_intents)
            self.scheduling.forget()

    def _resync(self) -> None:
        """After a failed transaction: forget what the pass meant to do and reload the mirror from the store."""
        self.supervisor.forget_launches()
        self.mirror.view = None
        self.scheduling.forget()
        try:
            self.mirror.load()
        except Exception:
            self.mirror.stale = True
            LOG.exception("could not reload the job mirror from the store")

    # ================================================================== the loop
    def tick(self) -> None:
        """One loop iteration (see the module doc); never raises."""
        with self._tick_lock:
            with self.ctx.lock:
                launches = self._tick_locked()
            if launches:
                try:
                    self.supervisor.launch(launches)
                except Exception as exc:
                    self.ctx.loop_error("launch", exc)

    def _tick_locked(self) -> list[tuple[JobRecord, Allocation]]:
        ctx = self.ctx
        self.metrics.ticks.inc()
        if self.mirror.stale:
            try:
                self.mirror.load()
            except Exception as exc:
                ctx.loop_error("store", exc)
                return []
        for stage, step, batched in (("processes", self.supervisor.poll, True),
                                     ("inventory", self.inventory.refresh, False),
                                     ("schedule", self.scheduling.run, True),
                                     ("metrics", self.scheduling.update_metrics, False)):
            try:
                if batched:
                    ctx.batch(step)
                else:
                    step()
            except Exception as exc:
                ctx.loop_error(stage, exc)
        self._last_tick = self.clock()
        self.metrics.last_tick.set(self._last_tick)
        return self.supervisor.take_launches()

    # ================================================================== API
    def submit(self, req: JobRequest) -> JobRecord:
        """Validate and queue a job; :class:`AdmissionError` says why one is refused."""
        return self.admission.submit(req)

    def cancel(self, job_id: str) -> JobState:
        """Cancel a job (see :meth:`Admission.cancel <rlsched.service.admission.Admission.cancel>`)."""
        return self.admission.cancel(job_id)

    def job_status(self, job_id: str) -> dict[str, Any]:
        """A JSON-able picture of one job; a queued one also gets ``reason`` and ``position``."""
        return self.reads.job_status(job_id)

    def jobs(self, states: list[str] | None = None, limit: int | None = None,
             before: int | None = None) -> list[dict[str, Any]]:
        """Jobs in submission order (see :meth:`ReadSide.jobs <rlsched.service.reads.ReadSide.jobs>`)."""
        return self.reads.jobs(states, limit=limit, before=before)

    def log_path(self, job_id: str) -> Path:
        """The job's log file (stdout + stderr of every attempt); UnknownJobError for unknown ids."""
        return self.reads.log_path(job_id)

    def audit(self, since: int | None = None, job: str | None = None, limit: int | None = None) -> list[AuditRecord]:
        """Audit records in id order (``since``: id cursor, exclusive)."""
        return self.reads.audit(since, job=job, limit=limit)

    def info(self) -> dict[str, Any]:
        """Policy, model version, mode, breaker, pools (GPUs total/free), queue length, running count."""
        return self.reads.info(loop_running=self.running_loop, last_tick=self._last_tick)

    def trace_csv(self, since_s: float | None = None, with_commands: bool = False) -> str:
        """The job history as canonical trace CSV (see :mod:`rlsched.workload.history`; a read-only
        connection of its own, outside the scheduling lock)."""
        from rlsched.workload.history import history_csv, read_history

        export = read_history(self.config.db_path, since_s=since_s, now=self.clock(), with_commands=with_commands)
        return history_csv(export, with_commands=with_commands)

    def reload(self, spec_paths: list[Path] | None = None, *, policy: str | None = None) -> dict[str, Any]:
        """Re-read the spec and hot-swap policy and pools; queued and running jobs are kept.

        Raises:
            SpecError: the new spec does not load (the old configuration stays).
            ServiceError: the policy block does not exist (the old configuration stays).
        """
        with self.policy.reload_lock:
            # Loading a spec is bounded (rlsched/spec/limits.py) but can take seconds for a large one: it
            # happens before the scheduling lock is taken, so the loop and submissions go on meanwhile.
            paths = [Path(p) for p in spec_paths] if spec_paths else list(self.config.spec_paths)
            spec, decl = self.policy.load(paths, policy if policy is not None else self.config.policy)
            return self._swap(spec, decl, paths, policy)

    def serve_block(self, decl: PolicyDecl, reason: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Serve ``decl`` (a variant of the current block: the digital twin's switch) on the current spec, with
        an audited ``reason``; the next :meth:`reload` serves the spec's own block again."""
        with self.policy.reload_lock:
            return self._swap(self.policy.spec, decl, list(self.config.spec_paths), None, reason=reason,
                              extra=extra)

    def _swap(self, spec: Spec, decl: PolicyDecl, paths: list[Path], policy: str | None, *,
              reason: str = "reload", extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Install a loaded spec and policy under the scheduling lock (the second half of :meth:`reload`)."""
        with self.ctx.lock:
            previous = self.policy.label()
            kept = self.policy.install(spec, decl)
            if kept:
                LOG.warning("reload: model %s could not be loaded; still serving %s", decl.model, kept)
            guard = self.policy.guard
            self.config.spec_paths = paths
            if policy is not None:
                self.config.policy = policy
            self.scheduling.forget_all()
            self.mirror.view = None
            self.mirror.job_cache = {}
            self.metrics.reset_guard_mirror()
            try:
                self.store.append_audit(AuditEvent.POLICY_SWITCH, policy=self.policy.label(),
                                        model_version=guard.model_version if guard is not None else "",
                                        reason=reason,
                                        extra={**(extra or {}), "previous": previous, "policy_block": decl.name,
                                               "pools": sorted(spec.pools), "spec": [str(p) for p in paths],
                                               **({"kept_model": kept, "not_loaded": decl.model or ""}
                                                  if kept else {})})
            except Exception:
                self.metrics.audit_errors.inc()
                LOG.exception("could not audit the reload")
            self.ctx.wake.set()
            out = self.info()
            if kept:
                out["warning"] = (f"model {decl.model} could not be loaded (see the audit's fallback record); "
                                  f"still serving the previous model {kept}")
            return out
