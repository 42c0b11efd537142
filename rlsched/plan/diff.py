"""Diff a spec against refreshed inventory and state: the plan as an immutable value.

``plan(spec, observed_nodes, state)`` is a pure function. It compares **declared
attributes only** (shared/docs/HCL.md 1.4): MIG mode and layout counts (placement
ignored), pool membership, and pool/quota/policy settings. Telemetry (processes,
running jobs, utilisation) never creates a change; running jobs only feed the
drain estimate in a change's reasons.

Objects and their addresses:

* ``pool.NAME``, ``quota.NAME``, ``policy.NAME``: rlsched-owned configuration.
* ``node.HOST``: membership of a node in a pool (enrol ``+``, release ``-``, move ``~``).
* ``gpu.HOST/IDX``: MIG mode and layout of one GPU, keyed by UUID in state.

Reasons (``Change.reasons``) explain a change to people; apply is driven by the
structured fields (action, before/after, disruptive) and never parses them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rlsched.plan.state import ResourceRecord, State, new_lineage
from rlsched.runtime.backend import GpuInfo, NodeInfo
from rlsched.spec.model import Diagnostic, PolicyDecl, PoolDecl, Spec

PLAN_FORMAT_VERSION = 1


class Action(str, Enum):
    """What a change does; the value is the glyph shown in the plan (Terraform's ``plans.Action``)."""

    NOOP = "="  # nothing to do to the object; with ``adopt`` it is recorded in state
    CREATE = "+"
    UPDATE = "~"
    DELETE = "-"
    REPLACE = "-/+"  # destroy then create: a GPU whose MIG instances are all recreated
    CREATE_THEN_DELETE = "+/-"
    UNKNOWN = "?"  # node unreachable at refresh: nothing may be planned for it

    @property
    def glyph(self) -> str:
        return self.value

    def is_replace(self) -> bool:
        return self in (Action.REPLACE, Action.CREATE_THEN_DELETE)

    @property
    def label(self) -> str:
        """Terraform's JSON spelling (``create``, ``update``, ``delete``, ``replace``, ``no-op``, ``unknown``)."""
        return {"NOOP": "no-op", "CREATE_THEN_DELETE": "create-then-delete"}.get(self.name, self.name.lower())


@dataclass(frozen=True, slots=True)
class Change:
    """One planned change to one object.

    Attributes:
        type / name / key: the object (``gpu``, ``gpu-h100-04/0``, ``GPU-...``); ``address`` is ``type.name``.
        action: what happens.
        before / after: declared attributes (JSON values); None for create / delete.
        reasons: why, for people (``recreates all 7 MIG instances on GPU-...``, ``needs GPU reset``, drains).
        adopt: a NOOP that records an already-matching object in state.
        node: the host the change touches (None for pool/quota/policy).
        pool: the pool whose ``disruption`` settings govern it.
        disruptive: needs the node cordoned and drained first.
        running_jobs: jobs on ``node`` at refresh (the drain estimate; telemetry, never diffed).
        observed: identity to record in state (GPU index, UUID, model, MIG UUIDs).
        depends_on: addresses to record in state.
    """

    type: str
    name: str
    key: str
    action: Action
    before: Mapping[str, Any] | None = None
    after: Mapping[str, Any] | None = None
    reasons: tuple[str, ...] = ()
    adopt: bool = False
    node: str | None = None
    pool: str | None = None
    disruptive: bool = False
    running_jobs: int = 0
    observed: Mapping[str, Any] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        return f"{self.type}.{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "type": self.type, "name": self.name, "key": self.key,
                "action": self.action.value, "action_name": self.action.label,
                "before": _jsonable(self.before), "after": _jsonable(self.after), "reasons": list(self.reasons),
                "adopt": self.adopt, "node": self.node, "pool": self.pool, "disruptive": self.disruptive,
                "running_jobs": self.running_jobs, "observed": _jsonable(self.observed),
                "depends_on": list(self.depends_on)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Change:
        return cls(type=d["type"], name=d["name"], key=d["key"], action=Action(d["action"]), before=d.get("before"),
                   after=d.get("after"), reasons=tuple(d.get("reasons") or ()), adopt=bool(d.get("adopt")),
                   node=d.get("node"), pool=d.get("pool"), disruptive=bool(d.get("disruptive")),
                   running_jobs=int(d.get("running_jobs") or 0), observed=dict(d.get("observed") or {}),
                   depends_on=tuple(d.get("depends_on") or ()))


@dataclass(frozen=True, slots=True)
class Drift:
    """A declared attribute that changed outside rlsched since the last apply (state vs refresh)."""

    address: str
    attribute: str
    before: Any
    after: Any

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "attribute": self.attribute, "before": self.before, "after": self.after}


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """What plan saw of one node: apply compares it with a fresh read before touching the node."""

    hostname: str
    fingerprint: str
    gpus: Mapping[str, Mapping[str, Any]]  # uuid -> {index, mig_enabled, mig_layout, mig_uuids}

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "gpus": {u: dict(g) for u, g in self.gpus.items()}}

    @classmethod
    def of(cls, node: NodeInfo) -> NodeSnapshot:
        gpus = {g.uuid: {"index": g.index, **gpu_declared(g), "mig_uuids": sorted(d.uuid for d in g.mig_devices)}
                for g in node.gpus}
        return cls(node.hostname, node.fingerprint(), gpus)


@dataclass(frozen=True, slots=True)
class Disruption:
    """A pool's disruption budget, copied into the plan so that a saved plan applies without the spec."""

    max_unavailable: int = 1
    drain_timeout_s: float = 900.0


@dataclass(frozen=True, slots=True)
class Summary:
    adopt: int
    add: int
    change: int
    destroy: int
    gpus_to_reconfigure: int
    nodes_to_drain: int

    def line(self) -> str:
        """``Plan: N to add, N to change, N to destroy. N GPUs to reconfigure, M nodes to drain.``."""
        adopt = f"{self.adopt} to adopt, " if self.adopt else ""
        return (f"Plan: {adopt}{self.add} to add, {self.change} to change, {self.destroy} to destroy. "
                f"{self.gpus_to_reconfigure} GPU{'' if self.gpus_to_reconfigure == 1 else 's'} to reconfigure, "
                f"{self.nodes_to_drain} node{'' if self.nodes_to_drain == 1 else 's'} to drain.")


@dataclass(frozen=True, slots=True)
class Plan:
    """An immutable plan: the changes, the drift, and the prior-state fingerprint it was made against.

    Attributes:
        changes: every change, in a stable order (type, then natural address order); UNKNOWN entries included.
        drift: declared attributes changed outside rlsched since the last apply.
        lineage / serial: the state the plan was made against (lineage minted when there was none).
        nodes: snapshot of every reachable node the plan read (fingerprints for apply's re-check).
        disruption: per-pool disruption budget.
        diagnostics: problems found while planning (errors make the plan unapplyable).
    """

    changes: tuple[Change, ...] = ()
    drift: tuple[Drift, ...] = ()
    lineage: str = ""
    serial: int = 0
    nodes: Mapping[str, NodeSnapshot] = field(default_factory=dict)
    disruption: Mapping[str, Disruption] = field(default_factory=dict)
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def errored(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)

    @property
    def actionable(self) -> tuple[Change, ...]:
        """Changes apply performs (adoptions included; UNKNOWN and plain NOOP excluded)."""
        return tuple(c for c in self.changes if c.action not in (Action.NOOP, Action.UNKNOWN) or c.adopt)

    @property
    def unknown(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.action is Action.UNKNOWN)

    @property
    def has_changes(self) -> bool:
        return bool(self.actionable)

    @property
    def summary(self) -> Summary:
        cfg = [c for c in self.actionable if c.type != "gpu" and not c.adopt]
        gpus = [c for c in self.actionable if c.type == "gpu" and not c.adopt]
        return Summary(
            adopt=sum(1 for c in self.actionable if c.adopt),
            add=sum(1 for c in cfg if c.action is Action.CREATE),
            change=sum(1 for c in cfg if c.action is Action.UPDATE or c.action.is_replace()),
            destroy=sum(1 for c in (*cfg, *gpus) if c.action is Action.DELETE),
            gpus_to_reconfigure=sum(1 for c in gpus if c.action in (Action.UPDATE, Action.REPLACE)),
            nodes_to_drain=len({c.node for c in self.actionable if c.disruptive and c.node}),
        )

    def to_json(self) -> dict[str, Any]:
        s = self.summary
        return {"format_version": PLAN_FORMAT_VERSION, "lineage": self.lineage, "serial": self.serial,
                "changes": [c.to_json() for c in self.changes], "drift": [d.to_json() for d in self.drift],
                "nodes": {h: n.to_json() for h, n in sorted(self.nodes.items())},
                "disruption": {p: dataclasses.asdict(d) for p, d in sorted(self.disruption.items())},
                "diagnostics": [d.to_json() for d in self.diagnostics],
                "summary": dataclasses.asdict(s) | {"has_changes": self.has_changes}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Plan:
        nodes = {h: NodeSnapshot(h, n["fingerprint"], n.get("gpus") or {}) for h, n in (d.get("nodes") or {}).items()}
        disruption = {p: Disruption(int(x["max_unavailable"]), float(x["drain_timeout_s"]))
                      for p, x in (d.get("disruption") or {}).items()}
        return cls(changes=tuple(Change.from_json(c) for c in d.get("changes") or ()),
                   drift=tuple(Drift(x["address"], x["attribute"], x["before"], x["after"])
                               for x in d.get("drift") or ()),
                   lineage=str(d["lineage"]), serial=int(d["serial"]), nodes=nodes, disruption=disruption)


# --- declared attributes ------------------------------------------------------------------


def _jsonable(x: Any) -> Any:
    """Normalise to plain JSON values (tuples -> lists, sorted dict keys) so that spec and state compare equal."""
    if x is None:
        return None
    return json.loads(json.dumps(x, sort_keys=True, default=list))


def _decl_attrs(decl: Any, drop: Iterable[str]) -> dict[str, Any]:
    d = dataclasses.asdict(decl)
    for k in ("name", "range", *drop):
        d.pop(k, None)
    return dict(_jsonable(d))


#: pool attributes added after states were first written, with the value a record without them
#: had: an older state's pool compares equal to a spec that leaves them at their default
_POOL_ADDED_DEFAULTS: dict[str, Any] = {"gang": "whole-nodes"}


def _policy_attributes(p: PolicyDecl) -> dict[str, Any]:
    """A policy's declared attributes; the digital twin's ``adapt`` and ``twin`` only when set, so a block
    without them plans (and compares with older states) as before they existed."""
    drop = [k for k, default in (("adapt", "off"), ("twin", None)) if getattr(p, k) == default]
    return _decl_attrs(p, drop)


def _recorded(type_: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A state record's attributes, completed with :data:`_POOL_ADDED_DEFAULTS` for a pool."""
    if type_ != "pool":
        return dict(attributes)
    return {**_POOL_ADDED_DEFAULTS, **attributes}


def pool_attributes(p: PoolDecl) -> dict[str, Any]:
    """A pool's declared attributes; membership (``nodes``) lives in node objects, not here."""
    return _decl_attrs(p, ("nodes",))


def gpu_declared(g: GpuInfo) -> dict[str, Any]:
    """The declared attributes of a GPU as observed: MIG mode and layout counts (placement ignored)."""
    return {"mig_enabled": bool(g.mig_current), "mig_layout": dict(sorted(g.layout_counts().items()))}


def _desired_gpu(spec: Spec, pool: PoolDecl) -> dict[str, Any]:
    if pool.mig_layout is None:
        return {"mig_enabled": False, "mig_layout": {}}
    layout = spec.layouts.get(pool.mig_layout)
    devices = dict(layout.devices) if layout is not None else {}
    return {"mig_enabled": True, "mig_layout": dict(sorted((k, int(v)) for k, v in devices.items() if int(v) > 0))}


def _natural(s: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def format_duration(seconds: float) -> str:
    """``900`` -> ``15m``, ``90`` -> ``90s``, ``3600`` -> ``1h`` (the spelling specs use)."""
    s = round(seconds)
    if s and s % 3600 == 0:
        return f"{s // 3600}h"
    if s and s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def format_layout(layout: Mapping[str, int]) -> str:
    """``{"1g.10gb"=2,"3g.40gb"=1}``: mig-parted counts, as the plan shows them."""
    return "{" + ",".join(f'"{k}"={v}' for k, v in sorted(layout.items())) + "}"


# --- the diff -----------------------------------------------------------------------------

_TYPE_ORDER = {"pool": 0, "quota": 1, "policy": 2, "node": 3, "gpu": 4}


def _sort_key(c: Change) -> tuple[Any, ...]:
    return (_TYPE_ORDER.get(c.type, 9), _natural(c.name))


def _drain_reason(host: str, jobs: int, timeout_s: float) -> str:
    if jobs:
        return f"DISRUPTIVE: drains node {host}: {jobs} job{'s' if jobs != 1 else ''} " \
               f"(drain_timeout {format_duration(timeout_s)})"
    return f"drains node {host}: 0 jobs, idle (drain_timeout {format_duration(timeout_s)})"


def _gpu_change_reasons(g: GpuInfo, want: Mapping[str, Any]) -> tuple[Action, list[str]]:
    have = gpu_declared(g)
    reasons: list[str] = []
    mode_change = have["mig_enabled"] != want["mig_enabled"]
    n_old = len(g.mig_devices)
    n_new = sum(want["mig_layout"].values())
    if mode_change or g.mig_pending != g.mig_current:
        was = "enabled" if have["mig_enabled"] else "disabled"
        now = "enabled" if want["mig_enabled"] else "disabled"
        reasons.append(f"needs GPU reset (MIG mode {was} -> {now})" if mode_change else "needs GPU reset")
    if not want["mig_enabled"]:
        if n_old:
            reasons.append(f"destroys all {n_old} MIG instances on {g.uuid}")
        return Action.UPDATE, reasons
    if have["mig_layout"] != want["mig_layout"]:
        if n_old:
            reasons.append(f"recreates all {n_old} MIG instances on {g.uuid}: destroys {n_old}, creates {n_new}")
        else:
            reasons.append(f"creates {n_new} MIG instances on {g.uuid}")
        return Action.REPLACE, reasons
    return Action.UPDATE, reasons


def plan(spec: Spec, observed_nodes: Mapping[str, NodeInfo] | Iterable[NodeInfo], state: State | None, *,
         running_jobs: Mapping[str, int] | None = None) -> Plan:
    """Compute the changes that make the GPUs and pools match ``spec``.

    Args:
        spec: the evaluated spec.
        observed_nodes: refreshed inventory (hostname -> node, or an iterable of nodes). A spec node
            missing from it is treated as unreachable.
        state: the current state, or None when there is none (a lineage is minted anyway).
        running_jobs: jobs per node at refresh, for drain estimates only (defaults to GPU processes).

    Returns:
        The plan. Problems (GPU model mismatch, illegal layout, a node in two pools,
        ``prevent_destroy``) are error diagnostics in ``Plan.diagnostics``, not exceptions, so
        that all of them are reported at once.
    """
    nodes = dict(observed_nodes) if isinstance(observed_nodes, Mapping) else {n.hostname: n for n in observed_nodes}
    st = state if state is not None else State.empty(new_lineage())
    diff = _Diff(spec, nodes, st, dict(running_jobs or {}), disruption=_disruption_budgets(spec, st))
    # 1. pools, quotas, policies: rlsched-owned configuration, no drift possible.
    diff.configuration()
    # 2. membership: which pool each spec node belongs to (one pool per node at most), then each member node.
    member = diff.membership()
    for host in sorted(member, key=_natural):
        diff.member_node(host, member[host])
    # 3. nodes in state that no pool declares any more: release (drain), unless unreachable.
    for rec in st.of_type("node"):
        if rec.name not in member:
            diff.released_node(rec)
    return diff.result()


def _disruption_budgets(spec: Spec, st: State) -> dict[str, Disruption]:
    """Disruption budget per pool: the spec's, and for pools only in state, the ones recorded there."""
    disruption: dict[str, Disruption] = {}
    for prec in st.of_type("pool"):
        d = prec.attributes.get("disruption") or {}
        disruption[prec.name] = Disruption(int(d.get("max_unavailable", 1) or 1), float(d.get("drain_timeout_s", 900)))
    for p in spec.pools.values():
        disruption[p.name] = Disruption(max(1, p.disruption.max_unavailable), p.disruption.drain_timeout_s)
    return disruption


@dataclass
class _Diff:
    """A plan being built, one step at a time: the inputs and what the steps have found so far.

    The steps append in the order the plan reports diagnostics; changes and drift are sorted
    at the end (stably, so equal keys keep the order the steps found them in).
    """

    spec: Spec
    nodes: dict[str, NodeInfo]
    st: State
    jobs: dict[str, int]
    disruption: dict[str, Disruption]
    changes: list[Change] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    diags: list[Diagnostic] = field(default_factory=list)
    snapshots: dict[str, NodeSnapshot] = field(default_factory=dict)
    #: (kind, where) of the hardware checks already reported: one diagnostic per pool and node or model
    checked: set[tuple[str, str]] = field(default_factory=set)

    def jobs_on(self, host: str) -> int:
        """Jobs running on ``host``: as given, else its GPU processes (0 for an unknown node)."""
        if host in self.jobs:
            return int(self.jobs[host])
        n = self.nodes.get(host)
        return sum(g.processes for g in n.gpus) if n is not None else 0

    def result(self) -> Plan:
        """The plan of everything found, changes and drift in their display order."""
        self.changes.sort(key=_sort_key)
        self.drift.sort(key=lambda d: (_natural(d.address), d.attribute))
        return Plan(changes=tuple(self.changes), drift=tuple(self.drift), lineage=self.st.lineage,
                    serial=self.st.serial, nodes=dict(sorted(self.snapshots.items())),
                    disruption=dict(sorted(self.disruption.items())), diagnostics=tuple(self.diags))

    # --- 1. configuration ---------------------------------------------------------------

    def configuration(self) -> None:
        """Create, update or delete pools, quotas and policies to match the spec."""
        spec = self.spec
        desired_cfg: dict[str, dict[str, tuple[dict[str, Any], tuple[str, ...]]]] = {
            "pool": {n: (pool_attributes(p), ()) for n, p in spec.pools.items()},
            "quota": {n: (_decl_attrs(q, ()), (f"pool.{q.pool}",)) for n, q in spec.quotas.items()},
            "policy": {n: (_policy_attributes(p), ()) for n, p in spec.policies.items()},
        }
        for type_, want in desired_cfg.items():
            self._declared_config(type_, want)
            self._removed_config(type_, want)

    def _declared_config(self, type_: str, want: Mapping[str, tuple[dict[str, Any], tuple[str, ...]]]) -> None:
        for name, (attrs, deps) in want.items():
            rec = self.st.get(type_, name)
            if rec is None:
                self.changes.append(Change(type_, name, name, Action.CREATE, None, attrs, depends_on=deps))
            elif _jsonable(_recorded(type_, rec.attributes)) != attrs:
                self.changes.append(Change(type_, name, name, Action.UPDATE, _recorded(type_, rec.attributes), attrs,
                                           depends_on=deps))

    def _removed_config(self, type_: str, want: Mapping[str, Any]) -> None:
        for orec in self.st.of_type(type_):
            if orec.name in want:
                continue
            if type_ == "pool" and (orec.attributes.get("lifecycle") or {}).get("prevent_destroy"):
                self.diags.append(_prevent_destroy(f"pool.{orec.name}", "the plan destroys it (its block was removed)",
                                                   None))
            self.changes.append(Change(type_, orec.name, orec.key, Action.DELETE, orec.attributes, None))

    # --- 2. member nodes ------------------------------------------------------------------

    def membership(self) -> dict[str, PoolDecl]:
        """The pool of each spec node; a node declared in a second pool is an error (the first pool keeps it)."""
        member: dict[str, PoolDecl] = {}
        for p in sorted(self.spec.pools.values(), key=lambda p: p.name):
            for host in p.nodes:
                if host in member and member[host].name != p.name:
                    other = member[host]
                    self.diags.append(Diagnostic(
                        "error", "Node in two pools",
                        f"{host} is in pool.{other.name}{f' ({other.range})' if other.range else ''} and "
                        f"pool.{p.name}{f' ({p.range})' if p.range else ''}; a node belongs to one pool at most.",
                        p.range))
                    continue
                member[host] = p
        return member

    def member_node(self, host: str, pool: PoolDecl) -> None:
        """The changes of one node a pool declares: its membership, its GPUs, GPUs to forget, an uncordon."""
        info = self.nodes.get(host)
        rec = self.st.get("node", host)
        if info is None or not info.reachable:
            why = "not reported by the backend" if info is None else "unreachable at refresh"
            self.changes.append(Change("node", host, host, Action.UNKNOWN, rec.attributes if rec else None,
                                       {"pool": pool.name}, (f"{why}: no change planned",), node=host, pool=pool.name))
            return
        self.snapshots[host] = NodeSnapshot.of(info)
        node_obs = {"fingerprint": info.fingerprint()}
        node_changes = self._enrolment(host, pool, info, rec, node_obs)
        selected = [g for g in info.gpus if pool.gpus == "all" or g.index in pool.gpus]
        gpu_changes = self._gpu_changes(host, pool, selected)
        if gpu_changes and not any(c.disruptive for c in node_changes):
            first = gpu_changes[0]
            gpu_changes[0] = dataclasses.replace(first, reasons=(
                *first.reasons, _drain_reason(host, self.jobs_on(host), self.disruption[pool.name].drain_timeout_s)))
        node_changes.extend(self._forgotten_gpus(host, pool, info, selected))
        if (rec is not None and rec.observed.get("cordoned_by_rlsched") and info.cordoned
                and not gpu_changes and not any(c.disruptive for c in node_changes)):
            # A node that an interrupted or failed apply left cordoned is uncordoned, unless it is drained anyway.
            node_changes.append(Change("node", host, host, Action.UPDATE, {"pool": pool.name, "cordoned": True},
                                       {"pool": pool.name, "cordoned": False},
                                       ("uncordon: left cordoned by an interrupted or failed apply",),
                                       node=host, pool=pool.name, observed=node_obs,
                                       depends_on=(f"pool.{pool.name}",)))
        self.changes.extend(node_changes)
        self.changes.extend(gpu_changes)

    def _enrolment(self, host: str, pool: PoolDecl, info: NodeInfo, rec: ResourceRecord | None,
                   node_obs: dict[str, Any]) -> list[Change]:
        """Enrol a node new to state, or move it (drained) from the pool state records it in."""
        if rec is None:
            return [Change("node", host, host, Action.CREATE, None, {"pool": pool.name},
                           (f"enrols {host} ({_gpus(len(info.gpus))}) in pool.{pool.name}",),
                           node=host, pool=pool.name, observed=node_obs, depends_on=(f"pool.{pool.name}",))]
        old = rec.attributes.get("pool")
        if old == pool.name:
            return []
        if old in self.spec.pools and self.spec.pools[old].lifecycle.prevent_destroy:
            self.diags.append(_prevent_destroy(f"pool.{old}", f"the plan moves node {host} out of it",
                                               self.spec.pools[old].range))
        jobs = self.jobs_on(host)
        return [Change("node", host, host, Action.UPDATE, rec.attributes, {"pool": pool.name},
                       (f"moves {host} from pool.{old} to pool.{pool.name}",
                        _drain_reason(host, jobs, self.disruption[pool.name].drain_timeout_s)),
                       node=host, pool=pool.name, disruptive=True, running_jobs=jobs,
                       observed=node_obs, depends_on=(f"pool.{pool.name}",))]

    def _gpu_changes(self, host: str, pool: PoolDecl, selected: list[GpuInfo]) -> list[Change]:
        """Reconfigure each managed GPU whose MIG mode or layout differs from the pool's.

        A GPU that already matches is adopted (a no-op change, added to the plan here) when
        state does not record it as it is; its drift is recorded either way.
        """
        want = _desired_gpu(self.spec, pool)
        layout_dep = (f"mig_layout.{pool.mig_layout}",) if pool.mig_layout else ()
        deps = (f"node.{host}", f"pool.{pool.name}", *layout_dep)
        gpu_changes: list[Change] = []
        for g in sorted(selected, key=lambda g: g.index):
            self._check_gpu(pool, host, g, want)
            name = f"{host}/{g.index}"
            have = gpu_declared(g)
            grec = self.st.get("gpu", g.uuid)
            obs = {"host": host, "index": g.index, "uuid": g.uuid, "name": g.name, "model": g.model}
            if grec is not None:
                self.drift.extend(Drift(f"gpu.{grec.name}", k, grec.attributes.get(k), have[k]) for k in have
                                  if _jsonable(grec.attributes.get(k)) != _jsonable(have[k]))
            if have == want and g.mig_pending == g.mig_current:
                if grec is None or _jsonable(grec.attributes) != want or grec.name != name:
                    self.changes.append(Change("gpu", name, g.uuid, Action.NOOP, grec.attributes if grec else None,
                                               want, (f"gpu.{name} will be adopted (layout already matches)",),
                                               adopt=True, node=host, pool=pool.name, observed=obs, depends_on=deps))
                continue
            action, reasons = _gpu_change_reasons(g, want)
            gpu_changes.append(Change("gpu", name, g.uuid, action, have, want, tuple(reasons), node=host,
                                      pool=pool.name, disruptive=True, running_jobs=self.jobs_on(host), observed=obs,
                                      depends_on=deps))
        return gpu_changes

    def _check_gpu(self, pool: PoolDecl, host: str, g: GpuInfo, want: Mapping[str, Any]) -> None:
        """Plan-time checks that need the hardware: model match and layout fit (validate cannot know the GPUs)."""
        from rlsched.cluster.catalog import CATALOG, resolve_model_name
        from rlsched.cluster.feasibility import legal_layout

        expected = resolve_model_name(pool.gpu_model) or pool.gpu_model
        actual = resolve_model_name(g.model or g.name) or g.model or g.name
        if pool.gpu_model and actual and expected != actual:
            key = ("model", f"{pool.name}/{host}")
            if key not in self.checked:
                self.checked.add(key)
                self.diags.append(Diagnostic(
                    "error", "GPU model mismatch",
                    f'pool "{pool.name}" expects "{pool.gpu_model}", node {host} reports "{g.name}"', pool.range))
            return
        if not want["mig_enabled"]:
            return
        key = ("layout", f"{pool.name}/{actual}")
        if key in self.checked:
            return
        self.checked.add(key)
        model = CATALOG.get(actual)
        names = [p for p, n in want["mig_layout"].items() for _ in range(n)]
        if model is None:
            return
        if not model.mig_capable:
            self.diags.append(Diagnostic(
                "error", "Invalid MIG layout",
                f'pool "{pool.name}" declares a MIG layout but {g.name} ({host}) does not support MIG', pool.range))
        elif not legal_layout(model, names):
            desc = ", ".join(f'{n} × "{p}"' for p, n in want["mig_layout"].items())  # noqa: RUF001
            self.diags.append(Diagnostic(
                "error", "Invalid MIG layout",
                f"{desc} does not fit an {g.name} (mig_layout.{pool.mig_layout}, pool.{pool.name})", pool.range))

    def _forgotten_gpus(self, host: str, pool: PoolDecl, info: NodeInfo, selected: list[GpuInfo]) -> list[Change]:
        """GPUs in state on this node that the pool no longer manages (or that vanished): forget them."""
        present = {g.uuid for g in selected}
        all_uuids = {g.uuid for g in info.gpus}
        forgotten: list[Change] = []
        for grec in self.st.of_type("gpu"):
            if grec.observed.get("host") != host or grec.key in present:
                continue
            gone = grec.key not in all_uuids
            if gone:
                self.drift.append(Drift(f"gpu.{grec.name}", "present", True, False))
            why = (f"no longer reported by {host}; removed from state only" if gone
                   else f"no longer managed by pool.{pool.name}; layout kept, removed from state only")
            forgotten.append(Change("gpu", grec.name, grec.key, Action.DELETE, grec.attributes, None, (why,),
                                    node=host, pool=pool.name))
        return forgotten

    # --- 3. released nodes ----------------------------------------------------------------

    def released_node(self, rec: ResourceRecord) -> None:
        """Release (drain) a node that state records and no pool declares, unless it is unreachable."""
        host = rec.name
        old = str(rec.attributes.get("pool", ""))
        info = self.nodes.get(host)
        if info is None or not info.reachable:
            self.changes.append(Change("node", host, host, Action.UNKNOWN, rec.attributes, None,
                                       ("unreachable at refresh: not released",), node=host, pool=old))
            return
        self.snapshots[host] = NodeSnapshot.of(info)
        if self._prevents_destroy(old):
            self.diags.append(_prevent_destroy(f"pool.{old}", f"the plan releases node {host} from it",
                                               self.spec.pools[old].range if old in self.spec.pools else None))
        dis = self.disruption.get(old, Disruption())
        n_gpus = sum(1 for g in self.st.of_type("gpu") if g.observed.get("host") == host)
        jobs = self.jobs_on(host)
        self.changes.append(Change("node", host, host, Action.DELETE, rec.attributes, None,
                                   (f"releases {host} from pool.{old} ({n_gpus} GPUs forgotten; layouts kept)",
                                    _drain_reason(host, jobs, dis.drain_timeout_s)),
                                   node=host, pool=old, disruptive=True, running_jobs=jobs))

    def _prevents_destroy(self, pool: str) -> bool:
        """Whether ``pool`` has ``lifecycle.prevent_destroy``: as the spec declares it, else as state records it."""
        if pool in self.spec.pools:
            return bool(self.spec.pools[pool].lifecycle.prevent_destroy)
        rec = self.st.get("pool", pool)
        return bool(((rec.attributes if rec is not None else {}).get("lifecycle") or {}).get("prevent_destroy"))


def _prevent_destroy(address: str, what: str, rng: Any) -> Diagnostic:
    return Diagnostic("error", "Instance cannot be destroyed",
                      f"{address} has lifecycle.prevent_destroy set, but {what}. To continue, set "
                      f"prevent_destroy = false and apply that first, or keep the object in the configuration.",
                      rng)


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"
