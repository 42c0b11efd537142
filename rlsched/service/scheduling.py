"""One scheduling pass: the live view, quotas, health, the guarded policy's decisions and applying them.

:meth:`SchedulingPass.run` keeps the live :class:`~rlsched.cluster.model.ClusterState` (inventory +
unfinished jobs, :mod:`rlsched.service.view`), holds back queued jobs that are over their quota
(:mod:`rlsched.service.quotas`), stops jobs on unhealthy GPUs, and runs the served policy when something
changed; each decision is applied after the feasibility check. A placement is committed with
``Store.mark_running`` and its process launched after the pass's transaction (see
:mod:`rlsched.service.supervision`); a preemption signals the job and keeps its GPUs held until it exits;
a ``Reconfigure`` goes to :mod:`rlsched.service.reconfigure`. ``Scale`` decisions are recorded as not
applied: elastic scaling is plan/apply's business.

The view is built from the job mirror and then updated incrementally, so a pass neither re-reads nor
re-decodes the queue, and a pass that nothing could change (no transition, same inventory and health) is
skipped. The whole pass runs under the scheduling lock, inside one store transaction.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

from rlsched.cluster.decisions import Decision, Place, Preempt, Reconfigure, Scale, WakeAt
from rlsched.cluster.feasibility import pool_candidates
from rlsched.cluster.model import ClusterState, PoolSpec, RunState
from rlsched.runtime.audit import decision_summary
from rlsched.runtime.fallback import illegal_reason
from rlsched.runtime.store import InvalidTransitionError, JobRecord, JobState, UnknownJobError
from rlsched.service.context import ServiceContext
from rlsched.service.durations import LiveDurations
from rlsched.service.inventory import Inventory
from rlsched.service.live_forecast import WARMUP_S as FORECAST_WARMUP_S
from rlsched.service.live_forecast import LiveForecast, served_forecast
from rlsched.service.mirror import JobMirror
from rlsched.service.notes import DecisionNotes
from rlsched.service.quotas import Holding, ask_of, blocking, holding_of, principal_matches
from rlsched.service.reconfigure import MigReconfigurer
from rlsched.service.served_policy import ServedPolicy
from rlsched.service.supervision import Supervisor
from rlsched.service.view import LiveView, build_view

#: Re-run the policy at least this often even when nothing changed (time-dependent policies, model retry).
RESCHEDULE_S = 30.0
#: Decisions applied per loop iteration at most (a runaway policy cannot stall the loop).
MAX_DECISIONS_PER_TICK = 2000


class SchedulingPass:
    """The scheduling stage of the loop and the live view it keeps (see the module doc).

    Args:
        ctx: the service's shared parts.
        policy: the served policy.
        inventory, mirror: what the view is built from.
        supervisor: launches what a pass placed; stops what it preempted.
        reconfigurer: applies a policy's ``Reconfigure``.
        notes: where refused decisions are recorded once.
        local_hostname: what ``localhost`` in a pool's nodes means.
    """

    def __init__(self, ctx: ServiceContext, policy: ServedPolicy, inventory: Inventory, mirror: JobMirror,
                 supervisor: Supervisor, reconfigurer: MigReconfigurer, notes: DecisionNotes,
                 local_hostname: str | None) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.metrics = ctx.metrics
        self.policy = policy
        self.inventory = inventory
        self.mirror = mirror
        self.supervisor = supervisor
        self.reconfigurer = reconfigurer
        self.notes = notes
        self.local_hostname = local_hostname
        self._signature: Any = None
        self._next_decide = 0.0
        #: queued jobs held back by a quota (job id -> the reason users see)
        self.quota_held: dict[str, str] = {}
        #: quota refusals of the last policy pass (a placement the policy chose in a pool over quota).
        self.quota_blocked: dict[str, str] = {}
        self._pass_gen = -1
        self._struct_sig: Any = None
        self._views_built = 0
        #: per-pool GPU summary of the last loop pass (``/v1/info`` reads it without building a view).
        self.pool_summary: dict[str, Any] | None = None
        #: the served model's demand forecaster, fed with the submissions (None: no model forecaster).
        self.forecast: LiveForecast | None = None
        #: the one duration estimator of the service's lifetime, which every view carries (learnt from
        #: the service's finished jobs: see :mod:`rlsched.service.durations`).
        self.durations = LiveDurations(ctx.store)

    def forget(self) -> None:
        """Make the next loop iteration run a full pass (a re-split, a recovery, a failed transaction)."""
        self._signature = None

    def forget_all(self) -> None:
        """Forget everything derived from the spec (a reload): the next pass starts from scratch."""
        self._signature = None
        self.pool_summary = None
        self._struct_sig = None

    # ------------------------------------------------------------------ the view
    def build_view(self, now: float | None = None) -> LiveView:
        """A fresh view from the inventory and the mirror (no store read, no decoding of known jobs)."""
        view = build_view(self.policy.spec, self.inventory.nodes, list(self.mirror.holding.values()),
                          self.mirror.queued_records(), self.ctx.clock() if now is None else now,
                          health_events=self.inventory.health_events, local_hostname=self.local_hostname,
                          job_cache=self.mirror.job_cache, estimator=self.durations.estimator)
        # Policies may cache by (id(state), queue_version): every new state starts above any version an
        # earlier one reached, so a state at a recycled address never matches a stale cache entry.
        self._views_built += 1
        view.state.queue_version += self._views_built << 40
        return view

    def current_view(self) -> LiveView:
        """The live view, built now if there is none."""
        if self.mirror.view is None:
            self.inventory.ensure()
            self.mirror.view = self.build_view()
        return self.mirror.view

    # ------------------------------------------------------------------ quotas
    def _holdings(self, holding: list[JobRecord], pools: dict[str, PoolSpec], now: float) -> list[Holding]:
        out = [h for r in holding if (h := holding_of(r, pools)) is not None]
        if any(q.max_gpu_hours_per_day is not None for q in self.policy.spec.quotas.values()):
            finished = self.store.jobs([JobState.DONE, JobState.FAILED, JobState.CANCELLED],
                                       finished_since=now - 86_400.0)
            out += [h for r in finished if (h := holding_of(r, pools)) is not None]
        return out

    def _quota_hold(self, view: LiveView, queued: list[JobRecord], holdings: list[Holding],
                    now: float) -> dict[str, str]:
        quotas = list(self.policy.spec.quotas.values())
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
                why = blocking(quotas, holdings, ask_of(rec, spec), now)
                if why is None:
                    break
                reasons.append(why)
            else:
                if reasons:
                    held[rec.id] = reasons[0]
        return held

    # ------------------------------------------------------------------ the pass
    def run(self) -> None:
        """One scheduling pass (a loop stage, in a batch; skipped when nothing could change)."""
        now = self.ctx.clock()
        struct = self.inventory.signature()
        mirror = self.mirror
        view = mirror.view
        if view is not None and struct == self._struct_sig and mirror.gen == self._pass_gen \
                and now < self._next_decide:
            view.state.time = now
            return  # no transition, same inventory and health: nothing a pass could change
        quotas = bool(self.policy.spec.quotas)
        if view is None or struct != self._struct_sig or self.quota_held or now >= self._next_decide:
            # From scratch (from the mirror): at start, when inventory or health changed, while a quota
            # holds jobs back (they are out of the view's queue until it lets them go), and once per
            # rescheduling period as a safety net.
            if struct != self._struct_sig:
                mirror.job_cache.clear()
            view = mirror.view = self.build_view(now)
            self._struct_sig = struct
        else:
            view.state.time = now
        gen = mirror.gen
        holding = list(mirror.holding.values())
        holdings = self._holdings(holding, view.pools, now)
        held = self._quota_hold(view, mirror.queued_records(), holdings, now) if quotas else {}
        for jid in held:
            view.state.dequeue(jid)
        self.quota_held = held
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
            mirror.track(cur)
            self.supervisor.stop_after_commit(cur.id)
        sig = (mirror.gen, struct, tuple(sorted(held.items())), id(self.policy.sched))
        self._pass_gen = gen  # (this pass's own placements make the next tick look again, once)
        if sig == self._signature and now < self._next_decide:
            return
        if sig != self._signature:
            self.notes.clear()
        self.quota_blocked.clear()
        self._signature = sig
        self._next_decide = now + RESCHEDULE_S
        if not view.state.queue and not view.state.running:
            return
        self._decide(view, holdings, now)

    def _publish_forecast(self, state: ClusterState, now: float) -> None:
        """Put the served model's demand forecast into ``state`` (see :mod:`rlsched.service.live_forecast`).

        Like the simulator, which publishes its forecaster's prediction before every decision
        point: a policy trained with a forecast must see one in service too. Never raises.
        """
        src = served_forecast(self.policy.sched) if self.policy.guard is not None else None
        if src is None:
            if self.forecast is not None:
                self.forecast = None
                state.demand_forecast, state.demand_forecast_horizon_s = {}, 0.0
            return
        try:
            live = self.forecast
            if live is None or live.source is not src:  # first pass with this model (or a reload)
                live = self.forecast = LiveForecast(src)
                live.observe(self.store.jobs(), since=now - FORECAST_WARMUP_S)
            live.observe(itertools.chain(self.mirror.queued.values(), self.mirror.holding.values()))
            live.publish(state, now)
        except Exception as exc:  # a forecast problem must not stop scheduling
            state.demand_forecast, state.demand_forecast_horizon_s = {}, 0.0
            self.ctx.loop_error("forecast", exc)

    def _decide(self, view: LiveView, holdings: list[Holding], now: float) -> None:
        state = view.state
        served = self.policy
        sched = served.sched
        if served.needs_reset:
            sched.reset(state)
            served.needs_reset = False
        self._publish_forecast(state, now)
        guard = served.guard
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
                    source, version = served.decl.fallback, ""
                elif guard.primary_decisions > before[0]:
                    source, version = served.primary_label(), guard.model_version
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
            self.ctx.wake.set()

    def _apply(self, view: LiveView, d: Decision, holdings: list[Holding], source: str, version: str,
               now: float) -> bool:
        state = view.state
        summary = decision_summary(d)
        note = self.notes.note
        if isinstance(d, WakeAt):
            self._next_decide = min(self._next_decide, d.time)
            return False
        if isinstance(d, Scale):
            note(summary["kind"], None, summary, "not applied by the live service (rlsched plan/apply "
                 "changes pools)", source, version)
            return False
        why = illegal_reason(state, d)
        if why is not None:
            self.metrics.refused.labels(source="service").inc()
            if isinstance(d, Reconfigure):
                self.reconfigurer.refuse(view, d, summary, f"illegal: {why}", source, version)
                return False
            note(summary["kind"], getattr(d, "job_id", None), summary, f"illegal: {why}", source, version)
            return False
        if isinstance(d, Reconfigure):
            return self.reconfigurer.apply(view, d, summary, source, version)
        if isinstance(d, Preempt):
            try:
                rec = self.store.preempt(d.job_id, d.reason or "priority", policy=source, model_version=version)
            except (InvalidTransitionError, UnknownJobError):
                return False
            self.mirror.track(rec)
            state.running.pop(d.job_id, None)
            self.store.append_decision("preempt", summary, applied=True, job=d.job_id, policy=source,
                                       model_version=version)
            self.supervisor.stop_after_commit(d.job_id)
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
                note("place", d.job_id, summary, f"job may only run in pool(s) {', '.join(sorted(allowed))}",
                     source, version)
                return False
            d = Place(d.job_id, alt)
            source = f"{source}+service:allowed-pools"
        queued = self.mirror.queued.get(d.job_id)
        if queued is None:
            return False
        spec = view.pools[d.placement.pool]
        blocked = blocking(self.policy.spec.quotas.values(), holdings, ask_of(queued, spec), now)
        if blocked is not None:
            self.quota_blocked[d.job_id] = blocked
            note("place", d.job_id, summary, blocked, source, version)
            return False
        return self._start(view, queued, d, holdings, source, version)

    def _start(self, view: LiveView, rec: JobRecord, d: Place, holdings: list[Holding], source: str,
               version: str) -> bool:
        state = view.state
        alloc = view.allocation(d.placement)
        log_path = self.supervisor.executor.log_dir / f"{rec.id}.log"
        try:
            started = self.store.mark_running(rec.id, alloc, None, None, str(log_path), policy=source,
                                              model_version=version)
        except (InvalidTransitionError, UnknownJobError):
            return False  # cancelled meanwhile
        if started.attempts == 1 and started.started_at is not None:
            self.metrics.job_wait.observe(max(0.0, started.started_at - started.submitted_at))
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
        self.mirror.track(started)
        h = holding_of(started, view.pools)
        if h is not None:
            holdings.append(h)
        self.store.append_decision("place", decision_summary(d), applied=True, job=rec.id, policy=source,
                                   model_version=version)
        # Its process starts only after this pass's transaction committed it as running (exactly
        # once), and outside the service lock (see the service's tick and Supervisor.launch).
        self.supervisor.queue_launch(started, alloc)
        return True

    def update_metrics(self) -> None:
        """Job counts and per-pool allocation from the mirror and the last view (a loop stage)."""
        self.metrics.set_jobs(self.mirror.counts())
        view = self.mirror.view
        if view is None:
            return
        summary = view.pool_summary()
        self.pool_summary = summary
        self.metrics.set_allocation({
            name: (p["gpus_total"], p["gpus_allocated"],
                   {prof: d["allocated"] for prof, d in p["mig_instances"].items()})
            for name, p in summary.items()})
        self.metrics.unhealthy_gpus.set(len(view.unhealthy))
