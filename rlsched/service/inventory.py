"""What the GPU backend last said: the nodes and their GPUs, GPU health events, telemetry.

:class:`Inventory` is refreshed once per loop iteration (and right after a MIG re-split). One bad read
keeps the last inventory - it must not empty the cluster - and is reported as a loop error; a GPU closed by
a health event stays closed for the life of the service.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.backend import GpuBackend, NodeInfo
from rlsched.service.context import LOG, ServiceContext

#: Read backend telemetry at most this often.
TELEMETRY_S = 2.0


class Inventory:
    """The backend's nodes, health events and telemetry (see the module doc)."""

    def __init__(self, ctx: ServiceContext, backend: GpuBackend) -> None:
        self.ctx = ctx
        self.backend = backend
        self.nodes: list[NodeInfo] = []
        #: whether a read ever succeeded
        self.ok = False
        #: GPU UUID -> why a health event closed it
        self.health_events: dict[str, str] = {}
        self._next_telemetry = 0.0
        #: the backend's standing problems (fleet nodes without a working agent), each audited once
        self.problems: set[str] = set()

    def refresh(self) -> None:
        """Read inventory, health events and (at most every :data:`TELEMETRY_S`) telemetry; never raises."""
        try:
            nodes = list(self.backend.inventory())
        except Exception as exc:  # keep the last inventory: one bad read must not empty the cluster
            self.ctx.loop_error("inventory", exc)
        else:
            if self.ok:
                self._note_reachability(self.nodes, nodes)
            self.nodes, self.ok = nodes, True
        self._note_problems()
        events = getattr(self.backend, "health_events", None)
        if callable(events):
            try:
                for uuid, reason in events():
                    if uuid not in self.health_events:
                        LOG.warning("GPU %s closed by a health event: %s", uuid, reason)
                        self.health_events[str(uuid)] = str(reason)
            except Exception as exc:
                self.ctx.loop_error("health", exc)
        telemetry = getattr(self.backend, "telemetry", None)
        now = time.monotonic()
        if callable(telemetry) and now >= self._next_telemetry:
            self._next_telemetry = now + TELEMETRY_S
            try:
                self.ctx.metrics.set_telemetry(telemetry())
            except Exception as exc:
                self.ctx.loop_error("telemetry", exc)

    def _note_reachability(self, before: list[NodeInfo], now: list[NodeInfo]) -> None:
        """Audit every node that stopped answering (unknown from now on) or answers again."""
        was = {n.hostname: n.reachable for n in before}
        for n in now:
            if n.hostname in was and was[n.hostname] != n.reachable:
                what = "node-returned" if n.reachable else "node-unreachable"
                LOG.warning("node %s %s", n.hostname, "answers again" if n.reachable else "stopped answering")
                self.ctx.store.append_audit(AuditEvent.NODE, reason=what, extra={"node": n.hostname})

    def _note_problems(self) -> None:
        """Audit each new standing problem of the backend once (a Ray node whose agent cannot start or
        cannot open its GPUs: its nodes are unknown meanwhile)."""
        problems = getattr(self.backend, "problems", None)
        if not callable(problems):
            return
        try:
            current = set(problems())
        except Exception as exc:
            self.ctx.loop_error("inventory", exc)
            return
        for line in sorted(current - self.problems):
            LOG.error("fleet: %s", line)
            self.ctx.store.append_audit(AuditEvent.NODE, reason="agent-problem", extra={"problem": line})
        self.problems = current

    def ensure(self) -> None:
        """Read the inventory once if no read succeeded yet (a view asked for before the first loop pass)."""
        if not self.ok:
            with contextlib.suppress(Exception):
                self.nodes = list(self.backend.inventory())
                self.ok = True

    def signature(self) -> tuple[Any, ...]:
        """What a scheduling pass depends on: nodes, GPUs, their health, MIG mode and instances, health events."""
        return (tuple((n.hostname, n.reachable, n.cordoned,
                       tuple((g.uuid, g.healthy, g.mig_current, tuple(d.uuid for d in g.mig_devices))
                             for g in n.gpus)) for n in self.nodes),
                tuple(sorted(self.health_events.items())))
