"""The scheduler service: queue, control loop, launches, recovery.

:class:`SchedulerService` is the object ``rlsched serve`` runs (the HTTP API and the
CLI are thin layers over it). Each loop iteration (:meth:`SchedulerService.tick`):

1. polls job processes: a finished process finishes its job (done / failed /
   cancelled); a preempted one that stopped goes back to the queue; a stop that
   outlived ``grace_s`` is escalated from SIGTERM to SIGKILL;
2. refreshes inventory, GPU health events and telemetry from the backend;
3. keeps the live :class:`~rlsched.cluster.model.ClusterState` (inventory +
   unfinished jobs, :mod:`rlsched.service.view`), holds back queued jobs that are
   over their quota (:mod:`rlsched.service.quotas`), and stops jobs on unhealthy GPUs;
4. runs the guarded scheduler (the spec's policy behind
   :class:`~rlsched.runtime.guard.FallbackScheduler`) when something changed, and
   applies each decision after the feasibility check: a placement is committed
   with ``Store.mark_running`` BEFORE its process is launched (exactly-once: a
   crash in between leaves a running job without a pid, which recovery resolves
   by finding the wrapper process or requeueing - never by launching twice);
   preemptions signal the job and keep its GPUs held until it exits;
5. launches the processes of the jobs it placed - after the service lock is
   released, so submissions and status calls do not wait on fork/exec - and
   records their pids;
6. updates the metrics.

Scaling: the service keeps an in-memory mirror of every unfinished job (queued,
running, preempted), loaded from the store at start and by :meth:`recover`, and
updated by every transition the service makes *after* the store committed it;
the live view is built from the mirror and then updated incrementally, so a pass
neither re-reads nor re-decodes the queue, and a pass that nothing could change
(no transition, same inventory and health) is skipped. The writes of one loop
stage (finishing the processes that ended, one scheduling pass, recording the
pids of one batch of launches) are ONE store transaction (``Store.batch``), and
concurrent submissions are group-committed: each API thread validates its
request, then the first waiting thread commits every pending submission in one
transaction; each is acknowledged only after that commit.

Nothing about allocations lives only in memory: the SQLite store is the source
of truth, every state change is committed there before it is acted upon
(a launch, a signal, an exit file consumed) or acknowledged, a transaction that
fails reloads the mirror from the store, and a ``kill -9`` of the
service at any instant is repaired by :meth:`SchedulerService.recover`, which
re-adopts live processes (pid + start time), records exits that happened while
the service was down (exit files written by the wrapper) and requeues jobs whose
process vanished without one. Job processes run in their own sessions and
survive the service.

MIG reconfiguration: a policy's ``Reconfigure`` is applied when it is safe - the
feasibility check accepts it (:func:`~rlsched.cluster.feasibility.reconfigure_check`),
the GPU is in a MIG pool, open (healthy, node not cordoned) and no running,
preempted or launching job of the mirror holds it or one of its instances. The
GPU is closed for the rest of the pass; an *intent* record (``mig-reconfiguration``,
``phase: intent``, old and new layout) commits with the pass's transaction, then the
backend re-splits it (``set_mig_layout``); the outcome (``phase: done``: applied, or
the backend's error) is a second ``mig-reconfiguration`` record plus a decision
record, committed together, and the inventory is refreshed so the next pass sees the
new instance UUIDs. A ``kill -9`` between intent and outcome is closed by
:meth:`SchedulerService.recover` from the backend's real layout (tested with a real
SIGKILL before and after the re-split). A refused or failed reconfiguration is
audited (one record), never fatal.
The heuristics' own re-splitting stays off (layouts are the spec's; only a policy
that emits ``Reconfigure`` changes them). Elastic scaling is plan/apply's business:
``Scale`` decisions are recorded as not applied, and a served model's node consolidation
(a rule that empties nodes to release them) is left out; its other rules (the deadline
guard, long-job preemption) run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsched.cluster.decisions import Decision, Place, Preempt, Reconfigure, Scale, WakeAt
from rlsched.cluster.feasibility import fits_pool_spec, pool_candidates, profile_for, unschedulable_reason
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, PoolSpec, RunState, Sharing
from rlsched.errors import RlschedError
from rlsched.policies.base import Scheduler, make_policy
from rlsched.runtime.audit import AuditEvent, AuditRecord, decision_summary
from rlsched.runtime.backend import BackendError, GpuBackend, NodeInfo
from rlsched.runtime.executor import (
    EXIT_LOST,
    EXIT_NOT_EXECUTABLE,
    Launched,
    LocalExecutor,
    private_dir,
    proc_start_time,
)
from rlsched.runtime.guard import FallbackScheduler, GuardConfig, illegal_reason
from rlsched.runtime.select import get_backend
from rlsched.runtime.store import (
    Allocation,
    IdempotencyConflictError,
    InvalidTransitionError,
    JobRecord,
    JobState,
    Store,
    StoreError,
    UnknownJobError,
)
from rlsched.service.config import ServiceConfig
from rlsched.service.forecast import WARMUP_S as FORECAST_WARMUP_S
from rlsched.service.forecast import LiveForecast, served_forecast
from rlsched.service.metrics import ServiceMetrics
from rlsched.service.quotas import Ask, Holding, admission_problem, blocking, principal_matches
from rlsched.service.view import LiveView, build_view, drop_queued, enqueue_record, job_of, release_job
from rlsched.spec.model import PolicyDecl, Spec, SpecError

_log = logging.getLogger(__name__)

__all__ = ["AdmissionError", "SchedulerService", "ServiceError", "SpecError", "SubmitRequest", "UnknownJobError"]

#: Re-run the policy at least this often even when nothing changed (time-dependent policies, model retry).
RESCHEDULE_S = 30.0
#: Read backend telemetry at most this often.
TELEMETRY_S = 2.0
#: Decisions applied per loop iteration at most (a runaway policy cannot stall the loop).
MAX_DECISIONS_PER_TICK = 2000
#: Wake-ups (submissions, launches) start a loop iteration at most this often (capped by ``tick_s``):
#: a burst of submissions is folded into one scheduling pass instead of one pass each.
MIN_PASS_S = 0.05
#: History retention: first sweep this long after the start, jobs deleted per transaction, pause in between.
RETENTION_FIRST_S = 10.0
RETENTION_BATCH = 500
RETENTION_PAUSE_S = 0.02
#: The same loop error is audited at most once per this many seconds.
ERROR_AUDIT_S = 60.0
_DEFAULT_POLICY = PolicyDecl(name="default", scheduler="weighted-priority", fallback="weighted-priority")


class ServiceError(RlschedError):
    """The service cannot do what was asked (bad policy name, no backend...)."""


class AdmissionError(RlschedError):
    """A submission was refused; the message is one line for the user.

    ``kind`` tells the API which status to answer: ``"invalid"`` (a bad request:
    422/400), ``"quota"`` (can never fit a quota: 403), ``"conflict"`` (an
    idempotency key reused for another request: 409).
    """

    def __init__(self, message: str, *, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class SubmitRequest:
    """What a user submits: an argv and either ``gpus`` whole GPUs or one ``mig`` instance.

    ``cwd`` (an addition) is the job's working directory (default: the service's).
    """

    argv: list[str]
    gpus: int | None = None
    mig: str | None = None
    priority: int = 0
    user: str = "anonymous"
    preemptible: bool = False
    deadline: float | None = None
    cpus: float | None = None
    memory_gib: float | None = None
    pool: str | None = None
    estimated_duration_s: float | None = None
    idempotency_key: str | None = None
    cwd: str | None = None


@dataclass
class _PendingSubmit:
    """One API thread's submission waiting for a group commit."""

    kwargs: dict[str, Any]
    record: JobRecord | None = None
    error: Exception | None = None
    done: bool = False


def _counts(layout: Iterable[str]) -> dict[str, int]:
    """A MIG layout (profile names) as mig-parted counts."""
    out: dict[str, int] = {}
    for name in layout:
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


def _exit_reason(rc: int) -> str:
    if rc == 0:
        return ""
    if rc == EXIT_LOST:
        return "process vanished without an exit status"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


#: ``phase`` of the two ``mig-reconfiguration`` records of one applied re-split
MIG_INTENT, MIG_DONE = "intent", "done"


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
        self.local_hostname = local_hostname
        private_dir(config.state_dir)
        self.metrics = ServiceMetrics()
        self.registry = self.metrics.registry
        self._lock = threading.RLock()
        #: serialises reloads, which load the spec *outside* ``_lock`` so scheduling never waits on a parse
        self._reload_lock = threading.Lock()
        self.backend: GpuBackend = get_backend(config.backend)
        self._spec, self._policy = self._load_spec(config.spec_paths, config.policy)
        self.store = Store(config.db_path, clock=clock)
        self.executor = LocalExecutor(config.log_dir)
        self._sched: Scheduler
        self._guard: FallbackScheduler | None
        self._sched, self._guard = self._build_scheduler(self._policy)
        self._needs_reset = True
        self._handles: dict[str, Launched] = {}
        #: job id -> monotonic time after which SIGKILL follows the SIGTERM already sent.
        self._stopping: dict[str, float] = {}
        self._killed: set[str] = set()
        self._inventory: list[NodeInfo] = []
        self._inventory_ok = False
        self._health_events: dict[str, str] = {}
        self._view: LiveView | None = None
        self._quota_held: dict[str, str] = {}
        #: quota refusals of the last policy pass (a placement the policy chose in a pool over quota).
        self._quota_blocked: dict[str, str] = {}
        self._signature: Any = None
        self._next_decide = 0.0
        self._noted: set[tuple[str, ...]] = set()
        self._next_telemetry = 0.0
        self._error_audited: dict[str, float] = {}
        self._last_tick: float | None = None
        self.recovered: dict[str, int] = {"adopted": 0, "finished": 0, "requeued": 0, "mig_intents": 0}
        self._thread: threading.Thread | None = None
        #: the history retention sweeper (see :meth:`prune_history`), while the loop runs.
        self._retention: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        #: one loop iteration at a time (a test may tick while the loop thread runs).
        self._tick_lock = threading.Lock()
        # The mirror of unfinished jobs (see the module doc): queued ones in ``seq`` order, and the
        # ones holding GPUs; counts of finished jobs per state.
        self._queued: dict[str, JobRecord] = {}
        self._holding: dict[str, JobRecord] = {}
        self._queued_in_order = True
        self._finished: dict[str, int] = {}
        self._mirror_stale = False
        #: job id -> the Job policies see (a request never changes; cleared when the spec does).
        self._job_cache: dict[str, Job] = {}
        #: bumped by every transition folded into the mirror; a pass runs only when it moved.
        self._gen = 0
        self._pass_gen = -1
        self._struct_sig: Any = None
        self._views_built = 0
        #: (mirror generation, job id -> queue position) of the last :meth:`_positions`.
        self._positions_cache: tuple[int, dict[str, int]] | None = None
        #: per-pool GPU summary of the last loop pass (``/v1/info`` reads it without building a view).
        self._pool_summary: dict[str, Any] | None = None
        #: jobs committed as running whose process is being started (outside the lock).
        self._launching: set[str] = set()
        self._to_launch: list[tuple[JobRecord, Allocation]] = []
        #: what waits for the current batch's commit (signals, exit files to consume).
        self._after_commit: list[Callable[[], None]] = []
        #: queued jobs cancelled before their submission group folded them into the mirror.
        self._tombstones: set[str] = set()
        self._group = threading.Condition()
        self._group_pending: list[_PendingSubmit] = []
        self._group_busy = False
        self._load_mirror()

    # ================================================================== configuration
    def _load_spec(self, paths: list[Path], policy: str | None) -> tuple[Spec, PolicyDecl]:
        from rlsched.spec.loader import load_spec

        spec = load_spec([Path(p) for p in paths], var_args=self.config.var_args())
        if policy is not None:
            if policy not in spec.policies:
                known = ", ".join(sorted(spec.policies)) or "none"
                raise ServiceError(f"the spec has no policy block {policy!r} (declared: {known})")
            return spec, spec.policies[policy]
        if len(spec.policies) == 1:
            return spec, next(iter(spec.policies.values()))
        if "default" in spec.policies:
            return spec, spec.policies["default"]
        if spec.policies:
            known = ", ".join(sorted(spec.policies))
            raise ServiceError(f"the spec declares several policy blocks ({known}); choose one")
        return spec, _DEFAULT_POLICY

    def _model_ref(self, model: str) -> str:
        if model.startswith("models:/") or Path(model).is_absolute():
            return model
        for base in self.config.spec_paths:
            root = base if base.is_dir() else base.parent
            cand = root / model
            if cand.exists():
                return str(cand)
        return model

    @staticmethod
    def _heuristic(name: str, weights: dict[str, float]) -> Scheduler:
        params: dict[str, Any] = {}
        if name == "weighted-priority":
            if "priority" in weights:
                params["w_priority"] = float(weights["priority"])
            if "wait" in weights:
                params["w_wait"] = float(weights["wait"])
        sched = make_policy(name, **params)
        if hasattr(sched, "mig_reconfigure"):
            # MIG layouts are the spec's (plan/apply): the heuristics never re-split a GPU on their own
            # (their dynamic re-splitting was written for the simulator, where a reconfiguration is free to
            # retry and no operator expects the declared layout). A policy that emits Reconfigure still may
            # (see _reconfigure).
            sched.mig_reconfigure = False
        return sched

    def _build_scheduler(self, decl: PolicyDecl) -> tuple[Scheduler, FallbackScheduler | None]:
        fallback = self._heuristic(decl.fallback, decl.weights)
        if self.config.fallback_only:
            return fallback, None
        budget = self.config.max_decision_latency_s or decl.health.max_decision_latency_s
        guard_cfg = GuardConfig(latency_budget_s=budget, shadow=self.config.shadow)
        primary: Scheduler | Callable[[], Scheduler]
        if decl.scheduler == "rl":
            ref = self._model_ref(decl.model or "")
            label = f"rl:{decl.model}"

            def load() -> Scheduler:
                from rlsched.policies.ppo import make_ppo_policy  # torch only when a model is served

                sched = make_ppo_policy(ref, name=label)
                # This service does not scale pools (plan/apply does), so a rule whose moves only pay
                # when the node they empty is released (node consolidation) would restart jobs for
                # nothing - and, the node never going away, move them again at the next pass.
                sched.rules = [r for r in sched.rules if not r.releases_nodes]
                if sched.complement is not None:
                    # the heuristic taking what the model was not trained with: layouts stay the spec's
                    sched.complement.heuristic.mig_reconfigure = False
                return sched

            primary = load
        else:
            primary = self._heuristic(decl.scheduler, decl.weights)
            label = decl.scheduler
        guard = FallbackScheduler(primary, fallback, guard_cfg, audit=self.store.audit_sink(),
                                  name=f"guarded:{label}>{fallback.name}")
        return guard, guard

    @property
    def mode(self) -> str:
        if self.config.fallback_only:
            return "fallback-only"
        return "shadow" if self.config.shadow else "policy"

    def _policy_label(self) -> str:
        return self._policy.fallback if self._guard is None else str(self._sched.name)

    # ================================================================== life
    def start(self) -> None:
        """Recover, then run the control loop in a daemon thread (idempotent)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self.recover()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="rlsched-scheduler", daemon=True)
            self._thread.start()
            if self.config.history_max_age_s is not None or self.config.history_max_jobs is not None:
                self._retention = threading.Thread(target=self._retention_loop, name="rlsched-retention",
                                                   daemon=True)
                self._retention.start()

    # ================================================================== retention
    def _retention_loop(self) -> None:
        """Sweep old history now and then (see :meth:`prune_history`) until the service stops."""
        wait = min(RETENTION_FIRST_S, self.config.retention_every_s)
        while not self._stop.wait(wait):
            try:
                self.prune_history(background=True)
            except Exception as exc:
                self._loop_error("retention", exc)
            wait = self.config.retention_every_s

    def prune_history(self, now: float | None = None, *, background: bool = False) -> dict[str, int]:
        """Remove finished jobs past the retention settings (rows, log and exit files) and old decision records.

        Runs in batches of :data:`RETENTION_BATCH` jobs, each its own short store transaction, with a pause
        in between, and takes the service lock only to adjust the finished-job counts: scheduling and
        submissions go on while a long history is swept. ``background``: the sweep of the retention thread,
        which ends early when the service stops. Returns ``{"jobs": N, "decisions": M}``.
        """
        cfg = self.config
        if cfg.history_max_age_s is None and cfg.history_max_jobs is None:
            return {"jobs": 0, "decisions": 0}
        now = self.clock() if now is None else now
        before = None if cfg.history_max_age_s is None else now - cfg.history_max_age_s
        removed = decisions = 0
        exit_files: dict[str, list[str]] | None = None
        while not (background and self._stop.is_set()):
            batch = self.store.prune_finished(finished_before=before, keep=cfg.history_max_jobs,
                                              limit=RETENTION_BATCH)
            if not batch:
                break
            if exit_files is None:  # one directory listing per sweep, not one per job
                exit_files = {}
                with contextlib.suppress(OSError), os.scandir(self.executor.log_dir) as it:
                    for entry in it:
                        if ".exit.json" in entry.name:
                            exit_files.setdefault(entry.name.split(".", 1)[0], []).append(entry.path)
            for job in batch:
                paths = [job.log_path or str(self.executor.log_dir / f"{job.id}.log"), *exit_files.get(job.id, ())]
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            with self._lock:
                for job in batch:
                    left = self._finished.get(job.state.value, 0) - 1
                    self._finished[job.state.value] = max(0, left)
            removed += len(batch)
            time.sleep(RETENTION_PAUSE_S)
        if before is not None:
            while not (background and self._stop.is_set()):
                n = self.store.prune_decisions(before, limit=RETENTION_BATCH)
                decisions += n
                if n < RETENTION_BATCH:
                    break
                time.sleep(RETENTION_PAUSE_S)
        if removed or decisions:
            _log.info("retention: removed %d finished job(s) and %d decision record(s)", removed, decisions)
        return {"jobs": removed, "decisions": decisions}

    def _loop(self) -> None:
        min_gap = min(self.config.tick_s, MIN_PASS_S)
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.tick()
            self._wake.wait(self.config.tick_s)
            self._wake.clear()
            rest = min_gap - (time.monotonic() - t0)
            if rest > 0:
                self._stop.wait(rest)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop; job processes keep running (a restarted service adopts them)."""
        self._stop.set()
        self._wake.set()
        for t in (self._thread, self._retention):
            if t is not None and t is not threading.current_thread():
                t.join(timeout)
        self._thread = self._retention = None

    def close(self) -> None:
        """Stop the loop and close the store (job processes keep running)."""
        self.stop()
        self.store.close()

    @property
    def running_loop(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ================================================================== processes
    def _exit_files(self, job_id: str) -> list[Path]:
        files = []
        for p in self.executor.log_dir.glob(f"{job_id}.*.exit.json"):
            nonce = p.name[len(job_id) + 1:-len(".exit.json")]
            if nonce.isdigit():
                files.append((int(nonce), p))
        return [p for _, p in sorted(files)]

    def _consume_exit_files(self, job_id: str, known: Path | None = None) -> None:
        """Mark a settled job's exit files seen: ``known`` (its process's, which this service launched or
        adopted) if given, else every one found (a scan of the log directory)."""
        for p in ([known] if known is not None else self._exit_files(job_id)):
            with contextlib.suppress(OSError):
                p.rename(p.with_name(p.name + ".seen"))

    def _recorded_exit(self, job_id: str) -> int | None:
        from rlsched.runtime.executor import read_exit_file

        files = self._exit_files(job_id)
        return read_exit_file(files[-1]) if files else None

    def _find_wrapper(self, job_id: str) -> Launched | None:
        """A live wrapper process of ``job_id`` (for a job marked running whose pid was never stored)."""
        prefix = str(self.executor.log_dir / f"{job_id}.").encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"rlsched.runtime.executor" not in b" ".join(args) or b"--wrap" not in args:
                continue
            i = args.index(b"--wrap")
            if i + 1 < len(args) and args[i + 1].startswith(prefix) and args[i + 1].endswith(b".exit.json"):
                pid = int(entry)
                start = proc_start_time(pid)
                if start is not None:
                    return self.executor.adopt(pid, start, None, job_id)
        return None

    def _handle(self, rec: JobRecord) -> Launched | None:
        """The live process of a running/preempted job, adopting it after a restart; None if it is gone
        (or not started yet: a job this service is launching right now)."""
        h = self._handles.get(rec.id)
        if h is not None and (rec.pid is None or h.pid == rec.pid):
            return h
        if rec.id in self._launching:
            return None
        if rec.pid is not None and rec.pid_start is not None:
            h = self.executor.adopt(rec.pid, rec.pid_start, None, rec.id, rec.log_path)
        else:
            h = self._find_wrapper(rec.id)
            if h is not None:
                with contextlib.suppress(StoreError):
                    self.store.set_process(rec.id, h.pid, h.start_time, str(h.log_path))
                    cur = self._holding.get(rec.id)
                    if cur is not None:
                        self._track(dataclasses.replace(cur, pid=h.pid, pid_start=h.start_time,
                                                        log_path=str(h.log_path)))
        if h is not None:
            self._handles[rec.id] = h
        return h

    def _ensure_stopping(self, rec: JobRecord, h: Launched) -> None:
        """SIGTERM once; SIGKILL after ``grace_s`` (never blocks)."""
        now = time.monotonic()
        deadline = self._stopping.get(rec.id)
        if deadline is None:
            self.executor.send_signal(h, signal.SIGTERM)
            self._stopping[rec.id] = now + self.config.grace_s
        elif now >= deadline and rec.id not in self._killed:
            self.executor.send_signal(h, signal.SIGKILL)
            self._killed.add(rec.id)

    def _settle(self, rec: JobRecord, rc: int | None) -> None:
        """Record the end of a job's process (``rc`` None: gone without an exit status).

        Called inside a batch: its exit files are consumed only once the batch committed.
        """
        if rec.state is JobState.PREEMPTED and not rec.cancel_requested:
            cur = self.store.requeue(rec.id, rec.reason or "preempted")
            self._count_recovery("requeued")
        elif rc is None or rc == EXIT_LOST:
            # Gone without an exit status (the wrapper was killed, or died with the machine): run it again
            # (or, if a cancel was pending, it ends cancelled).
            cur = self.store.requeue(rec.id, "process vanished without an exit status")
            self._count_recovery("requeued")
        else:
            cur = self.store.mark_finished(rec.id, rc, _exit_reason(rc))
            self._count_recovery("finished")
        self._track(cur)
        job_id = rec.id
        h = self._handles.pop(rec.id, None)
        known = h.exit_file if h is not None and h.exit_file.name.endswith(".exit.json") else None
        self._after_commit.append(lambda: self._consume_exit_files(job_id, known))
        self._stopping.pop(rec.id, None)
        self._killed.discard(rec.id)

    _recovering = False

    def _count_recovery(self, what: str) -> None:
        if self._recovering:
            self.recovered[what] += 1

    def _poll_processes(self) -> None:
        for rec in list(self._holding.values()):
            if rec.id in self._launching:
                continue
            try:
                h = self._handle(rec)
                if h is None:
                    self._settle(rec, self._recorded_exit(rec.id))
                    continue
                rc = self.executor.poll(h)
                if rc is None:
                    if rec.cancel_requested or rec.state is JobState.PREEMPTED:
                        self._ensure_stopping(rec, h)
                    continue
                if rc == EXIT_LOST:
                    recorded = self._recorded_exit(rec.id)
                    rc = recorded if recorded is not None else rc
                self._settle(rec, rc)
            except (InvalidTransitionError, UnknownJobError):
                continue  # changed under us (a cancel); the next iteration sees the new state

    def recover(self) -> None:
        """Repair the store's picture after a restart (see the module doc); safe to call twice."""
        with self._lock:
            self._load_mirror()
            self._recovering = True
            try:
                self._batch(self._recover_jobs)
                self._batch(self._recover_mig_intents)
            finally:
                self._recovering = False
            self._signature = None

    def _recover_jobs(self) -> None:
        for rec in list(self._holding.values()):
            try:
                h = self._handle(rec)
                rc = self.executor.poll(h) if h is not None else None
                if h is not None and rc is None:
                    self.recovered["adopted"] += 1
                    _log.info("adopted job %s (pid %s)", rec.id, h.pid)
                    if rec.state is JobState.PREEMPTED or rec.cancel_requested:
                        self._ensure_stopping(rec, h)
                    continue
                if rc is None or rc == EXIT_LOST:
                    recorded = self._recorded_exit(rec.id)
                    rc = recorded if recorded is not None else rc
                self._settle(rec, rc)
            except (InvalidTransitionError, UnknownJobError):
                continue

    def _recover_mig_intents(self) -> None:
        """Close each MIG re-split whose intent committed but whose outcome did not (killed in between).

        The backend's layout now says what happened: the new layout means the re-split ran
        (``applied``), the old one that it never did; anything else is recorded as found.
        """
        recs = self.store.audit(event=AuditEvent.MIG_RECONFIGURATION)
        closed = {r.extra.get("intent") for r in recs if r.extra.get("phase") == MIG_DONE}
        orphans = [r for r in recs if r.extra.get("phase") == MIG_INTENT and r.extra.get("intent") not in closed]
        if not orphans:
            return
        self._refresh_inventory()
        for r in orphans:
            info = next((g for n in self._inventory for g in n.gpus if g.uuid in r.gpus), None)
            found = info.layout_counts() if info is not None else None
            applied = found == r.extra.get("new_layout")
            if applied:
                reason = "recovered: the re-split was made before the service stopped"
            elif found == r.extra.get("old_layout"):
                reason = "recovered: the service stopped before the re-split"
            else:
                reason = f"recovered: layout found {found}"
            extra = {k: v for k, v in r.extra.items() if k != "phase"}
            self.store.append_audit(AuditEvent.MIG_RECONFIGURATION, gpus=r.gpus, policy=r.policy,
                                    model_version=r.model_version, reason=reason,
                                    extra={**extra, "phase": MIG_DONE, "applied": applied, "recovered": True,
                                           "found_layout": found})
            self.recovered["mig_intents"] += 1
            _log.warning("MIG re-split of %s interrupted by a restart: %s", ",".join(r.gpus), reason)

    # ================================================================== the mirror
    def _load_mirror(self) -> None:
        """(Re)load the unfinished jobs from the store (start, recover, after a failed transaction)."""
        self._view = None
        recs = self.store.jobs([JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED])
        counts = self.store.counts()
        self._queued = {r.id: r for r in recs if r.state is JobState.QUEUED}
        self._holding = {r.id: r for r in recs if r.state.holds_gpus}
        self._queued_in_order = True
        self._finished = {st.value: counts.get(st.value, 0) for st in JobState if st.terminal}
        self._job_cache = {}
        self._gen += 1
        self._mirror_stale = False

    def _queued_records(self) -> list[JobRecord]:
        """The queued jobs in submission (``seq``) order."""
        if not self._queued_in_order:
            self._queued = dict(sorted(self._queued.items(), key=lambda kv: kv[1].seq))
            self._queued_in_order = True
        return list(self._queued.values())

    def _counts(self) -> dict[str, int]:
        """Jobs per state, from the mirror (what ``Store.counts`` would say, without a table scan)."""
        out = {st.value: 0 for st in JobState}
        out.update(self._finished)
        out[JobState.QUEUED.value] = len(self._queued)
        for r in self._holding.values():
            out[r.state.value] += 1
        return out

    def _track(self, rec: JobRecord) -> None:
        """Fold a job's COMMITTED record into the mirror and the live view."""
        jid = rec.id
        old = self._queued.pop(jid, None)
        if old is None:
            old = self._holding.pop(jid, None)
        was = old.state if old is not None else None
        state = rec.state
        if state is JobState.QUEUED:
            if self._queued_in_order and self._queued and next(reversed(self._queued.values())).seq > rec.seq:
                self._queued_in_order = False  # a requeued job goes back to its submission place
            self._queued[jid] = rec
        elif state.holds_gpus:
            self._holding[jid] = rec
        else:
            self._finished[state.value] = self._finished.get(state.value, 0) + 1
            self._job_cache.pop(jid, None)
        if was is state:
            return  # a pid recorded, a cancel requested: nothing a policy sees
        self._gen += 1
        view = self._view
        if view is None:
            return
        if was is JobState.QUEUED:
            drop_queued(view, jid)  # (a placement of this pass already took it out of the queue)
        elif was is not None and was.holds_gpus and not state.holds_gpus:
            release_job(view, jid)
        elif was is None and state.holds_gpus:
            self._view = None  # not a transition this service makes: rebuild
            return
        if state is JobState.PREEMPTED:
            view.state.running.pop(jid, None)
        elif state is JobState.QUEUED:
            enqueue_record(view, rec, self._job_cache)

    def _batch(self, step: Callable[[], None]) -> None:
        """Run ``step``'s store writes as ONE transaction, then what waited for its commit.

        If anything fails, nothing of it was committed: the mirror is reloaded from the
        store, nothing it placed is launched, nothing is signalled, and the error propagates.
        """
        self._after_commit = []
        try:
            with self.store.batch():
                step()
        except BaseException:
            self._resync()
            raise
        after, self._after_commit = self._after_commit, []
        for fn in after:
            try:
                fn()
            except Exception as exc:
                self._loop_error("after-commit", exc)

    def _resync(self) -> None:
        self._after_commit = []
        self._to_launch = []
        self._launching.clear()
        self._view = None
        self._signature = None
        try:
            self._load_mirror()
        except Exception:
            self._mirror_stale = True
            _log.exception("could not reload the job mirror from the store")

    def _stop_after_commit(self, job_id: str) -> None:
        """SIGTERM a job (preempted, or on an unhealthy GPU) once its new state is committed."""

        def stop() -> None:
            rec = self._holding.get(job_id)
            if rec is not None:
                h = self._handle(rec)
                if h is not None:
                    self._ensure_stopping(rec, h)

        self._after_commit.append(stop)

    # ================================================================== the loop
    def tick(self) -> None:
        """One loop iteration (see the module doc); never raises."""
        with self._tick_lock:
            with self._lock:
                launches = self._tick_locked()
            if launches:
                try:
                    self._launch(launches)
                except Exception as exc:
                    self._loop_error("launch", exc)

    def _tick_locked(self) -> list[tuple[JobRecord, Allocation]]:
        self.metrics.ticks.inc()
        if self._mirror_stale:
            try:
                self._load_mirror()
            except Exception as exc:
                self._loop_error("store", exc)
                return []
        for stage, step, batched in (("processes", self._poll_processes, True),
                                     ("inventory", self._refresh_inventory, False),
                                     ("schedule", self._schedule, True),
                                     ("metrics", self._update_metrics, False)):
            try:
                if batched:
                    self._batch(step)
                else:
                    step()
            except Exception as exc:
                self._loop_error(stage, exc)
        self._last_tick = self.clock()
        self.metrics.last_tick.set(self._last_tick)
        launches, self._to_launch = self._to_launch, []
        return launches

    def _launch(self, launches: list[tuple[JobRecord, Allocation]]) -> None:
        """Start the processes of jobs the last pass committed as running, WITHOUT the service lock
        (fork/exec of each wrapper), then record their pids in one transaction."""
        results: list[tuple[JobRecord, Launched | None, Exception | None]] = []
        for rec, alloc in launches:
            cwd = (rec.options or {}).get("cwd")
            try:
                launched = self.executor.launch(rec.id, list(rec.argv), alloc.devices,
                                                env_extra={"RLSCHED_JOB_ID": rec.id,
                                                           "RLSCHED_ATTEMPT": str(rec.attempts)},
                                                cwd=cwd or None)
            except Exception as exc:
                _log.warning("launch of job %s failed: %s", rec.id, exc)
                results.append((rec, None, exc))
            else:
                results.append((rec, launched, None))

        def record() -> None:
            for rec, launched, exc in results:
                self._launching.discard(rec.id)
                try:
                    if launched is None:
                        self._track(self.store.mark_finished(rec.id, EXIT_NOT_EXECUTABLE, f"launch failed: {exc}"))
                        continue
                    self._handles[rec.id] = launched
                    self.store.set_process(rec.id, launched.pid, launched.start_time, str(launched.log_path))
                except (InvalidTransitionError, UnknownJobError):
                    continue
                cur = self._holding.get(rec.id)
                if cur is not None:
                    self._track(dataclasses.replace(cur, pid=launched.pid, pid_start=launched.start_time,
                                                    log_path=str(launched.log_path)))

        with self._lock:
            try:
                self._batch(record)
            except Exception as exc:
                self._loop_error("launch", exc)
        self._wake.set()  # poll them soon: short jobs end within a tick

    def _loop_error(self, stage: str, exc: BaseException) -> None:
        _log.exception("scheduler loop: %s failed", stage)
        self.metrics.loop_errors.labels(stage=stage).inc()
        key = f"{stage}:{type(exc).__name__}:{exc}"
        now = time.monotonic()
        if now < self._error_audited.get(key, -1e18) + ERROR_AUDIT_S:
            return
        self._error_audited[key] = now
        try:
            self.store.append_audit(AuditEvent.FALLBACK, policy=self._policy.fallback, reason=f"loop-error:{stage}",
                                    extra={"detail": f"{type(exc).__name__}: {exc}"})
        except Exception:
            self.metrics.audit_errors.inc()
            _log.exception("could not audit a loop error")

    def _refresh_inventory(self) -> None:
        try:
            self._inventory = list(self.backend.inventory())
            self._inventory_ok = True
        except Exception as exc:  # keep the last inventory: one bad read must not empty the cluster
            self._loop_error("inventory", exc)
        events = getattr(self.backend, "health_events", None)
        if callable(events):
            try:
                for uuid, reason in events():
                    if uuid not in self._health_events:
                        _log.warning("GPU %s closed by a health event: %s", uuid, reason)
                        self._health_events[str(uuid)] = str(reason)
            except Exception as exc:
                self._loop_error("health", exc)
        telemetry = getattr(self.backend, "telemetry", None)
        now = time.monotonic()
        if callable(telemetry) and now >= self._next_telemetry:
            self._next_telemetry = now + TELEMETRY_S
            try:
                self.metrics.set_telemetry(telemetry())
            except Exception as exc:
                self._loop_error("telemetry", exc)

    def _build_view(self, now: float | None = None) -> LiveView:
        """A fresh view from the inventory and the mirror (no store read, no decoding of known jobs)."""
        view = build_view(self._spec, self._inventory, list(self._holding.values()), self._queued_records(),
                          self.clock() if now is None else now, health_events=self._health_events,
                          local_hostname=self.local_hostname, job_cache=self._job_cache)
        # Policies may cache by (id(state), queue_version): every new state starts above any version an
        # earlier one reached, so a state at a recycled address never matches a stale cache entry.
        self._views_built += 1
        view.state.queue_version += self._views_built << 40
        return view

    def _current_view(self) -> LiveView:
        if self._view is None:
            if not self._inventory_ok:
                with contextlib.suppress(Exception):
                    self._inventory = list(self.backend.inventory())
                    self._inventory_ok = True
            self._view = self._build_view()
        return self._view

    # ------------------------------------------------------------------ quotas
    def _ask(self, rec: JobRecord, spec: PoolSpec) -> Ask:
        est = (rec.options or {}).get("estimated_duration_s")
        est_f = float(est) if est else None
        if spec.sharing is Sharing.MIG:
            prof = profile_for(spec.model, rec.num_gpus, rec.gpu_milli)
            name = prof.name if prof is not None else rec.mig_profile
            share = prof.fraction if prof is not None else rec.gpu_milli / 1000
            return Ask(rec.user, spec.name, 0, name, share, est_f)
        share = rec.gpu_milli / 1000 if rec.num_gpus == 1 and rec.gpu_milli < 1000 else float(rec.num_gpus)
        return Ask(rec.user, spec.name, rec.num_gpus, None, share, est_f)

    def _holding_of(self, rec: JobRecord, pools: dict[str, PoolSpec]) -> Holding | None:
        alloc = rec.allocation
        if alloc is None:
            return None
        spec = pools.get(alloc.pool)
        profile = None
        if alloc.slice_start is not None:
            prof = profile_for(spec.model, rec.num_gpus, rec.gpu_milli) if spec is not None else None
            profile = prof.name if prof is not None else rec.mig_profile
            share = prof.fraction if prof is not None else rec.gpu_milli / 1000
            gpus = 0
        else:
            gpus = len(alloc.devices)
            share = float(gpus)
        finished = rec.finished_at if rec.state.terminal else None
        return Holding(rec.user, alloc.pool, gpus, profile, share, rec.started_at, finished)

    def _holdings(self, holding: list[JobRecord], pools: dict[str, PoolSpec], now: float) -> list[Holding]:
        out = [h for r in holding if (h := self._holding_of(r, pools)) is not None]
        if any(q.max_gpu_hours_per_day is not None for q in self._spec.quotas.values()):
            finished = self.store.jobs([JobState.DONE, JobState.FAILED, JobState.CANCELLED],
                                       finished_since=now - 86_400.0)
            out += [h for r in finished if (h := self._holding_of(r, pools)) is not None]
        return out

    def _quota_hold(self, view: LiveView, queued: list[JobRecord], holdings: list[Holding],
                    now: float) -> dict[str, str]:
        quotas = list(self._spec.quotas.values())
        if not quotas:
            return {}
        held: dict[str, str] = {}
        subject: dict[str, bool] = {}  # user -> does any quota name them (the others are never held)
        for rec in queued:
            limited = subject.get(rec.user)
            if limited is None:
                limited = subject[rec.user] = any(principal_matches(q.principal, rec.user) for q in quotas)
            if not limited or rec.id not in view.state.queue:
                continue
            job = view.state.queue[rec.id].job
            reasons = []
            for spec in view.pools.values():
                if not view.could_run(job, spec.name):
                    continue
                why = blocking(quotas, holdings, self._ask(rec, spec), now)
                if why is None:
                    break
                reasons.append(why)
            else:
                if reasons:
                    held[rec.id] = reasons[0]
        return held

    # ------------------------------------------------------------------ scheduling
    def _inventory_signature(self) -> tuple[Any, ...]:
        return tuple((n.hostname, n.reachable, n.cordoned,
                      tuple((g.uuid, g.healthy, g.mig_current, tuple(d.uuid for d in g.mig_devices))
                            for g in n.gpus)) for n in self._inventory)

    def _schedule(self) -> None:
        now = self.clock()
        struct = (self._inventory_signature(), tuple(sorted(self._health_events.items())))
        view = self._view
        if view is not None and struct == self._struct_sig and self._gen == self._pass_gen \
                and now < self._next_decide:
            view.state.time = now
            return  # no transition, same inventory and health: nothing a pass could change
        quotas = bool(self._spec.quotas)
        if view is None or struct != self._struct_sig or self._quota_held or now >= self._next_decide:
            # From scratch (from the mirror): at start, when inventory or health changed, while a quota
            # holds jobs back (they are out of the view's queue until it lets them go), and once per
            # rescheduling period as a safety net.
            if struct != self._struct_sig:
                self._job_cache.clear()
            view = self._view = self._build_view(now)
            self._struct_sig = struct
        else:
            view.state.time = now
        gen = self._gen
        holding = list(self._holding.values())
        holdings = self._holdings(holding, view.pools, now)
        held = self._quota_hold(view, self._queued_records(), holdings, now) if quotas else {}
        for jid in held:
            view.state.dequeue(jid)
        self._quota_held = held
        # Health: jobs on an unhealthy GPU are stopped and requeued; the GPU gets no new work.
        for rec in holding if view.unhealthy else ():
            if rec.state is not JobState.RUNNING or rec.allocation is None:
                continue
            why = view.device_problem(rec.allocation)
            if why is None:
                continue
            try:
                cur = self.store.preempt(rec.id, f"gpu-unhealthy: {why}", policy="service:health")
            except (InvalidTransitionError, UnknownJobError):
                continue
            self._track(cur)
            self._stop_after_commit(cur.id)
        sig = (self._gen, struct, tuple(sorted(held.items())), id(self._sched))
        self._pass_gen = gen  # (this pass's own placements make the next tick look again, once)
        if sig == self._signature and now < self._next_decide:
            return
        if sig != self._signature:
            self._noted.clear()
        self._quota_blocked.clear()
        self._signature = sig
        self._next_decide = now + RESCHEDULE_S
        if not view.state.queue and not view.state.running:
            return
        self._decide(view, holdings, now)

    #: the served model's demand forecaster, fed with the submissions (None: no model forecaster).
    _forecast: LiveForecast | None = None

    def _publish_forecast(self, state: ClusterState, now: float) -> None:
        """Put the served model's demand forecast into ``state`` (see :mod:`rlsched.service.forecast`).

        Like the simulator, which publishes its forecaster's prediction before every decision
        point: a policy trained with a forecast must see one in service too. Never raises.
        """
        src = served_forecast(self._sched) if self._guard is not None else None
        if src is None:
            if self._forecast is not None:
                self._forecast = None
                state.demand_forecast, state.demand_forecast_horizon_s = {}, 0.0
            return
        try:
            live = self._forecast
            if live is None or live.source is not src:  # first pass with this model (or a reload)
                live = self._forecast = LiveForecast(src)
                live.observe(self.store.jobs(), since=now - FORECAST_WARMUP_S)
            live.observe(itertools.chain(self._queued.values(), self._holding.values()))
            live.publish(state, now)
        except Exception as exc:  # a forecast problem must not stop scheduling
            state.demand_forecast, state.demand_forecast_horizon_s = {}, 0.0
            self._loop_error("forecast", exc)

    def _decide(self, view: LiveView, holdings: list[Holding], now: float) -> None:
        state = view.state
        sched = self._sched
        if self._needs_reset:
            sched.reset(state)
            self._needs_reset = False
        self._publish_forecast(state, now)
        guard = self._guard
        applied = 0
        gen: Iterator[Decision] = iter(sched.decide(state))
        try:
            for _ in range(MAX_DECISIONS_PER_TICK):
                before = (guard.primary_decisions, guard.fallback_decisions) if guard is not None else (0, 0)
                t0 = time.perf_counter()
                try:
                    d = next(gen)
                except StopIteration:
                    break
                self.metrics.latency.observe(time.perf_counter() - t0)
                if guard is None:
                    self.metrics.decisions.labels(policy="fallback").inc()
                    source, version = self._policy.fallback, ""
                elif guard.primary_decisions > before[0]:
                    source, version = self._policy_label_primary(), guard.model_version
                else:
                    source, version = guard.fallback.name, ""
                if self._apply(view, d, holdings, source, version, now):
                    applied += 1
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()
            if guard is not None:
                self.metrics.sync_guard(guard)
        if applied:
            self._wake.set()

    def _policy_label_primary(self) -> str:
        primary = self._guard.primary if self._guard is not None else None
        return str(getattr(primary, "name", "") or self._policy.scheduler)

    def _note(self, kind: str, job: str | None, payload: dict[str, Any], reason: str, source: str,
              version: str) -> bool:
        """Record a decision that was not applied (once per state of the cluster); True if recorded now."""
        key = (kind, job or "", reason)
        if key in self._noted:
            return False
        self._noted.add(key)
        self.store.append_decision(kind, payload, applied=False, job=job, policy=source, model_version=version,
                                   reason=reason)
        return True

    def _apply(self, view: LiveView, d: Decision, holdings: list[Holding], source: str, version: str,
               now: float) -> bool:
        state = view.state
        summary = decision_summary(d)
        if isinstance(d, WakeAt):
            self._next_decide = min(self._next_decide, d.time)
            return False
        if isinstance(d, Scale):
            self._note(summary["kind"], None, summary, "not applied by the live service (rlsched plan/apply "
                       "changes pools)", source, version)
            return False
        why = illegal_reason(state, d)
        if why is not None:
            self.metrics.refused.labels(source="service").inc()
            if isinstance(d, Reconfigure):
                self._refuse_reconfigure(view, d, summary, f"illegal: {why}", source, version)
                return False
            self._note(summary["kind"], getattr(d, "job_id", None), summary, f"illegal: {why}", source, version)
            return False
        if isinstance(d, Reconfigure):
            return self._reconfigure(view, d, summary, source, version)
        if isinstance(d, Preempt):
            try:
                rec = self.store.preempt(d.job_id, d.reason or "priority", policy=source, model_version=version)
            except (InvalidTransitionError, UnknownJobError):
                return False
            self._track(rec)
            state.running.pop(d.job_id, None)
            self.store.append_decision("preempt", summary, applied=True, job=d.job_id, policy=source,
                                       model_version=version)
            self._stop_after_commit(d.job_id)
            return True
        assert isinstance(d, Place)
        allowed = view.allowed.get(d.job_id)
        if allowed is not None and d.placement.pool not in allowed:
            # The policy chose a pool the job may not use (its pool option, or a whole GPU for a MIG
            # request): the service takes the first legal place in an allowed pool instead, if any.
            run = state.queue[d.job_id]
            alt = next((c for name in sorted(allowed) if name in state.pools
                        for c in pool_candidates(state.pools[name], run.job, state.time, first=True)), None)
            if alt is None:
                self._note("place", d.job_id, summary, f"job may only run in pool(s) {', '.join(sorted(allowed))}",
                           source, version)
                return False
            d = Place(d.job_id, alt)
            source = f"{source}+service:allowed-pools"
        queued = self._queued.get(d.job_id)
        if queued is None:
            return False
        spec = view.pools[d.placement.pool]
        blocked = blocking(self._spec.quotas.values(), holdings, self._ask(queued, spec), now)
        if blocked is not None:
            self._quota_blocked[d.job_id] = blocked
            self._note("place", d.job_id, summary, blocked, source, version)
            return False
        return self._start(view, queued, d, holdings, source, version)

    # ------------------------------------------------------------------ MIG reconfiguration
    def _refuse_reconfigure(self, view: LiveView, d: Reconfigure, summary: dict[str, Any], reason: str,
                            source: str, version: str) -> None:
        """Record (once per cluster state) and audit a Reconfigure the service does not apply."""
        if not self._note(summary["kind"], None, summary, reason, source, version):
            return
        node = view.state.nodes.get(d.node_id)
        gpu = node.gpus[d.gpu_index] if node is not None and 0 <= d.gpu_index < len(node.gpus) else None
        uuid = getattr(gpu, "_uuid", None) if gpu is not None else None
        self.store.append_audit(AuditEvent.MIG_RECONFIGURATION, gpus=(uuid,) if uuid else (), policy=source,
                                model_version=version, reason=f"refused: {reason}",
                                extra={"applied": False, "node": d.node_id, "gpu_index": d.gpu_index,
                                       "new_layout": _counts(d.layout)})

    def _reconfigure(self, view: LiveView, d: Reconfigure, summary: dict[str, Any], source: str,
                     version: str) -> bool:
        """Apply a legal Reconfigure when it is safe (see the module doc); True if it was scheduled."""
        state = view.state
        node = state.nodes[d.node_id]  # (reconfigure_check accepted it: the node and the GPU exist)
        gpu = node.gpus[d.gpu_index]
        gpu_uuid = str(getattr(gpu, "_uuid", "") or "")
        info = next((g for n in self._inventory if n.hostname == d.node_id for g in n.gpus if g.uuid == gpu_uuid),
                    None)
        host = next((n for n in self._inventory if n.hostname == d.node_id), None)
        pool = view.pools.get(node.pool)
        why: str | None = None
        if info is None or host is None:
            why = f"GPU {d.node_id}/{d.gpu_index} is not in the backend's inventory"
        elif pool is None or pool.sharing is not Sharing.MIG:
            why = f"GPU {gpu_uuid} is not in a MIG pool"
        elif not host.reachable or host.cordoned:
            why = f"node {d.node_id} is {'cordoned' if host.cordoned else 'unreachable'}"
        elif not info.healthy or gpu_uuid in view.gpu_problems or gpu_uuid in self._health_events:
            why = f"GPU {gpu_uuid} is closed: {view.gpu_problems.get(gpu_uuid) or 'unhealthy'}"
        else:
            mine = {gpu_uuid, *(m.uuid for m in info.mig_devices)}
            for rec in self._holding.values():
                alloc = rec.allocation
                if alloc is None:
                    continue
                if mine.intersection(alloc.devices) or (alloc.node == d.node_id and info.index in alloc.gpu_indices
                                                        and alloc.slice_start is not None) \
                        or any(ref is not None and ref.gpu_uuid == gpu_uuid
                               for ref in map(view.devices.get, alloc.devices)):
                    why = f"GPU {gpu_uuid} is held by job {rec.id} ({rec.state.value})"
                    break
        if why is None and any(self._holding.get(j) is None for j in self._launching):
            why = "a job is being launched whose allocation is not known yet"
        if why is not None:
            self.metrics.refused.labels(source="service").inc()
            self._refuse_reconfigure(view, d, summary, why, source, version)
            return False
        assert info is not None
        old = info.layout_counts()
        new = _counts(d.layout)
        # Closed for the rest of this pass: its old instances are about to disappear.
        gpu.busy_until = math.inf
        host_name = d.node_id
        # The intent commits with this pass; the outcome after the re-split. A kill -9 between the two
        # leaves an intent without an outcome, which recover() closes from the backend's real layout.
        intent = os.urandom(6).hex()
        where = {"node": host_name, "gpu_index": info.index, "old_layout": old, "new_layout": new}
        self.store.append_audit(AuditEvent.MIG_RECONFIGURATION, gpus=(gpu_uuid,), policy=source,
                                model_version=version, reason="intent",
                                extra={"phase": MIG_INTENT, "intent": intent, **where})

        def apply() -> None:
            applied, error = True, ""
            try:
                self.backend.set_mig_layout(host_name, gpu_uuid, new)
            except BackendError as exc:  # GpuInUseError, ResetRequiredError, a failed create...
                applied, error = False, f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a backend bug must not stop the loop either
                applied, error = False, f"{type(exc).__name__}: {exc}"
            if error:
                _log.warning("MIG reconfiguration of GPU %s failed: %s", gpu_uuid, error)
            extra: dict[str, Any] = {"phase": MIG_DONE, "intent": intent, "applied": applied, **where}
            if error:
                extra["error"] = error
            reason = "policy" if applied else f"failed: {error}"
            try:
                with self.store.batch():
                    self.store.append_audit(AuditEvent.MIG_RECONFIGURATION, gpus=(gpu_uuid,), policy=source,
                                            model_version=version, reason=reason, extra=extra)
                    self.store.append_decision(summary["kind"], summary, applied=applied, policy=source,
                                               model_version=version, reason="" if applied else error)
            finally:
                # The next pass must see the new (or lost) instances: refresh now and rebuild the view.
                self._refresh_inventory()
                self._view = None
                self._signature = None
                self._wake.set()

        self._after_commit.append(apply)
        return True

    def _start(self, view: LiveView, rec: JobRecord, d: Place, holdings: list[Holding], source: str,
               version: str) -> bool:
        state = view.state
        alloc = view.allocation(d.placement)
        log_path = self.executor.log_dir / f"{rec.id}.log"
        try:
            started = self.store.mark_running(rec.id, alloc, None, None, str(log_path), policy=source,
                                              model_version=version)
        except (InvalidTransitionError, UnknownJobError):
            return False  # cancelled meanwhile
        run = state.dequeue(rec.id)
        profile = None
        if d.placement.slice_start is not None:
            node_id, gi = d.placement.gpus[0]
            gpu = state.nodes[node_id].gpus[gi]
            profile = next((s.profile.name for s in gpu.slices if s.start == d.placement.slice_start), None)
        state.allocate(run, d.placement, profile)
        run.state = RunState.RUNNING
        run.started_at = state.time
        state.running[rec.id] = run
        view.held[rec.id] = run
        self._track(started)
        h = self._holding_of(started, view.pools)
        if h is not None:
            holdings.append(h)
        self.store.append_decision("place", decision_summary(d), applied=True, job=rec.id, policy=source,
                                   model_version=version)
        # Its process starts only after this pass's transaction committed it as running (exactly
        # once), and outside the service lock (see tick / _launch).
        self._launching.add(rec.id)
        self._to_launch.append((started, alloc))
        return True

    def _update_metrics(self) -> None:
        self.metrics.set_jobs(self._counts())
        view = self._view
        if view is None:
            return
        summary = view.pool_summary()
        self._pool_summary = summary
        self.metrics.set_allocation({
            name: (p["gpus_total"], p["gpus_allocated"],
                   {prof: d["allocated"] for prof, d in p["mig_instances"].items()})
            for name, p in summary.items()})
        self.metrics.unhealthy_gpus.set(len(view.unhealthy))

    # ================================================================== API
    def submit(self, req: SubmitRequest) -> JobRecord:
        """Validate and queue a job; :class:`AdmissionError` says why one is refused."""
        try:
            rec = self._submit(req)
        except AdmissionError:
            self.metrics.submissions.labels(outcome="rejected").inc()
            raise
        self.metrics.submissions.labels(outcome="accepted").inc()
        self._wake.set()
        return rec

    def _submit(self, req: SubmitRequest) -> JobRecord:
        argv = req.argv
        if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
            raise AdmissionError("argv must be a non-empty list of strings (the program and its arguments)")
        if req.gpus is not None and req.mig is not None:
            raise AdmissionError("ask for either gpus or a mig profile, not both")
        gpus = 1 if req.gpus is None else req.gpus
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
            raise AdmissionError(f"gpus must be a whole number >= 1, not {req.gpus!r}")
        if not isinstance(req.user, str) or not req.user.strip():
            raise AdmissionError("user must be a non-empty string")
        if isinstance(req.priority, bool) or not isinstance(req.priority, int):
            raise AdmissionError(f"priority must be an integer, not {req.priority!r}")
        for name in ("cpus", "memory_gib", "estimated_duration_s"):
            v = getattr(req, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise AdmissionError(f"{name} must be a number >= 0, not {v!r}")
        now = self.clock()
        if req.deadline is not None and req.deadline <= now:
            raise AdmissionError("deadline is in the past (it is a unix time in seconds)")
        with self._lock:
            view = self._current_view()
            pools = view.pools
            if req.pool is not None and req.pool not in pools:
                raise AdmissionError(f"unknown pool {req.pool!r} (pools: {', '.join(pools) or 'none'})")
            candidates = [p for p in pools.values() if req.pool is None or p.name == req.pool]
            if req.mig is not None:
                candidates_all = candidates
                candidates = [p for p in candidates if p.sharing is Sharing.MIG] or candidates_all
                self._check_mig(req.mig, candidates, view)
            else:
                whole = [p for p in candidates if p.sharing is not Sharing.MIG]
                largest = max((p.gpus_per_node for p in whole), default=0)
                if whole and gpus > largest:
                    raise AdmissionError(f"asks for {gpus} GPUs; the largest node has {largest}")
            options = {k: v for k, v in (("cpus", req.cpus), ("memory_gib", req.memory_gib), ("pool", req.pool),
                                         ("estimated_duration_s", req.estimated_duration_s), ("cwd", req.cwd))
                       if v is not None}
            probe = JobRecord(id="j-new", seq=0, argv=tuple(argv), num_gpus=gpus, gpu_milli=1000,
                              mig_profile=req.mig, gpu_models=(), priority=req.priority, user=req.user,
                              preemptible=req.preemptible, deadline=req.deadline, state=JobState.QUEUED, attempts=0,
                              exit_code=None, submitted_at=now, started_at=None, finished_at=None, allocation=None,
                              pid=None, pid_start=None, log_path=None, cancel_requested=False, reason="",
                              idempotency_key=None, options=options)
            if req.mig is not None:
                from rlsched.runtime.store import _milli_of_profile

                probe = dataclasses.replace(probe, gpu_milli=_milli_of_profile(req.mig))
            job = job_of(probe, pools)
            fitting = [p for p in candidates if fits_pool_spec(job, p)]
            if not fitting:
                raise AdmissionError("no pool can ever run it: " + unschedulable_reason(job, candidates))
            if req.mig is None:
                fitting = self._whole_gpu_pools(job, fitting, view)
            why = admission_problem(self._spec.quotas.values(), [self._ask(probe, p) for p in fitting])
            if why is not None:
                raise AdmissionError(why, kind="quota")
        return self._commit_submission(dict(argv=argv, gpus=gpus, mig_profile=req.mig, priority=req.priority,
                                            user=req.user, preemptible=req.preemptible, deadline=req.deadline,
                                            idempotency_key=req.idempotency_key, options=options))

    # ------------------------------------------------------------------ group commit
    def _commit_submission(self, kwargs: dict[str, Any]) -> JobRecord:
        """Queue one validated submission, group-committed with whatever other API threads submit
        meanwhile; returns only once the job is durable (the transaction that holds it committed).

        The first waiting thread leads: it takes every pending submission, commits them in one
        transaction (one fsync), folds the new jobs into the mirror and wakes the others; those
        that arrived during its commit form the next group.
        """
        mine = _PendingSubmit(kwargs)
        with self._group:
            self._group_pending.append(mine)
            while self._group_busy and not mine.done:
                self._group.wait()
            if not mine.done:
                self._group_busy = True
                group, self._group_pending = self._group_pending, []
            else:
                group = []
        if group:
            try:
                self._commit_group(group)
            finally:
                with self._group:
                    for p in group:
                        if p.record is None and p.error is None:
                            p.error = ServiceError("the submission was not recorded")
                        p.done = True
                    self._group_busy = False
                    self._group.notify_all()
        if mine.error is not None:
            raise mine.error
        assert mine.record is not None
        return mine.record

    def _commit_group(self, group: list[_PendingSubmit]) -> None:
        made: list[tuple[_PendingSubmit, JobRecord, bool]] = []
        try:
            with self.store.batch():
                for p in group:
                    try:
                        rec, new = self.store.submit_record(**p.kwargs)
                    except IdempotencyConflictError as exc:
                        p.error = AdmissionError(str(exc), kind="conflict")
                    except StoreError as exc:
                        p.error = AdmissionError(str(exc))
                    else:
                        made.append((p, rec, new))
        except Exception as exc:  # the commit failed: none of the group is durable, none is acknowledged
            _log.exception("could not commit %d submission(s)", len(group))
            for p in group:
                if p.error is None:
                    p.error = ServiceError(f"the submission could not be recorded: {exc}")
            return
        with self._lock:
            for p, rec, new in made:
                if new and rec.id in self._tombstones:
                    self._tombstones.discard(rec.id)  # cancelled before it got here
                elif new:
                    self._track(rec)
                else:  # an idempotent retry: the job as it is now
                    rec = self._queued.get(rec.id) or self._holding.get(rec.id) or self.store.get(rec.id) or rec
                p.record = rec

    def _mig_instances(self, pool: PoolSpec, view: LiveView) -> set[str]:
        """MIG profiles a pool has now or declares in its layout."""
        present = {s.profile.name for n in view.state.pools[pool.name].nodes.values() for g in n.gpus
                   for s in g.slices}
        return present | set(pool.mig_layout)

    def _whole_gpu_pools(self, job: Job, fitting: list[PoolSpec], view: LiveView) -> list[PoolSpec]:
        """The pools of ``fitting`` that can hold a whole-GPU request as their GPUs are split.

        Feasibility lets a MIG pool hold a whole GPU as a 7g instance, layouts being free to change in the
        simulator; here layouts are the spec's and only a served model re-splits a GPU, so under a heuristic
        a MIG pool without that instance would keep the job queued forever: it is refused at submit instead.
        """
        if self._policy.scheduler == "rl" and not self.config.fallback_only:
            return fitting
        ok: list[PoolSpec] = []
        missing: list[str] = []
        for p in fitting:
            if p.sharing is not Sharing.MIG:
                ok.append(p)
                continue
            prof = profile_for(p.model, job.num_gpus, job.gpu_milli)
            have = self._mig_instances(p, view)
            if prof is not None and prof.name in have:
                ok.append(p)
            else:
                missing.append(f"pool {p.name} is split into MIG instances ({', '.join(sorted(have)) or 'none'}) "
                               f"and has no {prof.name if prof else 'whole-GPU'} instance")
        if not ok:
            raise AdmissionError(f"no pool can ever run it: a whole GPU was asked for, but {'; '.join(missing)}; "
                                 "ask for a MIG instance with --mig PROFILE, or for a pool with whole GPUs")
        return ok

    def _check_mig(self, profile: str, candidates: list[PoolSpec], view: LiveView) -> None:
        mig_pools = [p for p in candidates if p.sharing is Sharing.MIG]
        if not mig_pools:
            where = f"pool {candidates[0].name} does" if len(candidates) == 1 else "no pool"
            raise AdmissionError(f"MIG profile {profile} asked for, but {where} not use MIG".replace(
                "no pool not use", "no pool uses"))
        known = sorted({pr.name for p in mig_pools for pr in p.model.mig_profiles})
        if profile not in known:
            raise AdmissionError(f"unknown MIG profile {profile!r} for this fleet (profiles: {', '.join(known)})")
        from rlsched.runtime.store import _milli_of_profile

        try:
            milli = _milli_of_profile(profile)
        except StoreError as exc:
            raise AdmissionError(str(exc)) from None
        served = {p.name: profile_for(p.model, 1, milli) for p in mig_pools}
        if not any(s is not None and s.name == profile for s in served.values()):
            other = next((s.name for s in served.values() if s is not None), "none")
            raise AdmissionError(f"MIG profile {profile} cannot be requested: a request of its compute size gets "
                                 f"the smallest such profile ({other})")
        present = {s.profile.name for p in mig_pools for n in view.state.pools[p.name].nodes.values()
                   for g in n.gpus for s in g.slices}
        declared = {name for p in mig_pools for name in p.mig_layout}
        if profile not in present | declared:
            raise AdmissionError(f"no GPU in the fleet has a {profile} MIG instance (instances: "
                                 f"{', '.join(sorted(present | declared)) or 'none'})")

    def cancel(self, job_id: str) -> JobState:
        """Cancel a job: a queued one at once; a running one gets SIGTERM, then SIGKILL after ``grace_s``.

        Returns the job's state afterwards (``running``/``preempted`` while its process stops).

        Raises:
            UnknownJobError: no such job.
        """
        with self._lock:
            known = job_id in self._queued or job_id in self._holding
            before = None if known else self.store.get(job_id)
            state = self.store.cancel(job_id)
            rec = self.store.get(job_id)
            if rec is not None and known:
                self._track(rec)
            elif rec is not None and before is not None and before.state is JobState.QUEUED:
                # Committed by a submission group that has not folded it into the mirror yet.
                self._tombstones.add(job_id)
                self._finished[state.value] = self._finished.get(state.value, 0) + 1
            if state.holds_gpus and rec is not None:
                h = self._handle(rec)
                if h is not None:
                    self._ensure_stopping(rec, h)
            self._wake.set()
            return state

    def _positions(self) -> dict[str, int]:
        """Job id -> 1-based place in the queue (priority, then submission), computed once per mirror change."""
        cached = self._positions_cache
        if cached is not None and cached[0] == self._gen:
            return cached[1]
        order = sorted(self._queued.values(), key=lambda r: (-r.priority, r.seq))
        positions = {r.id: i for i, r in enumerate(order, 1)}
        self._positions_cache = (self._gen, positions)
        return positions

    def _reason(self, rec: JobRecord) -> str:
        if rec.id in self._quota_held:
            return self._quota_held[rec.id]
        if rec.id in self._quota_blocked:
            return self._quota_blocked[rec.id]
        view = self._view
        if view is None:
            return "waiting for the scheduler's first pass"
        run = view.state.queue.get(rec.id)
        if run is None:
            return "waiting for the next scheduling pass"
        why = view.why_pending(run.job)
        if rec.reason and why.startswith("policy holds it"):
            return f"{why}; last requeued: {rec.reason}"
        return why

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
                "gpu_indices": list(alloc.gpu_indices), "slice_start": alloc.slice_start},
            "devices": list(alloc.devices) if alloc is not None else [],
            "exit_code": rec.exit_code,
            "submitted_at": rec.submitted_at,
            "started_at": rec.started_at,
            "finished_at": rec.finished_at,
            "attempts": rec.attempts,
            "pid": rec.pid,
            "log_path": rec.log_path or str(self.executor.log_dir / f"{rec.id}.log"),
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
            with self._lock:
                self._explain([(rec, out)])
        return out

    def _explain(self, pairs: list[tuple[JobRecord, dict[str, Any]]]) -> None:
        """Add the live view's issue of held jobs and the reason and position of queued ones (under the lock)."""
        positions: dict[str, int] | None = None
        for rec, out in pairs:
            if rec.state.holds_gpus:
                issue = self._view.job_issues.get(rec.id) if self._view is not None else None
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
            with self._lock:
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
        return Path(rec.log_path) if rec.log_path else self.executor.log_dir / f"{rec.id}.log"

    def audit(self, since: int | None = None, job: str | None = None, limit: int | None = None) -> list[AuditRecord]:
        """Audit records in id order (``since``: id cursor, exclusive)."""
        return self.store.audit(since, job=job, limit=limit)

    def reload(self, spec_paths: list[Path] | None = None, *, policy: str | None = None) -> dict[str, Any]:
        """Re-read the spec and hot-swap policy and pools; queued and running jobs are kept.

        Raises:
            SpecError: the new spec does not load (the old configuration stays).
            ServiceError: the policy block does not exist (the old configuration stays).
        """
        with self._reload_lock:
            # Loading a spec is bounded (rlsched/spec/limits.py) but can take seconds for a large one: it
            # happens before the scheduling lock is taken, so the loop and submissions go on meanwhile.
            paths = [Path(p) for p in spec_paths] if spec_paths else list(self.config.spec_paths)
            spec, decl = self._load_spec(paths, policy if policy is not None else self.config.policy)
            return self._swap(spec, decl, paths, policy)

    def _swap(self, spec: Spec, decl: PolicyDecl, paths: list[Path], policy: str | None) -> dict[str, Any]:
        """Install a loaded spec and policy under the scheduling lock (the second half of :meth:`reload`)."""
        with self._lock:
            previous = self._policy_label()
            sched, guard = self._build_scheduler(decl)
            kept = ""
            old_guard = self._guard
            if guard is not None and old_guard is not None and decl.scheduler == "rl" \
                    and guard.keep_serving(old_guard):
                # The new model did not load (registry down, file missing...): the working one stays.
                kept = old_guard.model_version or str(old_guard.primary and old_guard.primary.name)
                _log.warning("reload: model %s could not be loaded; still serving %s", decl.model, kept)
            self._spec, self._policy, self._sched, self._guard = spec, decl, sched, guard
            self.config.spec_paths = paths
            if policy is not None:
                self.config.policy = policy
            self._needs_reset = True
            self._signature = None
            self._view = None
            self._pool_summary = None
            self._struct_sig = None
            self._job_cache = {}
            self.metrics.reset_guard_mirror()
            try:
                self.store.append_audit(AuditEvent.POLICY_SWITCH, policy=self._policy_label(),
                                        model_version=guard.model_version if guard is not None else "",
                                        reason="reload",
                                        extra={"previous": previous, "policy_block": decl.name,
                                               "pools": sorted(spec.pools), "spec": [str(p) for p in paths],
                                               **({"kept_model": kept, "not_loaded": decl.model or ""}
                                                  if kept else {})})
            except Exception:
                self.metrics.audit_errors.inc()
                _log.exception("could not audit the reload")
            self._wake.set()
            out = self.info()
            if kept:
                out["warning"] = (f"model {decl.model} could not be loaded (see the audit's fallback record); "
                                  f"still serving the previous model {kept}")
            return out

    def info(self) -> dict[str, Any]:
        """Policy, model version, mode, breaker, pools (GPUs total/free), queue length, running count."""
        with self._lock:
            counts = self._counts()
            guard = self._guard
            # the last pass's summary: /v1/info never builds a view (a pass does, and one follows any change)
            view: LiveView | None
            if self._pool_summary is not None:
                view, pools = self._view, self._pool_summary
            else:
                view = self._current_view()
                pools = view.pool_summary()
            return {
                "policy": self._policy.name,
                "scheduler": self._policy.scheduler,
                "fallback": self._policy.fallback,
                "model": self._policy.model,
                "model_version": guard.model_version if guard is not None else "",
                "primary_available": guard.primary_available if guard is not None else False,
                "mode": self.mode,
                "breaker": guard.breaker_state.value if guard is not None else "n/a",
                "fallbacks_by_reason": dict(guard.fallbacks_by_reason) if guard is not None else {},
                "pools": pools,
                "queue_length": counts.get("queued", 0),
                "running": counts.get("running", 0) + counts.get("preempted", 0),
                "jobs": counts,
                "unhealthy_gpus": dict(view.unhealthy) if view is not None else {},
                "gpu_problems": dict(view.gpu_problems) if view is not None else {},
                "backend": getattr(self.backend, "name", ""),
                "state_dir": str(self.config.state_dir),
                "spec": [str(p) for p in self.config.spec_paths],
                "loop_running": self.running_loop,
                "last_tick": self._last_tick,
                "recovered": dict(self.recovered),
            }

