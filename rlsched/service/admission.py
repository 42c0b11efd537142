"""Admission: validating and queueing submissions (group-committed), and cancelling jobs.

A :class:`~rlsched.runtime.job_request.JobRequest` is checked against the live pools (a pool that exists, a
MIG profile some GPU has, a request some pool can ever run) and the quotas (a request that can never fit
one is refused). Concurrent submissions are group-committed: each API thread validates its request, then
the first waiting thread commits every pending submission in one transaction; each is acknowledged only
after that commit, and only then folded into the job mirror. A cancel of a queued job that a submission
group has not folded in yet leaves a tombstone, so the group does not bring it back.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

from rlsched.cluster.feasibility import fits_pool_spec, profile_for, unschedulable_reason
from rlsched.cluster.job import Job
from rlsched.cluster.model import PoolSpec, Sharing
from rlsched.errors import RlschedError
from rlsched.runtime.job_request import JobRequest
from rlsched.runtime.store import IdempotencyConflictError, JobRecord, JobState, StoreError
from rlsched.service.context import LOG, ServiceContext
from rlsched.service.mirror import JobMirror
from rlsched.service.quotas import admission_problem, ask_of
from rlsched.service.scheduling import SchedulingPass
from rlsched.service.served_policy import ServedPolicy, ServiceError
from rlsched.service.supervision import Supervisor
from rlsched.service.view import LiveView, job_of


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
class _PendingSubmit:
    """One API thread's submission waiting for a group commit."""

    request: JobRequest
    record: JobRecord | None = None
    error: Exception | None = None
    done: bool = False


class Admission:
    """Submissions and cancels (see the module doc).

    Args:
        ctx: the service's shared parts.
        policy: the served policy (its spec's quotas; whether a model may re-split GPUs).
        mirror: where committed jobs are folded in.
        scheduling: the live view requests are checked against.
        supervisor: stops a cancelled job's process.
    """

    def __init__(self, ctx: ServiceContext, policy: ServedPolicy, mirror: JobMirror, scheduling: SchedulingPass,
                 supervisor: Supervisor) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.policy = policy
        self.mirror = mirror
        self.scheduling = scheduling
        self.supervisor = supervisor
        #: queued jobs cancelled before their submission group folded them into the mirror.
        self._tombstones: set[str] = set()
        self._group = threading.Condition()
        self._group_pending: list[_PendingSubmit] = []
        self._group_busy = False

    def submit(self, req: JobRequest) -> JobRecord:
        """Validate and queue a job; :class:`AdmissionError` says why one is refused."""
        metrics = self.ctx.metrics
        try:
            rec = self._commit_submission(self._validate(req))
        except AdmissionError:
            metrics.submissions.labels(outcome="rejected").inc()
            raise
        metrics.submissions.labels(outcome="accepted").inc()
        self.ctx.wake.set()
        return rec

    def _validate(self, req: JobRequest) -> JobRequest:
        """``req`` checked against the live pools and the quotas, with its GPU count settled."""
        argv = req.argv
        if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
            raise AdmissionError("argv must be a non-empty list of strings (the program and its arguments)")
        if req.gpus is not None and req.mig is not None:
            raise AdmissionError("ask for either gpus or a mig profile, not both")
        if req.gpu_milli != 1000 or req.gpu_models:
            raise AdmissionError("the service takes whole GPUs or a MIG instance (no gpu_milli, no gpu_models)")
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
        now = self.ctx.clock()
        if req.deadline is not None and req.deadline <= now:
            raise AdmissionError("deadline is in the past (it is a unix time in seconds)")
        with self.ctx.lock:
            view = self.scheduling.current_view()
            pools = view.pools
            if req.pool is not None and req.pool not in pools:
                raise AdmissionError(f"unknown pool {req.pool!r} (pools: {', '.join(pools) or 'none'})")
            candidates = [p for p in pools.values() if req.pool is None or p.name == req.pool]
            if req.mig is not None:
                candidates_all = candidates
                candidates = [p for p in candidates if p.sharing is Sharing.MIG] or candidates_all
                self._check_mig(req.mig, candidates, view)
            else:
                self._check_size(gpus, [p for p in candidates if p.sharing is not Sharing.MIG])
            probe = JobRecord(id="j-new", seq=0, argv=tuple(argv), num_gpus=gpus, gpu_milli=1000,
                              mig_profile=req.mig, gpu_models=(), priority=req.priority, user=req.user,
                              preemptible=req.preemptible, deadline=req.deadline, state=JobState.QUEUED, attempts=0,
                              exit_code=None, submitted_at=now, started_at=None, finished_at=None, allocation=None,
                              pid=None, pid_start=None, log_path=None, cancel_requested=False, reason="",
                              idempotency_key=None, options=req.options())
            if req.mig is not None:
                from rlsched.runtime.store import _milli_of_profile

                probe = dataclasses.replace(probe, gpu_milli=_milli_of_profile(req.mig))
            job = job_of(probe, pools)
            fitting = [p for p in candidates if fits_pool_spec(job, p)]
            if not fitting:
                raise AdmissionError("no pool can ever run it: " + unschedulable_reason(job, candidates))
            if req.mig is None:
                fitting = self._whole_gpu_pools(job, fitting, view)
            why = admission_problem(self.policy.spec.quotas.values(), [ask_of(probe, p) for p in fitting])
            if why is not None:
                raise AdmissionError(why, kind="quota")
        return dataclasses.replace(req, gpus=gpus)

    def _check_size(self, gpus: int, whole: list[Any]) -> None:
        """Refuse a job larger than any node - or, where the executor runs a job across nodes (a gang on a
        Ray fleet), larger than any pool."""
        if not whole:
            return
        if getattr(self.supervisor.executor, "spans_nodes", False):
            largest = max(p.gpus_per_node * p.max_nodes for p in whole)
            if gpus > largest:
                raise AdmissionError(f"asks for {gpus} GPUs; the largest pool has {largest}")
            return
        largest = max(p.gpus_per_node for p in whole)
        if gpus > largest:
            raise AdmissionError(f"asks for {gpus} GPUs; the largest node has {largest} (a job runs on one "
                                 "machine here; a ray: backend runs multi-node gangs)")

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

    @staticmethod
    def _mig_instances(pool: PoolSpec, view: LiveView) -> set[str]:
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
        if self.policy.serves_model():
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

    # ------------------------------------------------------------------ group commit
    def _commit_submission(self, req: JobRequest) -> JobRecord:
        """Queue one validated submission, group-committed with whatever other API threads submit
        meanwhile; returns only once the job is durable (the transaction that holds it committed).

        The first waiting thread leads: it takes every pending submission, commits them in one
        transaction (one fsync), folds the new jobs into the mirror and wakes the others; those
        that arrived during its commit form the next group.
        """
        mine = _PendingSubmit(req)
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
                        rec, new = self.store.submit_record(p.request)
                    except IdempotencyConflictError as exc:
                        p.error = AdmissionError(str(exc), kind="conflict")
                    except StoreError as exc:
                        p.error = AdmissionError(str(exc))
                    else:
                        made.append((p, rec, new))
        except Exception as exc:  # the commit failed: none of the group is durable, none is acknowledged
            LOG.exception("could not commit %d submission(s)", len(group))
            for p in group:
                if p.error is None:
                    p.error = ServiceError(f"the submission could not be recorded: {exc}")
            return
        with self.ctx.lock:
            for p, rec, new in made:
                if new and rec.id in self._tombstones:
                    self._tombstones.discard(rec.id)  # cancelled before it got here
                elif new:
                    self.mirror.track(rec)
                else:  # an idempotent retry: the job as it is now
                    rec = self.mirror.get(rec.id) or self.store.get(rec.id) or rec
                p.record = rec

    # ------------------------------------------------------------------ cancel
    def cancel(self, job_id: str) -> JobState:
        """Cancel a job: a queued one at once; a running one gets SIGTERM, then SIGKILL after ``grace_s``.

        Returns the job's state afterwards (``running``/``preempted`` while its process stops).

        Raises:
            UnknownJobError: no such job.
        """
        with self.ctx.lock:
            mirror = self.mirror
            known = job_id in mirror.queued or job_id in mirror.holding
            before = None if known else self.store.get(job_id)
            state = self.store.cancel(job_id)
            rec = self.store.get(job_id)
            if rec is not None and known:
                mirror.track(rec)
            elif rec is not None and before is not None and before.state is JobState.QUEUED:
                # Committed by a submission group that has not folded it into the mirror yet.
                self._tombstones.add(job_id)
                mirror.count_finished(state)
            if state.holds_gpus and rec is not None:
                self.supervisor.stop_job(rec)
            self.ctx.wake.set()
            return state
