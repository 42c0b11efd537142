"""What the parts of the scheduler service share: the store, the scheduling lock, the loop's wake-up, error
reporting, and the one-transaction batch with the actions that wait for its commit.

The parts (job mirror, supervision, scheduling, admission, ...) each own their state; one re-entrant lock,
:attr:`ServiceContext.lock`, serialises every change of it, exactly as the single service class did before
it was split, so no part takes a lock of its own around the others' state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.store import Store
from rlsched.service.config import ServiceConfig
from rlsched.service.metrics import ServiceMetrics

#: the service's log: one logger for all its parts (what ``service.log`` and log filters have always named)
LOG = logging.getLogger("rlsched.service.service")

#: The same loop error is audited at most once per this many seconds.
ERROR_AUDIT_S = 60.0


class ServiceContext:
    """The service's shared infrastructure (see the module doc).

    Args:
        config: the service's configuration.
        store: the job store (the source of truth).
        clock: wall-clock source.
        metrics: the service's metrics.
        fallback_name: the served block's fallback heuristic (the policy a loop error is audited under).
    """

    def __init__(self, config: ServiceConfig, store: Store, clock: Callable[[], float], metrics: ServiceMetrics,
                 fallback_name: Callable[[], str]) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.metrics = metrics
        self.fallback_name = fallback_name
        #: the scheduling lock: held by a loop pass, a submission group folding in, a cancel, a reload's swap
        self.lock = threading.RLock()
        #: set to start a loop iteration early (a submission, a launch, a decision applied)
        self.wake = threading.Event()
        #: set when the service stops (the loop and the retention sweeper end)
        self.stopping = threading.Event()
        #: called when a batch failed: reload what the store says (installed by the service)
        self.resync: Callable[[], None] = lambda: None
        #: what waits for the current batch's commit (signals, exit files to consume, a MIG re-split)
        self._after_commit: list[Callable[[], None]] = []
        self._error_audited: dict[str, float] = {}

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the current batch committed (never if it fails)."""
        self._after_commit.append(fn)

    def drop_after_commit(self) -> None:
        """Forget what waited for a batch that will not commit."""
        self._after_commit = []

    def batch(self, step: Callable[[], None]) -> None:
        """Run ``step``'s store writes as ONE transaction, then what waited for its commit.

        If anything fails, nothing of it was committed: the service resyncs from the store (nothing
        it placed is launched, nothing is signalled) and the error propagates.
        """
        self._after_commit = []
        try:
            with self.store.batch():
                step()
        except BaseException:
            self._after_commit = []
            self.resync()
            raise
        after, self._after_commit = self._after_commit, []
        for fn in after:
            try:
                fn()
            except Exception as exc:
                self.loop_error("after-commit", exc)

    def loop_error(self, stage: str, exc: BaseException) -> None:
        """Log, count and (at most once per :data:`ERROR_AUDIT_S` for the same error) audit a loop failure."""
        LOG.exception("scheduler loop: %s failed", stage)
        self.metrics.loop_errors.labels(stage=stage).inc()
        key = f"{stage}:{type(exc).__name__}:{exc}"
        now = time.monotonic()
        if now < self._error_audited.get(key, -1e18) + ERROR_AUDIT_S:
            return
        self._error_audited[key] = now
        try:
            self.store.append_audit(AuditEvent.FALLBACK, policy=self.fallback_name(), reason=f"loop-error:{stage}",
                                    extra={"detail": f"{type(exc).__name__}: {exc}"})
        except Exception:
            self.metrics.audit_errors.inc()
            LOG.exception("could not audit a loop error")
