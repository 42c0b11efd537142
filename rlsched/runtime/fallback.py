"""The fallback guard: serve the learned policy, but never let it hurt the cluster.

A learned policy can be missing, built for another observation layout, crash,
produce NaNs, get slow, or propose something illegal. :class:`FallbackScheduler`
wraps a primary scheduler (typically a :class:`~rlsched.learned.ppo.PpoScheduler`)
and a heuristic fallback (typically ``weighted-priority``) behind the ordinary
:class:`~rlsched.cluster.scheduler.Scheduler` protocol, so the simulator and the
service drive it like any policy. It:

* checks every primary decision with
  :func:`~rlsched.cluster.feasibility.check_decision` (the one legality gate, the
  engine's too) BEFORE yielding it - an illegal decision is never applied;
* watches each decision point for a decision loop without progress (scale up/down
  alternation, many decisions with nothing placed while a job fits; the simulator's
  :class:`~rlsched.cluster.loop_detector.LoopDetector`): the decision that would continue
  the loop is not yielded and the rest of the decision point goes to the heuristic
  (reason ``decision-loop``). A heuristic primary (``loop_exempt``) is not watched;
* on any failure at a decision point, hands the REST of that decision point to
  the heuristic (decisions already applied stay applied: they were legal);
* says why, with one of the :class:`~rlsched.runtime.audit.FallbackReason`
  strings, both in ``fallbacks_by_reason`` and through the audit callback;
* trips a circuit breaker after ``failure_threshold`` failures within
  ``window_s``: the heuristic alone decides for ``cooldown_s``, then one decision
  point probes the primary (half-open) - success closes the breaker, failure
  re-opens it;
* in shadow mode, lets the primary decide on the same state without applying its
  decisions (they are audited) while the heuristic acts - the way to qualify a
  new model on live traffic.

Latency is measured per yielded decision (the time inside the primary's
``next()``), on an injectable clock. A decision that took longer than the budget
is discarded (it was computed on a view the live cluster may have left) and the
heuristic decides instead. The guard cannot interrupt a primary that hangs
forever inside one call; bounding that needs the primary in a worker process
(service-layer work).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rlsched.cluster.decisions import Decision, WakeAt
from rlsched.cluster.feasibility import check_decision
from rlsched.cluster.loop_detector import LoopConfig, LoopDetector
from rlsched.cluster.model import ClusterState
from rlsched.cluster.scheduler import Scheduler
from rlsched.runtime.audit import AuditEvent, AuditRecord, AuditSink, FallbackReason, decision_record, decision_summary

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FallbackConfig:
    """Knobs of the fallback guard.

    Attributes:
        latency_budget_s: longest a single primary decision may take.
        failure_threshold: failures within ``window_s`` that open the circuit.
        window_s: sliding window for counting failures.
        cooldown_s: how long an open circuit keeps the heuristic before probing;
            also how often a missing model is retried.
        shadow: the primary only advises (audited, never applied); the heuristic acts.
        shadow_max_decisions: primary decisions audited per decision point in
            shadow mode (they are not applied, so later ones see a stale state).
        loop: thresholds of the decision-loop detector.
    """

    latency_budget_s: float = 0.050
    failure_threshold: int = 3
    window_s: float = 60.0
    cooldown_s: float = 300.0
    shadow: bool = False
    shadow_max_decisions: int = 8
    loop: LoopConfig = field(default_factory=LoopConfig)

    def __post_init__(self) -> None:
        if self.latency_budget_s <= 0 or self.window_s <= 0 or self.cooldown_s < 0:
            raise ValueError("latency_budget_s and window_s must be > 0, cooldown_s >= 0")
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


PrimarySource = Scheduler | Callable[[], Scheduler]


#: Why the engine or the runtime would refuse a decision now (None if it would not): the
#: feasibility module's one gate, under the name the guard's callers know it by.
illegal_reason = check_decision


class _Failure(Exception):
    """Internal: the primary failed at this decision point (carries the reason)."""

    def __init__(self, reason: FallbackReason, detail: str, decision: Decision | None = None,
                 latency_s: float | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.decision = decision
        self.latency_s = latency_s


def _classify_model_error(exc: BaseException, *, loading: bool) -> FallbackReason:
    msg = str(exc).lower()
    if "signature" in msg:
        return FallbackReason.SIGNATURE_MISMATCH
    if "non-finite" in msg or "nan" in msg.split():
        return FallbackReason.NAN_OUTPUT
    return FallbackReason.MODEL_MISSING if loading else FallbackReason.INFERENCE_ERROR


def model_version(scheduler: object) -> str:
    """A short version label of a learned scheduler's model (card version/name + signature)."""
    model = getattr(scheduler, "model", None)
    if model is None:
        return ""
    card = getattr(model, "card", None) or {}
    label = str(card.get("version") or card.get("mlflow_run_id") or card.get("name") or "")
    sig = str(getattr(model, "signature", "") or "")[:12]
    return f"{label}@{sig}" if label and sig else label or sig


class FallbackScheduler:
    """A guarded primary scheduler with a heuristic fallback (see the module doc).

    Args:
        primary: the scheduler to serve, or a zero-argument loader returning it
            (which may raise :class:`~rlsched.learned.ppo.ModelError`; a failed
            load is retried every ``cooldown_s``).
        fallback: the heuristic that decides whenever the primary may not.
        guard: thresholds and mode.
        audit: receives an :class:`~rlsched.runtime.audit.AuditRecord` for every
            fallback, circuit change, model (re)load and shadow decision.
        clock: monotonic seconds (injectable so tests control time).
        name: the policy name reported by the simulator/service.
    """

    def __init__(self, primary: PrimarySource, fallback: Scheduler, guard: FallbackConfig | None = None,
                 audit: AuditSink | None = None, *, clock: Callable[[], float] = time.monotonic,
                 name: str | None = None) -> None:
        self.config = guard or FallbackConfig()
        self.fallback = fallback
        self._sink = audit
        self.clock = clock
        self._loader: Callable[[], Scheduler] | None
        self.primary: Scheduler | None
        if isinstance(primary, Scheduler):
            self._loader, self.primary = None, primary
        else:
            self._loader, self.primary = primary, None
        #: fallbacks per reason (failures, and decision points served while the primary is unavailable).
        self.fallbacks_by_reason: dict[str, int] = {}
        #: illegal primary decisions refused by the guard (never yielded).
        self.refused = 0
        #: decisions yielded, by source.
        self.primary_decisions = 0
        self.fallback_decisions = 0
        self.shadow_decisions = 0
        #: shadow-mode primary problems per reason (they never cause a fallback: the heuristic acts anyway).
        self.shadow_failures_by_reason: dict[str, int] = {}
        #: audit records the sink failed to take.
        self.audit_errors = 0
        self._failures: deque[float] = deque()
        self._loop = LoopDetector(self.config.loop)
        self._breaker = BreakerState.CLOSED
        self._open_until = 0.0
        #: why the primary is unavailable (not loaded / failed its reset), if it is.
        self._unavailable: FallbackReason | None = None
        self._retry_at = 0.0
        self._needs_reset = False
        self.name = name or f"guarded:{getattr(self.primary, 'name', 'primary')}>{fallback.name}"
        if self._loader is not None:
            self._load(None)

    # ------------------------------------------------------------------ introspection
    @property
    def breaker_state(self) -> BreakerState:
        return self._breaker

    @property
    def primary_available(self) -> bool:
        return self.primary is not None and self._unavailable is None

    @property
    def model_version(self) -> str:
        return model_version(self.primary)

    # ------------------------------------------------------------------ audit
    def _emit(self, record: AuditRecord) -> None:
        """Send a record to the sink; a failing sink is logged and counted, never fatal.

        Scheduling must go on when the audit database is briefly unavailable; the
        ``audit_errors`` counter (exported by the service) makes the gap visible.
        """
        if self._sink is None:
            return
        try:
            self._sink(record)
        except Exception:
            self.audit_errors += 1
            _log.exception("audit sink failed for %s/%s", record.event.value, record.reason)

    def _policy_label(self) -> str:
        return str(getattr(self.primary, "name", "") or "primary")

    def _switch(self, to: str, reason: str, **extra: Any) -> None:
        self._emit(AuditRecord(AuditEvent.POLICY_SWITCH, policy=to, model_version=self.model_version, reason=reason,
                               extra={"breaker": self._breaker.value, **extra}))

    def _count(self, reason: FallbackReason) -> None:
        self.fallbacks_by_reason[reason.value] = self.fallbacks_by_reason.get(reason.value, 0) + 1

    # ------------------------------------------------------------------ primary life
    def _load(self, state: ClusterState | None) -> None:
        """(Re)load the primary through the loader, or re-run its reset; sets ``_unavailable``."""
        now = self.clock()
        was = self._unavailable
        try:
            if self._loader is not None and (self.primary is None or was is not None):
                self.primary = self._loader()
                self._needs_reset = True
            if self.primary is not None and self._needs_reset and state is not None:
                self.primary.reset(state)
                self._needs_reset = False
        except Exception as exc:  # the guard exists so that no model problem can take the service down
            reason = _classify_model_error(exc, loading=True)
            self._unavailable = reason
            self._retry_at = now + self.config.cooldown_s
            self._emit(AuditRecord(AuditEvent.FALLBACK, policy=self.fallback.name, model_version=self.model_version,
                                   reason=reason.value,
                                   extra={"detail": f"{type(exc).__name__}: {exc}", "stage": "load",
                                          "retry_in_s": self.config.cooldown_s}))
            return
        self._unavailable = None
        if was is not None:
            self._switch(self._policy_label(), "model-loaded", previous=was.value)

    def keep_serving(self, previous: FallbackScheduler) -> bool:
        """Serve ``previous``'s loaded primary because this guard's own could not be loaded.

        A reload must not trade a working model for the heuristic because the registry is
        briefly down. The previous model keeps deciding until the next reload (the loader
        is retried only if that model later fails its reset, so which model serves never
        changes behind the operator's back). Returns False (nothing kept) when this guard's
        primary did load or ``previous`` has none.
        """
        if self.primary_available or not previous.primary_available or previous.primary is None:
            return False
        self.primary = previous.primary
        self._unavailable = None
        self._needs_reset = True
        return True

    def reset(self, state: ClusterState) -> None:
        """Reset both schedulers and the breaker (a fresh run); a failing primary reset is a load failure."""
        self.fallback.reset(state)
        self._failures.clear()
        self._loop.reset()
        self._breaker = BreakerState.CLOSED
        self._needs_reset = True
        if self._unavailable is None or self.clock() >= self._retry_at:
            self._load(state)

    # ------------------------------------------------------------------ deciding
    def decide(self, state: ClusterState) -> Iterator[Decision]:
        now = self.clock()
        retry_due = self._unavailable is not None and now >= self._retry_at
        if retry_due or (self._needs_reset and self.primary is not None and self._unavailable is None):
            self._load(state)
        if self.config.shadow:
            yield from self._shadow(state)
            return
        if self.primary is None or self._unavailable is not None:
            self._count(self._unavailable or FallbackReason.MODEL_MISSING)
            yield from self._heuristic(state)
            return
        if self._breaker is BreakerState.OPEN:
            if now < self._open_until:
                self._count(FallbackReason.CIRCUIT_OPEN)
                yield from self._heuristic(state)
                return
            self._breaker = BreakerState.HALF_OPEN
            self._switch(self._policy_label(), "probe", note="half-open: one decision point on the primary")
        probing = self._breaker is BreakerState.HALF_OPEN
        try:
            yield from self._guarded(state, self.primary)
        except _Failure as f:
            self._fail(f, state)
            yield from self._heuristic(state)
            return
        if probing:
            self._breaker = BreakerState.CLOSED
            self._failures.clear()
            self._switch(self._policy_label(), "probe-succeeded")

    def _heuristic(self, state: ClusterState) -> Iterator[Decision]:
        for d in self.fallback.decide(state):
            self.fallback_decisions += 1
            yield d

    def _timed(self, state: ClusterState, primary: Scheduler) -> Generator[tuple[Decision, float], None, None]:
        """The primary's decisions, each with the seconds its ``next()`` took.

        A primary that raises (when asked for its generator or for a decision) becomes
        an inference ``_Failure``; the primary's generator is closed however this ends.
        """
        gen: Iterator[Decision] | None = None
        try:
            t0 = self.clock()
            try:
                gen = iter(primary.decide(state))
            except Exception as exc:
                raise self._inference_failure(exc, None) from None
            while True:
                try:
                    d = next(gen)
                except StopIteration:
                    return
                except Exception as exc:
                    raise self._inference_failure(exc, self.clock() - t0) from None
                yield d, self.clock() - t0
                t0 = self.clock()
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()

    def _guarded(self, state: ClusterState, primary: Scheduler) -> Iterator[Decision]:
        """Yield the primary's decisions that are legal and on time; raise _Failure at the first that is not."""
        budget = self.config.latency_budget_s
        timed = self._timed(state, primary)
        loop = None if getattr(primary, "loop_exempt", False) else self._loop
        if loop is not None:
            loop.start()
        try:
            for d, dt in timed:
                if isinstance(d, WakeAt) and not math.isfinite(d.time):
                    raise _Failure(FallbackReason.NAN_OUTPUT, "primary asked to wake at a non-finite time", d, dt)
                if dt > budget:
                    raise _Failure(FallbackReason.LATENCY_BUDGET,
                                   f"decision took {dt * 1000:.1f} ms (budget {budget * 1000:.1f} ms)", d, dt)
                why = check_decision(state, d)
                if why is not None:
                    self.refused += 1
                    raise _Failure(FallbackReason.ILLEGAL_ACTION, why, d, dt)
                looping = loop.check(state, d) if loop is not None else None
                if looping is not None:
                    raise _Failure(FallbackReason.DECISION_LOOP, looping, d, dt)
                self.primary_decisions += 1
                yield d
        finally:
            timed.close()

    @staticmethod
    def _inference_failure(exc: Exception, latency: float | None) -> _Failure:
        reason = _classify_model_error(exc, loading=False)
        if reason is FallbackReason.SIGNATURE_MISMATCH:
            reason = FallbackReason.INFERENCE_ERROR
        return _Failure(reason, f"{type(exc).__name__}: {exc}", None, latency)

    def _fail(self, f: _Failure, state: ClusterState) -> None:
        """Count, audit, and move the breaker for one primary failure."""
        now = self.clock()
        self._count(f.reason)
        extra: dict[str, Any] = {"detail": f.detail, "breaker": self._breaker.value}
        if f.latency_s is not None:
            extra["latency_ms"] = round(f.latency_s * 1000, 3)
        if f.decision is not None:
            rec = decision_record(AuditEvent.FALLBACK, f.decision, state, policy=self.fallback.name,
                                  model_version=self.model_version, reason=f.reason.value, extra=extra)
        else:
            rec = AuditRecord(AuditEvent.FALLBACK, policy=self.fallback.name, model_version=self.model_version,
                              reason=f.reason.value, extra={**extra, "cluster_time": state.time})
        self._emit(rec)
        window = self.config.window_s
        self._failures.append(now)
        while self._failures and self._failures[0] < now - window:
            self._failures.popleft()
        if self._breaker is BreakerState.HALF_OPEN or len(self._failures) >= self.config.failure_threshold:
            probe_failed = self._breaker is BreakerState.HALF_OPEN
            self._breaker = BreakerState.OPEN
            self._open_until = now + self.config.cooldown_s
            self._switch(self.fallback.name, FallbackReason.CIRCUIT_OPEN.value, trigger=f.reason.value,
                         probe_failed=probe_failed, failures_in_window=len(self._failures),
                         cooldown_s=self.config.cooldown_s)

    # ------------------------------------------------------------------ shadow mode
    def _shadow(self, state: ClusterState) -> Iterator[Decision]:
        """Audit what the primary would do on this state, then let the heuristic act."""
        if self.primary is not None and self._unavailable is None:
            self._shadow_primary(state, self.primary)
        yield from self._heuristic(state)

    def _shadow_primary(self, state: ClusterState, primary: Scheduler) -> None:
        seen: set[Decision] = set()
        policy, version = self._policy_label(), self.model_version
        try:
            for d in self._guarded_shadow(state, primary):
                if d in seen:  # not applied, so the primary repeats itself: nothing more to learn here
                    break
                seen.add(d)
                if len(seen) > self.config.shadow_max_decisions:
                    break
        except _Failure as f:
            key = f.reason.value
            self.shadow_failures_by_reason[key] = self.shadow_failures_by_reason.get(key, 0) + 1
            extra: dict[str, Any] = {"detail": f.detail, "applied": False}
            if f.decision is not None:
                extra["decision"] = decision_summary(f.decision)
            self._emit(AuditRecord(AuditEvent.SHADOW, policy=policy, model_version=version, reason=key, extra=extra))

    def _guarded_shadow(self, state: ClusterState, primary: Scheduler) -> Iterator[Decision]:
        budget = self.config.latency_budget_s
        timed = self._timed(state, primary)
        try:
            for d, dt in timed:
                why = check_decision(state, d)
                self.shadow_decisions += 1
                self._emit(decision_record(
                    AuditEvent.SHADOW, d, state, policy=self._policy_label(), model_version=self.model_version,
                    reason="" if why is None else FallbackReason.ILLEGAL_ACTION.value,
                    extra={"applied": False, "legal": why is None, "why": why or "",
                           "latency_ms": round(dt * 1000, 3), "over_budget": dt > budget}))
                yield d
        except _Failure:
            raise
        except Exception as exc:
            raise self._inference_failure(exc, None) from None
        finally:
            timed.close()
