"""Job processes: launching them, watching them end, stopping them, and re-adopting them after a restart.

:class:`Supervisor` owns the process side of the jobs that hold GPUs: the handles of live processes,
the stops in progress (SIGTERM, then SIGKILL after ``grace_s``) and the launches in flight. A placement
is committed as running BEFORE its process is launched (exactly-once: a crash in between leaves a
running job without a pid, which recovery resolves by finding the wrapper process or requeueing - never
by launching twice); launches run after the scheduling lock is released, so submissions and status calls
do not wait on fork/exec, and their pids are recorded in one transaction.

A finished process finishes its job (done / failed / cancelled); a preempted one that stopped goes back
to the queue; one gone without an exit status is requeued. Nothing lives only in memory: job processes
run in their own sessions and survive the service, and :meth:`Supervisor.recover_jobs` (after a restart,
even a ``kill -9``) re-adopts live processes (pid + start time), records exits that happened while the
service was down (exit files written by the wrapper) and requeues jobs whose process vanished without one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.backend import BackendError
from rlsched.runtime.executor import EXIT_LOST, EXIT_NODE_LOST, EXIT_NOT_EXECUTABLE, Launched
from rlsched.runtime.job_executor import JobExecutor
from rlsched.runtime.store import Allocation, InvalidTransitionError, JobRecord, JobState, StoreError, UnknownJobError
from rlsched.service.context import LOG, ServiceContext
from rlsched.service.mirror import JobMirror

#: Remote launches of one pass sent at once, at most (an executor whose jobs span nodes).
LAUNCH_THREADS = 8


def exit_reason(rc: int) -> str:
    """A process's exit status in words ("" for success)."""
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


class Supervisor:
    """The processes of the jobs holding GPUs (see the module doc)."""

    def __init__(self, ctx: ServiceContext, executor: JobExecutor, mirror: JobMirror) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.executor = executor
        self.mirror = mirror
        self._handles: dict[str, Launched] = {}
        #: job id -> monotonic time after which SIGKILL follows the SIGTERM already sent.
        self._stopping: dict[str, float] = {}
        self._killed: set[str] = set()
        #: jobs committed as running whose process is being started (outside the lock).
        self.launching: set[str] = set()
        self._to_launch: list[tuple[JobRecord, Allocation]] = []
        #: what the last recovery did (``adopted``, ``finished``, ``requeued``; ``mig_intents`` is the
        #: MIG reconfiguration's)
        self.recovered: dict[str, int] = {"adopted": 0, "finished": 0, "requeued": 0, "mig_intents": 0}
        self._recovering = False
        #: called with each job that finished done, once the transaction recording it committed (exactly
        #: once per finish; installed by the service: the duration estimator learns from it)
        self.on_done: Callable[[JobRecord], None] = lambda rec: None

    # ------------------------------------------------------------------ routing
    def _on(self, rec: JobRecord) -> JobExecutor:
        """The executor of the node ``rec`` runs on (the only one for a one-machine service)."""
        return self.executor.on(rec.allocation.node if rec.allocation is not None else "")

    def _settle_with_record(self, rec: JobRecord, rc: int | None) -> None:
        """Settle ``rec`` with the exit status its wrapper recorded, else ``rc`` - unless its node did not
        answer the question: then nothing is settled and the next pass asks again. Settling without the
        record would requeue a job that may have finished, and run it twice; a node that stays silent has
        its jobs settled as lost by the executor's polls instead."""
        try:
            recorded = self._on(rec).recorded_exit(rec.id)
        except BackendError as exc:
            LOG.info("job %s: its exit record could not be read (%s); asked again next pass", rec.id, exc)
            return
        self._settle(rec, recorded if recorded is not None else rc)

    def handle(self, rec: JobRecord) -> Launched | None:
        """The live process of a running/preempted job, adopting it after a restart; None if it is gone
        (or not started yet: a job this service is launching right now)."""
        h = self._handles.get(rec.id)
        if h is not None and (rec.pid is None or h.pid == rec.pid):
            return h
        if rec.id in self.launching:
            return None
        # the devices it holds: where its job spans nodes, the executor checks every node's rank is there
        devices = rec.allocation.devices if rec.allocation is not None else ()
        if rec.pid is not None and rec.pid_start is not None:
            h = self._on(rec).adopt(rec.pid, rec.pid_start, None, rec.id, rec.log_path, devices=devices)
        else:
            h = self._on(rec).find(rec.id, devices=devices)
            if h is not None and h.unconfirmed:
                # its node is silent: whether the launch started there is not known yet, so the job waits
                # (polls say when the node is lost); the handle is asked for afresh each pass, never kept
                return h
            if h is not None:
                with contextlib.suppress(StoreError):
                    self.store.set_process(rec.id, h.pid, h.start_time, str(h.log_path))
                    cur = self.mirror.holding.get(rec.id)
                    if cur is not None:
                        self.mirror.track(dataclasses.replace(cur, pid=h.pid, pid_start=h.start_time,
                                                              log_path=str(h.log_path)))
        if h is not None:
            self._handles[rec.id] = h
        return h

    def ensure_stopping(self, rec: JobRecord, h: Launched) -> None:
        """SIGTERM once; SIGKILL after ``grace_s`` (never blocks). A handle without a pid (a job on a silent
        node whose launch is unconfirmed) has nothing to signal yet: the grace starts once it is found."""
        if h.unconfirmed:
            return
        now = time.monotonic()
        deadline = self._stopping.get(rec.id)
        if deadline is None:
            self.executor.send_signal(h, signal.SIGTERM)
            self._stopping[rec.id] = now + self.ctx.config.grace_s
        elif now >= deadline and rec.id not in self._killed:
            self.executor.send_signal(h, signal.SIGKILL)
            self._killed.add(rec.id)

    def stop_job(self, rec: JobRecord) -> None:
        """Stop a job's process if it has one (a cancel of a running job)."""
        h = self.handle(rec)
        if h is not None:
            self.ensure_stopping(rec, h)

    def stop_after_commit(self, job_id: str) -> None:
        """SIGTERM a job (preempted, or on an unhealthy GPU) once its new state is committed."""

        def stop() -> None:
            rec = self.mirror.holding.get(job_id)
            if rec is not None:
                self.stop_job(rec)

        self.ctx.after_commit(stop)

    def _settle(self, rec: JobRecord, rc: int | None) -> None:
        """Record the end of a job's process (``rc`` None: gone without an exit status).

        Called inside a batch: its exit files are consumed only once the batch committed.
        """
        node = rec.allocation.node if rec.allocation is not None else ""
        if rec.state is JobState.PREEMPTED and not rec.cancel_requested:
            cur = self.store.requeue(rec.id, rec.reason or "preempted")
            self._count_recovery("requeued")
        elif rc == EXIT_NODE_LOST:
            # Its node stopped answering: a preemptible job resumes elsewhere from its last checkpoint, any
            # other is recorded as lost (running it again could repeat side effects). Either way exactly
            # once: this transition is the only one, and the process is fenced if the node comes back.
            # A gang is lost with any of its nodes, which the executor names when it is not the leader's.
            node = self._on(rec).lost_node(rec.id) or node
            why = f"node {node} lost (stopped answering)"
            if rec.preemptible or rec.cancel_requested:
                cur = self.store.requeue(rec.id, why)
                self._count_recovery("requeued")
            else:
                cur = self.store.mark_finished(rec.id, EXIT_NODE_LOST, f"lost: {why}")
                self._count_recovery("finished")
            self.store.append_audit(AuditEvent.NODE, job=rec.id, gpus=rec.allocation.devices if rec.allocation else (),
                                    reason="node-lost", extra={"node": node, "state": cur.state.value})
        elif rc is None or rc == EXIT_LOST:
            # Gone without an exit status (the wrapper was killed, or died with the machine): run it again
            # (or, if a cancel was pending, it ends cancelled).
            cur = self.store.requeue(rec.id, "process vanished without an exit status")
            self._count_recovery("requeued")
        else:
            cur = self.store.mark_finished(rec.id, rc, exit_reason(rc))
            self._count_recovery("finished")
        self.mirror.track(cur)
        if cur.state is JobState.DONE:
            self.ctx.after_commit(lambda: self.on_done(cur))
        job_id = rec.id
        h = self._handles.pop(rec.id, None)
        known = h.exit_file if h is not None and h.exit_file.name.endswith(".exit.json") else None
        where = self._on(rec)

        def consume() -> None:
            with contextlib.suppress(Exception):  # a node gone meanwhile: its exit records stay, unread
                where.consume_exits(job_id, known)

        self.ctx.after_commit(consume)
        self._stopping.pop(rec.id, None)
        self._killed.discard(rec.id)

    def _count_recovery(self, what: str) -> None:
        if self._recovering:
            self.recovered[what] += 1

    def fence_strays(self) -> None:
        """Kill job processes found on a node that came back (or on a fresh agent) which this service no
        longer runs there: jobs requeued or recorded as lost while the node was away must not run twice."""
        notices = getattr(self.executor, "notices", None)
        for notice in notices() if callable(notices) else ():
            extra = dict(notice)
            reason, job = str(extra.pop("reason", "notice")), extra.pop("job", None)
            LOG.warning("fleet: %s%s %s", reason, f" job {job}" if job else "", extra)
            self.store.append_audit(AuditEvent.NODE, job=job, reason=reason, extra=extra)
        for node, job_id, pid in self.executor.strays():
            rec = self.mirror.holding.get(job_id)
            if job_id in self.launching or (rec is not None and rec.allocation is not None
                                             and rec.allocation.node == node and rec.pid in (None, pid)):
                continue  # still ours: recovery or the next poll adopts it
            LOG.warning("fencing job %s (pid %d) on node %s: the service no longer runs it there", job_id, pid, node)
            try:
                self.executor.fence(node, job_id, pid)
            except Exception as exc:
                self.ctx.loop_error("fence", exc)
                continue
            self.store.append_audit(AuditEvent.NODE, job=job_id, reason="fenced",
                                    extra={"node": node, "pid": pid})

    def poll(self) -> None:
        """Settle the jobs whose process ended; push on the stops in progress (a loop stage, in a batch)."""
        self.fence_strays()
        for rec in list(self.mirror.holding.values()):
            if rec.id in self.launching:
                continue
            try:
                h = self.handle(rec)
                if h is None:
                    self._settle_with_record(rec, None)
                    continue
                rc = self.executor.poll(h)
                if rc is None:
                    if rec.cancel_requested or rec.state is JobState.PREEMPTED:
                        self.ensure_stopping(rec, h)
                    continue
                if rc == EXIT_LOST:
                    self._settle_with_record(rec, rc)
                else:
                    self._settle(rec, rc)
            except (InvalidTransitionError, UnknownJobError):
                continue  # changed under us (a cancel); the next iteration sees the new state

    def recover_jobs(self) -> None:
        """Adopt, settle or requeue every job the store shows holding GPUs (in a batch, after a restart)."""
        self._recovering = True
        try:
            for rec in list(self.mirror.holding.values()):
                try:
                    h = self.handle(rec)
                    rc = self.executor.poll(h) if h is not None else None
                    if h is not None and rc is None:
                        self.recovered["adopted"] += 1
                        LOG.info("adopted job %s (%s)", rec.id,
                                 "pid unknown: its node is silent" if h.unconfirmed else f"pid {h.pid}")
                        if rec.state is JobState.PREEMPTED or rec.cancel_requested:
                            self.ensure_stopping(rec, h)
                        continue
                    if rc is None or rc == EXIT_LOST:
                        self._settle_with_record(rec, rc)
                    else:
                        self._settle(rec, rc)
                except (InvalidTransitionError, UnknownJobError):
                    continue
        finally:
            self._recovering = False

    # ------------------------------------------------------------------ launches
    def queue_launch(self, rec: JobRecord, alloc: Allocation) -> None:
        """Launch ``rec``'s process after this pass committed it as running (see :meth:`launch`)."""
        self.launching.add(rec.id)
        self._to_launch.append((rec, alloc))

    def take_launches(self) -> list[tuple[JobRecord, Allocation]]:
        """The launches the last pass queued (handed over once)."""
        launches, self._to_launch = self._to_launch, []
        return launches

    def forget_launches(self) -> None:
        """Drop the launches of a pass whose transaction failed (nothing of it was committed)."""
        self._to_launch = []
        self.launching.clear()

    def _launch_one(self, rec: JobRecord, alloc: Allocation) -> tuple[JobRecord, Launched | None, Exception | None]:
        """Start one job's process on its node; its handle, or the exception that stopped it."""
        cwd = (rec.options or {}).get("cwd")
        try:
            launched = self.executor.on(alloc.node).launch(
                rec.id, list(rec.argv), alloc.devices,
                env_extra={"RLSCHED_JOB_ID": rec.id, "RLSCHED_ATTEMPT": str(rec.attempts)}, cwd=cwd or None)
        except Exception as exc:
            LOG.warning("launch of job %s failed: %s", rec.id, exc)
            return rec, None, exc
        return rec, launched, None

    def launch(self, launches: list[tuple[JobRecord, Allocation]]) -> None:
        """Start the processes of jobs the last pass committed as running, WITHOUT the service lock
        (fork/exec of each wrapper), then record their pids in one transaction."""
        if getattr(self.executor, "spans_nodes", False) and len(launches) > 1:
            # remote launches wait on their node's agent: send them together, not one after another
            with ThreadPoolExecutor(min(LAUNCH_THREADS, len(launches)), thread_name_prefix="rlsched-launch") as pool:
                results = list(pool.map(lambda job: self._launch_one(*job), launches))
        else:
            results = [self._launch_one(rec, alloc) for rec, alloc in launches]

        def record() -> None:
            for rec, launched, exc in results:
                self.launching.discard(rec.id)
                try:
                    if launched is None:
                        self.mirror.track(self.store.mark_finished(rec.id, EXIT_NOT_EXECUTABLE,
                                                                   f"launch failed: {exc}"))
                        continue
                    if launched.unconfirmed:
                        # sent to a node that has not answered yet: the job stays running without a pid, and
                        # :meth:`handle` asks the executor each pass until the launch is answered or its node lost
                        continue
                    self._handles[rec.id] = launched
                    self.store.set_process(rec.id, launched.pid, launched.start_time, str(launched.log_path))
                except (InvalidTransitionError, UnknownJobError):
                    continue
                cur = self.mirror.holding.get(rec.id)
                if cur is not None:
                    self.mirror.track(dataclasses.replace(cur, pid=launched.pid, pid_start=launched.start_time,
                                                          log_path=str(launched.log_path)))

        with self.ctx.lock:
            try:
                self.ctx.batch(record)
            except Exception as exc:
                self.ctx.loop_error("launch", exc)
        self.ctx.wake.set()  # poll them soon: short jobs end within a tick
