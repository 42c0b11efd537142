"""The audit trail: one record type shared by the job store and the fallback guard.

Every externally visible act of the scheduler service - a submission, an
allocation, a preemption, a MIG reconfiguration, a switch between the learned
policy and the heuristic, a cancellation, a completion - becomes one
:class:`AuditRecord`. The store persists them (append-only, see
:mod:`rlsched.runtime.store`); the fallback guard (:mod:`rlsched.runtime.fallback`) emits them
through an :data:`AuditSink` callable so it stays independent of persistence and
can be tested with a list.

Records are plain data with JSON-safe fields so that the same shape comes out of
SQLite, goes into a log line, and (later) out of the service's HTTP API.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rlsched.cluster.decisions import Decision, Place, Preempt, Reconfigure, Scale, WakeAt
from rlsched.cluster.model import ClusterState, Placement


class AuditEvent(str, Enum):
    """What happened. Values are the strings stored in the database and shown to users."""

    SUBMISSION = "submission"
    ALLOCATION = "allocation"
    PREEMPTION = "preemption"
    MIG_RECONFIGURATION = "mig-reconfiguration"
    POLICY_SWITCH = "policy-switch"
    FALLBACK = "fallback"
    CANCEL = "cancel"
    COMPLETION = "completion"
    #: a decision the learned policy made in shadow mode (logged, never applied).
    SHADOW = "shadow-decision"
    #: the digital twin found a better policy than the served one (recommended, or refused by the gate)
    TWIN_ADVICE = "twin-advice"
    #: a node of a multi-node fleet was lost, came back, or had a stray job process fenced
    NODE = "node"


class FallbackReason(str, Enum):
    """Why the fallback guard used the heuristic instead of the learned policy."""

    MODEL_MISSING = "model-missing"
    SIGNATURE_MISMATCH = "signature-mismatch"
    INFERENCE_ERROR = "inference-error"
    NAN_OUTPUT = "nan-output"
    LATENCY_BUDGET = "latency-budget"
    ILLEGAL_ACTION = "illegal-action"
    CIRCUIT_OPEN = "circuit-open"
    #: the primary kept deciding without progress at one decision point (rlsched.cluster.loop_detector)
    DECISION_LOOP = "decision-loop"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit event.

    Attributes:
        event: what happened.
        job: the job concerned, if any.
        gpus: GPU or MIG UUIDs concerned (allocation, preemption, reconfiguration).
        policy: the scheduler that decided (``weighted-priority``, ``ppo:v3``...).
        model_version: version of the learned model involved, if any.
        reason: why (a fallback reason, a preemption reason, an exit status...).
        extra: further JSON-safe details (decision summary, exit code, latency...).
        time: wall-clock seconds since the epoch when it happened.
        id: position in the persisted trail (None until the store assigns it);
            strictly increasing, never reused.
    """

    event: AuditEvent
    job: str | None = None
    gpus: tuple[str, ...] = ()
    policy: str = ""
    model_version: str = ""
    reason: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (event as its string value)."""
        return {
            "id": self.id,
            "time": self.time,
            "event": self.event.value,
            "job": self.job,
            "gpus": list(self.gpus),
            "policy": self.policy,
            "model_version": self.model_version,
            "reason": self.reason,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AuditRecord:
        """Inverse of :meth:`to_dict`; unknown event strings raise ValueError."""
        return cls(
            event=AuditEvent(d["event"]),
            job=d.get("job"),
            gpus=tuple(d.get("gpus") or ()),
            policy=d.get("policy") or "",
            model_version=d.get("model_version") or "",
            reason=d.get("reason") or "",
            extra=dict(d.get("extra") or {}),
            time=float(d["time"]),
            id=d.get("id"),
        )


#: Where the fallback guard (and anything else that is not the store) sends audit records.
AuditSink = Callable[[AuditRecord], None]


def dumps(obj: Any) -> str:
    """Compact, key-sorted JSON: stable bytes for equal content (idempotency checks compare it)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def placement_devices(state: ClusterState, placement: Placement) -> tuple[str, ...]:
    """The GPU or MIG UUIDs a placement names, as the executor exposes them to the job.

    A MIG placement yields the UUID of the instance at ``slice_start``; others the
    UUIDs of the whole GPUs (a time-sliced GPU is shared, so its GPU UUID is what
    ``CUDA_VISIBLE_DEVICES`` gets). Unknown nodes/GPUs are skipped: the record is
    written for a decision that feasibility may still refuse.
    """
    out: list[str] = []
    for node_id, gi in placement.gpus:
        node = state.nodes.get(node_id)
        if node is None or not 0 <= gi < len(node.gpus):
            continue
        gpu = node.gpus[gi]
        if placement.slice_start is not None:
            out.extend(s.uuid for s in gpu.slices if s.start == placement.slice_start)
        else:
            out.append(gpu.uuid)
    return tuple(out)


def decision_summary(decision: Decision) -> dict[str, Any]:
    """A JSON-safe description of a scheduler decision (for audit ``extra`` and the decisions table)."""
    if isinstance(decision, Place):
        p = decision.placement
        return {"kind": "place", "job": decision.job_id, "pool": p.pool,
                "gpus": [[n, i] for n, i in p.gpus], "slice_start": p.slice_start}
    if isinstance(decision, Preempt):
        return {"kind": "preempt", "job": decision.job_id, "reason": decision.reason,
                "checkpoint": decision.checkpoint}
    if isinstance(decision, Scale):
        return {"kind": "scale", "pool": decision.pool, "delta": decision.delta}
    if isinstance(decision, Reconfigure):
        return {"kind": "reconfigure", "node": decision.node_id, "gpu": decision.gpu_index,
                "layout": list(decision.layout)}
    if isinstance(decision, WakeAt):
        return {"kind": "wake", "time": decision.time}
    return {"kind": type(decision).__name__}


def decision_job(decision: Decision) -> str | None:
    """The job a decision concerns, if any."""
    return decision.job_id if isinstance(decision, (Place, Preempt)) else None


def decision_devices(state: ClusterState, decision: Decision) -> tuple[str, ...]:
    """GPU/MIG UUIDs a decision touches (placements and reconfigurations; preemptions via the run)."""
    if isinstance(decision, Place):
        return placement_devices(state, decision.placement)
    if isinstance(decision, Preempt):
        run = state.running.get(decision.job_id)
        return placement_devices(state, run.placement) if run is not None and run.placement else ()
    if isinstance(decision, Reconfigure):
        node = state.nodes.get(decision.node_id)
        if node is not None and 0 <= decision.gpu_index < len(node.gpus):
            return (node.gpus[decision.gpu_index].uuid,)
    return ()


def decision_record(
    event: AuditEvent,
    decision: Decision,
    state: ClusterState,
    *,
    policy: str = "",
    model_version: str = "",
    reason: str = "",
    extra: Mapping[str, Any] | None = None,
) -> AuditRecord:
    """An audit record describing ``decision`` against ``state`` (devices resolved to UUIDs).

    The cluster clock (simulated or live) goes into ``extra["cluster_time"]``; the
    record's own ``time`` is wall-clock, so a trail mixes cleanly across restarts.
    """
    details: dict[str, Any] = {"decision": decision_summary(decision), "cluster_time": state.time}
    if extra:
        details.update(extra)
    return AuditRecord(event=event, job=decision_job(decision), gpus=decision_devices(state, decision),
                       policy=policy, model_version=model_version, reason=reason, extra=details)
