"""Typed results of loading a pool spec: what ``validate`` checks and ``plan`` diffs.

This module is the contract between the HCL layer (:mod:`rlsched.spec`: parse,
evaluate, schema, diagnostics) and its consumers (:mod:`rlsched.plan`, the
simulator through :meth:`Spec.to_pool_specs`, and the runtime). Loading a spec
returns a :class:`Spec` or raises :class:`SpecError` carrying every diagnostic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlsched.errors import RlschedError

Severity = Literal["error", "warning"]
Capacity = Literal["on_prem", "on_demand", "spot"]
#: where a job larger than one node takes its GPUs (:class:`rlsched.cluster.model.GangMode`'s values)
Gang = Literal["whole-nodes", "packed"]


@dataclass(frozen=True, slots=True)
class SourceRange:
    """Where something is in a spec file (1-based line and column)."""

    filename: str
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One problem found in a spec (Terraform's tfdiags shape)."""

    severity: Severity
    summary: str
    detail: str = ""
    range: SourceRange | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``validate --json`` shape: ``{severity, summary, detail, range: {filename, start, end}}``."""
        rng = None
        if self.range is not None:
            r = self.range
            rng = {
                "filename": r.filename,
                "start": {"line": r.line, "column": r.column},
                "end": {"line": r.end_line or r.line, "column": r.end_column or r.column},
            }
        return {"severity": self.severity, "summary": self.summary, "detail": self.detail, "range": rng}


class SpecError(RlschedError):
    """A spec with errors; ``diagnostics`` holds all of them, not just the first."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = diagnostics
        first = next((d for d in diagnostics if d.severity == "error"), diagnostics[0] if diagnostics else None)
        where = f"{first.range}: " if first is not None and first.range is not None else ""
        more = f" (and {len(diagnostics) - 1} more)" if len(diagnostics) > 1 else ""
        super().__init__(f"{where}{first.summary if first else 'invalid spec'}{more}")


@dataclass(frozen=True, slots=True)
class MigLayoutDecl:
    """``mig_layout "NAME" { devices = { "1g.10gb" = 2, ... } }`` (mig-parted vocabulary: counts only)."""

    name: str
    devices: dict[str, int]
    range: SourceRange | None = None


@dataclass(frozen=True, slots=True)
class SpotMarketDecl:
    max_price_per_gpu_hour: float | None = None
    on_preemption: Literal["requeue", "checkpoint_and_requeue", "fail"] = "checkpoint_and_requeue"
    fallback_pool: str | None = None
    min_on_demand: int = 0


@dataclass(frozen=True, slots=True)
class DisruptionDecl:
    drain_timeout_s: float = 900.0
    max_unavailable: int = 1


@dataclass(frozen=True, slots=True)
class LifecycleDecl:
    prevent_destroy: bool = False
    create_before_destroy: bool = False


@dataclass(frozen=True, slots=True)
class PoolDecl:
    """``pool "NAME" { ... }``.

    Attributes:
        name: the pool's key (``pool.NAME``).
        gpu_model: canonical catalogue name (``H100-80GB``); NVML marketing names resolve.
        capacity: on_prem, on_demand or spot.
        nodes: hostnames of the nodes in the pool (for plan/apply); empty when only counted.
        node_count: nodes for simulation when ``nodes`` is not given (``min_nodes``..``max_nodes`` elastic).
        min_nodes / max_nodes: elastic bounds (simulation; default 0..node_count for elastic pools).
        gpus_per_node: GPUs per node for simulation (default 8).
        gpus: "all" or the GPU indices of each node the pool manages.
        mig_layout: name of a ``mig_layout`` block, or None when ``mig = "disabled"``.
        timeslice_replicas: time-slicing replicas (None = no time-slicing).
        cost_per_gpu_hour: amortised / fixed price (None = market price).
        region: market region.
        gang: gang placement of jobs larger than one node, ``whole-nodes`` (the default, as real
            fleets) or ``packed`` (any free GPUs); the simulator and the live service both follow it.
        spot_market / disruption / lifecycle: nested blocks.
        display_name: free text.
    """

    name: str
    gpu_model: str
    capacity: Capacity = "on_prem"
    nodes: tuple[str, ...] = ()
    node_count: int | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    gpus_per_node: int | None = None
    gpus: Literal["all"] | tuple[int, ...] = "all"
    mig_layout: str | None = None
    timeslice_replicas: int | None = None
    cost_per_gpu_hour: float | None = None
    region: str = ""
    gang: Gang = "whole-nodes"
    spot_market: SpotMarketDecl | None = None
    disruption: DisruptionDecl = field(default_factory=DisruptionDecl)
    lifecycle: LifecycleDecl = field(default_factory=LifecycleDecl)
    display_name: str = ""
    range: SourceRange | None = None


@dataclass(frozen=True, slots=True)
class QuotaDecl:
    """``quota "NAME" { pool, principal, max_gpus | max_slices, max_gpu_hours_per_day }``."""

    name: str
    pool: str
    principal: str
    max_gpus: int | None = None
    max_slices: dict[str, int] = field(default_factory=dict)
    max_gpu_hours_per_day: float | None = None
    range: SourceRange | None = None


@dataclass(frozen=True, slots=True)
class HealthDecl:
    max_decision_latency_s: float = 0.05
    min_success_rate: float = 0.95


@dataclass(frozen=True, slots=True)
class TwinDecl:
    """``twin { every, days, margin, candidates }`` in a policy block: the service's digital twin.

    Attributes:
        every_s: how often the service replays its history on the simulator (seconds).
        days: how many days of history each replay covers.
        margin: how much better (mean JCT, as a fraction) a policy must do than the served one, on two
            consecutive replays, before ``adapt = "switch"`` serves it.
        candidates: learned models (paths or ``models:/`` URIs) replayed beside the heuristics; one is only
            ever switched to when its promotion gate (``family_gate``) passed.
    """

    every_s: float = 6 * 3600.0
    days: float = 7.0
    margin: float = 0.05
    candidates: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicyDecl:
    """``policy "NAME" { scheduler, model, fallback, weights, adapt, health {}, twin {} }``.

    ``scheduler`` is ``rl`` or a heuristic name (``weighted-priority``...; the
    underscore spelling ``weighted_priority`` is accepted); ``fallback`` must be a heuristic.
    ``adapt`` is what the service does with its digital twin's findings: ``off`` (the twin only
    runs with a ``twin`` block, and only publishes metrics), ``recommend`` (audit the better policy)
    or ``switch`` (serve it, with hysteresis; see :class:`TwinDecl`).
    """

    name: str
    scheduler: str
    model: str | None = None
    fallback: str = "weighted-priority"
    weights: dict[str, float] = field(default_factory=dict)
    health: HealthDecl = field(default_factory=HealthDecl)
    range: SourceRange | None = None
    adapt: Literal["off", "recommend", "switch"] = "off"
    twin: TwinDecl | None = None


@dataclass(frozen=True, slots=True)
class Spec:
    """A fully evaluated, schema-checked pool spec."""

    pools: dict[str, PoolDecl]
    layouts: dict[str, MigLayoutDecl] = field(default_factory=dict)
    quotas: dict[str, QuotaDecl] = field(default_factory=dict)
    policies: dict[str, PolicyDecl] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    variables: dict[str, Any] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    warnings: tuple[Diagnostic, ...] = ()
    #: settings ``validate`` could not know (from a variable given no value), e.g. ``pool.a.node_count``;
    #: always empty outside validate, where such a variable is an error
    unknown: tuple[str, ...] = ()
