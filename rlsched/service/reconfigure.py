"""MIG reconfiguration: applying a policy's ``Reconfigure`` when it is safe, with an intent that survives a crash.

A legal ``Reconfigure`` (the feasibility check accepted it) is applied only when the GPU is in a MIG pool,
open (healthy, node not cordoned) and no running, preempted or launching job holds it or one of its
instances. The GPU is then closed for the rest of the pass; an *intent* record (``mig-reconfiguration``,
``phase: intent``, old and new layout) commits with the pass's transaction, then the backend re-splits it
(``set_mig_layout``); the outcome (``phase: done``: applied, or the backend's error) is a second
``mig-reconfiguration`` record plus a decision record, committed together, and the inventory is refreshed
so the next pass sees the new instance UUIDs. A ``kill -9`` between intent and outcome is closed by
:meth:`MigReconfigurer.recover_intents` from the backend's real layout. A refused or failed
reconfiguration is audited (one record), never fatal.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import Any

from rlsched.cluster.decisions import Reconfigure
from rlsched.cluster.model import Sharing
from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.backend import BackendError, GpuBackend, GpuInfo
from rlsched.service.context import LOG, ServiceContext
from rlsched.service.inventory import Inventory
from rlsched.service.mirror import JobMirror
from rlsched.service.notes import DecisionNotes
from rlsched.service.supervision import Supervisor
from rlsched.service.view import LiveView

#: ``phase`` of the two ``mig-reconfiguration`` records of one applied re-split
MIG_INTENT, MIG_DONE = "intent", "done"


def layout_counts(layout: Iterable[str]) -> dict[str, int]:
    """A MIG layout (profile names) as mig-parted counts."""
    out: dict[str, int] = {}
    for name in layout:
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


class MigReconfigurer:
    """Applies, refuses and recovers MIG re-splits (see the module doc).

    Args:
        ctx: the service's shared parts.
        backend: what re-splits a GPU.
        inventory, mirror, supervisor: what says whether a GPU is free to re-split.
        notes: where a refusal is recorded once.
        forget_pass: makes the next loop iteration run a scheduling pass (after a re-split).
    """

    def __init__(self, ctx: ServiceContext, backend: GpuBackend, inventory: Inventory, mirror: JobMirror,
                 supervisor: Supervisor, notes: DecisionNotes, forget_pass: Callable[[], None]) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.backend = backend
        self.inventory = inventory
        self.mirror = mirror
        self.supervisor = supervisor
        self.notes = notes
        self.forget_pass = forget_pass

    def refuse(self, view: LiveView, d: Reconfigure, summary: dict[str, Any], reason: str, source: str,
               version: str) -> None:
        """Record (once per cluster state) and audit a Reconfigure the service does not apply."""
        if not self.notes.note(summary["kind"], None, summary, reason, source, version):
            return
        node = view.state.nodes.get(d.node_id)
        gpu = node.gpus[d.gpu_index] if node is not None and 0 <= d.gpu_index < len(node.gpus) else None
        uuid = getattr(gpu, "_uuid", None) if gpu is not None else None
        self.store.append_audit(AuditEvent.MIG_RECONFIGURATION, gpus=(uuid,) if uuid else (), policy=source,
                                model_version=version, reason=f"refused: {reason}",
                                extra={"applied": False, "node": d.node_id, "gpu_index": d.gpu_index,
                                       "new_layout": layout_counts(d.layout)})

    def _unsafe(self, view: LiveView, d: Reconfigure, gpu_uuid: str) -> tuple[str | None, GpuInfo | None]:
        """Why re-splitting the GPU now is not safe (None: it is), and the GPU as the backend lists it."""
        node = view.state.nodes[d.node_id]
        info = next((g for n in self.inventory.nodes if n.hostname == d.node_id for g in n.gpus
                     if g.uuid == gpu_uuid), None)
        host = next((n for n in self.inventory.nodes if n.hostname == d.node_id), None)
        pool = view.pools.get(node.pool)
        why: str | None = None
        if info is None or host is None:
            why = f"GPU {d.node_id}/{d.gpu_index} is not in the backend's inventory"
        elif pool is None or pool.sharing is not Sharing.MIG:
            why = f"GPU {gpu_uuid} is not in a MIG pool"
        elif not host.reachable or host.cordoned:
            why = f"node {d.node_id} is {'cordoned' if host.cordoned else 'unreachable'}"
        elif not info.healthy or gpu_uuid in view.gpu_problems or gpu_uuid in self.inventory.health_events:
            why = f"GPU {gpu_uuid} is closed: {view.gpu_problems.get(gpu_uuid) or 'unhealthy'}"
        else:
            mine = {gpu_uuid, *(m.uuid for m in info.mig_devices)}
            for rec in self.mirror.holding.values():
                alloc = rec.allocation
                if alloc is None:
                    continue
                if mine.intersection(alloc.devices) or (alloc.node == d.node_id and info.index in alloc.gpu_indices
                                                        and alloc.slice_start is not None) \
                        or any(ref is not None and ref.gpu_uuid == gpu_uuid
                               for ref in map(view.devices.get, alloc.devices)):
                    why = f"GPU {gpu_uuid} is held by job {rec.id} ({rec.state.value})"
                    break
        if why is None and any(self.mirror.holding.get(j) is None for j in self.supervisor.launching):
            why = "a job is being launched whose allocation is not known yet"
        return why, info

    def apply(self, view: LiveView, d: Reconfigure, summary: dict[str, Any], source: str, version: str) -> bool:
        """Apply a legal Reconfigure when it is safe (see the module doc); True if it was scheduled."""
        state = view.state
        node = state.nodes[d.node_id]  # (reconfigure_check accepted it: the node and the GPU exist)
        gpu = node.gpus[d.gpu_index]
        gpu_uuid = str(getattr(gpu, "_uuid", "") or "")
        why, info = self._unsafe(view, d, gpu_uuid)
        if why is not None:
            self.ctx.metrics.refused.labels(source="service").inc()
            self.refuse(view, d, summary, why, source, version)
            return False
        assert info is not None
        old = info.layout_counts()
        new = layout_counts(d.layout)
        # Closed for the rest of this pass: its old instances are about to disappear.
        gpu.busy_until = math.inf
        host_name = d.node_id
        # The intent commits with this pass; the outcome after the re-split. A kill -9 between the two
        # leaves an intent without an outcome, which recover_intents() closes from the backend's real layout.
        intent = os.urandom(6).hex()
        where = {"node": host_name, "gpu_index": info.index, "old_layout": old, "new_layout": new}
        self.store.append_audit(AuditEvent.MIG_RECONFIGURATION, gpus=(gpu_uuid,), policy=source,
                                model_version=version, reason="intent",
                                extra={"phase": MIG_INTENT, "intent": intent, **where})

        def resplit() -> None:
            applied, error = True, ""
            try:
                self.backend.set_mig_layout(host_name, gpu_uuid, new)
            except BackendError as exc:  # GpuInUseError, ResetRequiredError, a failed create...
                applied, error = False, f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a backend bug must not stop the loop either
                applied, error = False, f"{type(exc).__name__}: {exc}"
            if error:
                LOG.warning("MIG reconfiguration of GPU %s failed: %s", gpu_uuid, error)
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
                self.inventory.refresh()
                self.mirror.view = None
                self.forget_pass()
                self.ctx.wake.set()

        self.ctx.after_commit(resplit)
        return True

    def recover_intents(self) -> None:
        """Close each MIG re-split whose intent committed but whose outcome did not (killed in between).

        The backend's layout now says what happened: the new layout means the re-split ran
        (``applied``), the old one that it never did; anything else is recorded as found.
        """
        recs = self.store.audit(event=AuditEvent.MIG_RECONFIGURATION)
        closed = {r.extra.get("intent") for r in recs if r.extra.get("phase") == MIG_DONE}
        orphans = [r for r in recs if r.extra.get("phase") == MIG_INTENT and r.extra.get("intent") not in closed]
        if not orphans:
            return
        self.inventory.refresh()
        for r in orphans:
            info = next((g for n in self.inventory.nodes for g in n.gpus if g.uuid in r.gpus), None)
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
            self.supervisor.recovered["mig_intents"] += 1
            LOG.warning("MIG re-split of %s interrupted by a restart: %s", ",".join(r.gpus), reason)
