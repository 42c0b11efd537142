"""Apply a plan to a GPU backend, one journaled step at a time.

Order (shared/docs/HCL.md 6): pools/quotas/policies are created or updated, nodes
are enrolled, already-matching GPUs adopted; then the disruptive work runs per pool
in batches of ``disruption.max_unavailable`` nodes: cordon, drain (wait until
``backend.running_jobs(host)`` is 0 or ``drain_timeout`` passes), set MIG mode,
set layout, assert (re-read and compare), uncordon. Node releases drain the same
way. Deletions of quotas, policies and pools come last.

Crash safety. The state is persisted after **every** step, and before a step that
touches hardware a ``started`` journal entry is persisted first (write-ahead), so a
process killed at any instant leaves a valid state file. Nothing in the next plan
depends on the journal: plan re-reads the hardware, so work the backend finished
before the state recorded it shows up as an adoption, not as a change, and the next
plan is exactly the remaining work. The one piece of intent only the state can
carry, "rlsched cordoned this node", is written *before* the cordon call.

Failure. A node whose step fails (drain timeout, NVML error, assert mismatch) is
marked ``failed`` in the journal and stays cordoned; the batch finishes, then apply
stops with an :class:`~rlsched.plan.errors.ApplyError`.

Test hook: ``RLSCHED_APPLY_STEP_DELAY`` (seconds, float) sleeps after every persisted
step, so tests can ``kill -9`` an apply half way through. It is read by the CLI and
passed as :attr:`ApplyOptions.step_delay_s`; it has no other effect.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlsched.plan.diff import Action, Change, Disruption, Plan, format_duration, format_layout, gpu_declared
from rlsched.plan.errors import ApplyError, NodeChangedError, StalePlanError
from rlsched.plan.state import ResourceRecord, State, StateStore
from rlsched.runtime.backend import BackendError, GpuBackend, NodeInfo

STEP_DELAY_ENV = "RLSCHED_APPLY_STEP_DELAY"


@dataclass
class ApplyOptions:
    """Knobs of one apply.

    Attributes:
        step_delay_s: sleep after every persisted step (test hook, see module docstring).
        drain_poll_s: how often a drain re-reads ``running_jobs``.
        progress: receives one human line per step (``node.gpu-h100-03: Cordoned``).
        sleep / clock: injectable for tests of drain timeouts.
    """

    step_delay_s: float = 0.0
    drain_poll_s: float = 1.0
    progress: Callable[[str], None] = field(default=lambda _line: None)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What an apply did (counts for the closing line)."""

    added: int = 0
    changed: int = 0
    destroyed: int = 0
    adopted: int = 0
    gpus_reconfigured: int = 0
    nodes_drained: int = 0

    def line(self) -> str:
        adopt = f"{self.adopted} adopted, " if self.adopted else ""
        return (f"Apply complete! Resources: {adopt}{self.added} added, {self.changed} changed, "
                f"{self.destroyed} destroyed. {self.gpus_reconfigured} GPU{'' if self.gpus_reconfigured == 1 else 's'} "
                f"reconfigured, {self.nodes_drained} node{'' if self.nodes_drained == 1 else 's'} drained.")


class _NodeFailed(Exception):
    """One node's step failed; the node stays cordoned (internal)."""


def check_not_stale(plan: Plan, state: State | None) -> None:
    """Refuse a saved plan made against another state (Terraform's "Saved plan is stale").

    A plan made against no state carries a freshly minted lineage and serial 0; it
    applies only while there is still no state, so it cannot be applied twice.
    """
    short = plan.lineage[:8] + "…"
    if state is None:
        if plan.serial != 0:
            raise StalePlanError(f"Saved plan is stale: there is no state, but the plan was made against serial "
                                 f"{plan.serial} (lineage {short}); wrong --state?")
        return
    if state.lineage != plan.lineage:
        raise StalePlanError(f"Saved plan is stale: state lineage {state.lineage[:8]}… != plan lineage {short}; "
                             "it was made against another state")
    if state.serial != plan.serial:
        raise StalePlanError(f"Saved plan is stale: state serial {state.serial} != plan serial {plan.serial} "
                             f"(lineage {short})")


def describe_node_change(before: Mapping[str, Mapping[str, Any]], now: NodeInfo) -> str:
    """Say what differs between a planned node snapshot and the node now (for "changed since plan")."""
    parts: list[str] = []
    now_gpus = {g.uuid: g for g in now.gpus}
    for u, g in now_gpus.items():
        old = before.get(u)
        idx = g.index
        if old is None:
            parts.append(f"new GPU {idx} ({u})")
            continue
        have = gpu_declared(g)
        if bool(old.get("mig_enabled")) != have["mig_enabled"]:
            parts.append(f"GPU {idx} MIG mode now {'enabled' if have['mig_enabled'] else 'disabled'}")
        elif dict(old.get("mig_layout") or {}) != have["mig_layout"]:
            layout = " ".join(f"{p}×{n}" for p, n in sorted(have["mig_layout"].items())) or "empty"  # noqa: RUF001
            parts.append(f"GPU {idx} MIG layout now {layout}")
        elif sorted(old.get("mig_uuids") or []) != sorted(d.uuid for d in g.mig_devices):
            parts.append(f"GPU {idx} MIG instances recreated")
        elif g.mig_pending != g.mig_current:
            parts.append(f"GPU {idx} MIG mode change pending")
    for u, old in before.items():
        if u not in now_gpus:
            parts.append(f"GPU {old.get('index')} ({u}) gone")
    return "; ".join(parts) or "fingerprint differs"


class Applier:
    """Executes one plan against a backend, persisting state after every step.

    Args:
        plan: the plan (made now, or loaded from a saved plan file).
        backend: the GPU backend the plan was made against.
        store: where state is persisted (the caller holds its lock).
        state: the current state (None = no state yet; the plan's lineage is used).
        options: see :class:`ApplyOptions`.
    """

    def __init__(self, plan: Plan, backend: GpuBackend, store: StateStore, state: State | None,
                 options: ApplyOptions | None = None) -> None:
        check_not_stale(plan, state)
        self.plan = plan
        self.backend = backend
        self.store = store
        self.state = state if state is not None else State.empty(plan.lineage)
        self.opt = options or ApplyOptions()
        self.apply_id = str(uuid.uuid4())
        self._checked: set[str] = set()
        self._counts: dict[str, int] = dict.fromkeys(
            ("added", "changed", "destroyed", "adopted", "gpus_reconfigured", "nodes_drained"), 0)

    # -- persistence ------------------------------------------------------------------

    def _commit(self, step: str, address: str, status: str, detail: str = "", **extra: Any) -> None:
        """Journal a step and persist the state (bumping its serial); then the test-hook delay."""
        entry: dict[str, Any] = {"apply_id": self.apply_id, "step": step, "address": address, "status": status}
        if detail:
            entry["detail"] = detail
        entry.update(extra)
        self.state.log(entry)
        self.store.write(self.state)
        if self.opt.step_delay_s > 0:
            self.opt.sleep(self.opt.step_delay_s)

    def _say(self, line: str) -> None:
        self.opt.progress(line)

    # -- checks -------------------------------------------------------------------------

    def _check_node(self, host: str) -> NodeInfo:
        """Re-read a node right before its first step and refuse if it changed since the plan."""
        try:
            now = self.backend.node(host)
        except BackendError as exc:
            raise ApplyError(f"{host}: cannot read the node before touching it ({exc}); run plan again") from None
        if host in self._checked:
            return now
        snap = self.plan.nodes.get(host)
        if snap is not None and now.fingerprint() != snap.fingerprint:
            self._commit("check", f"node.{host}", "refused", describe_node_change(snap.gpus, now))
            raise NodeChangedError(host, describe_node_change(snap.gpus, now))
        self._checked.add(host)
        return now

    # -- the run ------------------------------------------------------------------------

    def run(self) -> ApplyResult:
        """Apply every change; raises ApplyError (state persisted) on the first failed batch."""
        changes = self.plan.actionable
        cfg = [c for c in changes if c.type in ("pool", "quota", "policy")]
        order = {"pool": 0, "quota": 1, "policy": 2}
        for c in sorted((c for c in cfg if c.action is not Action.DELETE), key=lambda c: order[c.type]):
            self._apply_config(c)
        for c in changes:
            if c.type == "node" and c.action is Action.CREATE:
                self._enrol(c)
        for c in changes:
            if c.type == "gpu" and (c.adopt or c.action is Action.DELETE):
                self._record_only(c)
        for c in changes:
            if c.type == "node" and c.action is Action.UPDATE and not c.disruptive:
                self._uncordon_leftover(c)
        self._disruptive([c for c in changes if c.disruptive])
        for c in sorted((c for c in cfg if c.action is Action.DELETE), key=lambda c: -order[c.type]):
            self._apply_config(c)
        return ApplyResult(**self._counts)

    def _apply_config(self, c: Change) -> None:
        if c.action is Action.DELETE:
            self.state.remove(c.type, c.key)
            self._counts["destroyed"] += 1
            verb = "Destroyed"
        else:
            self.state.put(ResourceRecord(c.type, c.name, c.key, dict(c.after or {}), {}, c.depends_on))
            self._counts["added" if c.action is Action.CREATE else "changed"] += 1
            verb = "Created" if c.action is Action.CREATE else "Updated"
        self._commit(c.action.label, c.address, "done")
        self._say(f"{c.address}: {verb}")

    def _enrol(self, c: Change) -> None:
        host = str(c.node)
        info = self._check_node(host)
        self.state.put(ResourceRecord("node", c.name, c.key, dict(c.after or {}),
                                      {"fingerprint": info.fingerprint(), "cordoned_by_rlsched": False,
                                       "status": "enrolled"}, c.depends_on))
        self._counts["added"] += 1
        self._commit("enrol", c.address, "done")
        self._say(f"{c.address}: Enrolled in pool.{(c.after or {}).get('pool')}")

    def _record_only(self, c: Change) -> None:
        """Adopt a matching GPU or forget one (state only; the node is still checked)."""
        host = str(c.node)
        info = self._check_node(host)
        if c.action is Action.DELETE:
            self.state.remove("gpu", c.key)
            self._counts["destroyed"] += 1
            self._commit("forget", c.address, "done")
            self._say(f"{c.address}: Removed from state")
            return
        g = next((g for g in info.gpus if g.uuid == c.key), None)
        if g is None or gpu_declared(g) != dict(c.after or {}):
            raise NodeChangedError(host, f"GPU {c.name} no longer matches")
        self.state.put(self._gpu_record(c, g))
        self._counts["adopted"] += 1
        self._commit("adopt", c.address, "done")
        self._say(f"{c.address}: Adopted")

    def _gpu_record(self, c: Change, g: Any) -> ResourceRecord:
        obs = dict(c.observed)
        obs.update({"index": g.index, "mig_uuids": sorted(d.uuid for d in g.mig_devices)})
        return ResourceRecord("gpu", f"{c.node}/{g.index}", g.uuid, gpu_declared(g), obs, c.depends_on)

    def _uncordon_leftover(self, c: Change) -> None:
        host = str(c.node)
        self._check_node(host)
        self._commit("uncordon", c.address, "started")
        self.backend.cordon(host, False)
        self._set_node_obs(host, cordoned_by_rlsched=False, status="success")
        self._counts["changed"] += 1
        self._commit("uncordon", c.address, "done")
        self._say(f"{c.address}: Uncordoned")

    def _set_node_obs(self, host: str, **obs: Any) -> None:
        rec = self.state.get("node", host)
        if rec is None:
            return
        self.state.put(ResourceRecord(rec.type, rec.name, rec.key, rec.attributes, {**rec.observed, **obs},
                                      rec.depends_on))

    # -- disruptive work ----------------------------------------------------------------

    def _disruptive(self, changes: list[Change]) -> None:
        by_node: dict[str, list[Change]] = {}
        for c in changes:
            by_node.setdefault(str(c.node), []).append(c)
        by_pool: dict[str, list[str]] = {}
        for host, cs in by_node.items():
            pool = next((c.pool for c in cs if c.type == "node"), None) or cs[0].pool or ""
            by_pool.setdefault(pool, []).append(host)
        for pool in sorted(by_pool):
            dis = self.plan.disruption.get(pool, Disruption())
            hosts = sorted(by_pool[pool])
            size = max(1, dis.max_unavailable)
            for i in range(0, len(hosts), size):
                self._batch(hosts[i:i + size], by_node, dis)

    def _batch(self, hosts: list[str], by_node: Mapping[str, list[Change]], dis: Disruption) -> None:
        for host in hosts:  # refuse before disrupting anything in the batch
            self._check_node(host)
        failed: dict[str, str] = {}
        for host in hosts:
            try:
                self._cordon(host)
            except _NodeFailed as exc:
                failed[host] = str(exc)
        self._drain([h for h in hosts if h not in failed], dis, failed)
        for host in hosts:
            if host in failed:
                continue
            try:
                self._reconfigure(host, by_node[host])
            except _NodeFailed as exc:
                failed[host] = str(exc)
        if failed:
            lines = "; ".join(f"{h}: {why}" for h, why in sorted(failed.items()))
            raise ApplyError(f"apply stopped: {len(failed)} node(s) failed and stay cordoned ({lines}). "
                             "Run plan to see the remaining work.")

    def _fail(self, host: str, step: str, why: str) -> _NodeFailed:
        self._set_node_obs(host, status="failed")
        self._commit(step, f"node.{host}", "failed", why, node_state="failed")
        self._say(f"node.{host}: {step} failed: {why}")
        return _NodeFailed(f"{step}: {why}")

    def _cordon(self, host: str) -> None:
        # Intent first: if we die right after the cordon call, state still says rlsched cordoned it.
        self._set_node_obs(host, cordoned_by_rlsched=True, status="draining")
        self._commit("cordon", f"node.{host}", "started", node_state="pending")
        try:
            self.backend.cordon(host, True)
        except BackendError as exc:
            raise self._fail(host, "cordon", str(exc)) from None
        self._commit("cordon", f"node.{host}", "done")
        self._say(f"node.{host}: Cordoned")

    def _drain(self, hosts: list[str], dis: Disruption, failed: dict[str, str]) -> None:
        if not hosts:
            return
        deadline = self.opt.clock() + dis.drain_timeout_s
        pending = set(hosts)
        for host in sorted(pending):
            self._commit("drain", f"node.{host}", "started", node_state="draining")
            self._say(f"node.{host}: Draining (drain_timeout {format_duration(dis.drain_timeout_s)})...")
        while pending:
            for host in sorted(pending):
                try:
                    jobs = self.backend.running_jobs(host)
                except BackendError as exc:
                    pending.discard(host)
                    failed[host] = str(self._fail(host, "drain", str(exc)))
                    continue
                if jobs == 0:
                    pending.discard(host)
                    self._counts["nodes_drained"] += 1
                    self._commit("drain", f"node.{host}", "done")
                    self._say(f"node.{host}: Drained")
            if not pending:
                break
            if self.opt.clock() >= deadline:
                for host in sorted(pending):
                    left = self._jobs_or_unknown(host)
                    why = f"timed out after {format_duration(dis.drain_timeout_s)} ({left} still running)"
                    failed[host] = str(self._fail(host, "drain", why))
                return
            poll = min(self.opt.drain_poll_s, max(0.01, dis.drain_timeout_s / 10))
            self.opt.sleep(min(poll, max(0.0, deadline - self.opt.clock())))

    def _jobs_or_unknown(self, host: str) -> str:
        try:
            n = self.backend.running_jobs(host)
        except BackendError:
            return "jobs unknown"
        return f"{n} job{'s' if n != 1 else ''}"

    def _reconfigure(self, host: str, changes: list[Change]) -> None:
        gpu_changes = [c for c in changes if c.type == "gpu"]
        for c in gpu_changes:
            want = dict(c.after or {})
            target = format_layout(want["mig_layout"]) if want["mig_enabled"] else "MIG disabled"
            self._commit("reconfigure", c.address, "started", node_state="reconfiguring", want=target)
            try:
                info = self.backend.node(host)
                g = next((g for g in info.gpus if g.uuid == c.key), None)
                if g is None:
                    raise BackendError(f"GPU {c.key} is gone from {host}")
                if g.mig_current != want["mig_enabled"] or g.mig_pending != want["mig_enabled"]:
                    self.backend.set_mig_mode(host, c.key, bool(want["mig_enabled"]))
                    info = self.backend.node(host)
                    g = next(x for x in info.gpus if x.uuid == c.key)
                if want["mig_enabled"] and gpu_declared(g)["mig_layout"] != want["mig_layout"]:
                    g = self.backend.set_mig_layout(host, c.key, want["mig_layout"])
            except BackendError as exc:
                raise self._fail(host, "reconfigure", f"{c.address}: {exc}") from None
            self.state.put(self._gpu_record(c, g))
            self._counts["gpus_reconfigured"] += 1
            self._commit("reconfigure", c.address, "done")
            self._say(f"{c.address}: Reconfigured ({target})")
        # Assert: re-read the node and compare every reconfigured GPU with what was asked (mig-parted assert).
        if gpu_changes:
            try:
                info = self.backend.node(host)
            except BackendError as exc:
                raise self._fail(host, "assert", str(exc)) from None
            now = {g.uuid: gpu_declared(g) for g in info.gpus}
            for c in gpu_changes:
                if now.get(c.key) != dict(c.after or {}):
                    got, exp = now.get(c.key), dict(c.after or {})
                    raise self._fail(host, "assert", f"{c.address} is {got} after apply, expected {exp}")
            self._commit("assert", f"node.{host}", "done")
        node_change = next((c for c in changes if c.type == "node"), None)
        if node_change is not None and node_change.action is Action.DELETE:
            # Uncordon before forgetting the node: once it is out of state nobody would uncordon it.
            try:
                self.backend.cordon(host, False)
            except BackendError as exc:
                raise self._fail(host, "uncordon", str(exc)) from None
            for grec in [r for r in self.state.of_type("gpu") if r.observed.get("host") == host]:
                self.state.remove("gpu", grec.key)
            self.state.remove("node", host)
            self._counts["destroyed"] += 1
            self._commit("release", node_change.address, "done", node_state="success")
            self._say(f"{node_change.address}: Released")
            return
        if node_change is not None:
            rec = self.state.get("node", host)
            obs = dict(rec.observed) if rec else {}
            self.state.put(ResourceRecord("node", host, host, dict(node_change.after or {}), obs,
                                          node_change.depends_on))
            self._counts["changed"] += 1
            self._commit("move", node_change.address, "done")
        try:
            self.backend.cordon(host, False)
        except BackendError as exc:
            raise self._fail(host, "uncordon", str(exc)) from None
        try:
            fp = self.backend.node(host).fingerprint()
        except BackendError:
            fp = ""
        self._set_node_obs(host, cordoned_by_rlsched=False, status="success", fingerprint=fp)
        self._commit("uncordon", f"node.{host}", "done", node_state="success")
        self._say(f"node.{host}: Uncordoned")
