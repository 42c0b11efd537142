"""The live view: inventory + store -> the one :class:`ClusterState` policies see.

The state comes from two sources of truth: the GPU backend (what exists, and
whether it is healthy) and the job store (what is queued, and which GPU or MIG
UUIDs each running job holds). :func:`build_view` builds it from scratch (the
service does so at start, when the inventory, health or spec changes, and every
rescheduling period, from its in-memory mirror of the store's unfinished jobs);
in between, the service folds each committed job transition into the same view
with :func:`enqueue_record`, :func:`drop_queued` and :func:`release_job`, so a
scheduling pass costs O(changes), not O(queue). A restarted service rebuilds it
from exactly what the store says.

Mapping inventory onto the spec's pools:

* a pool listing ``nodes`` owns those hostnames; ``localhost`` stands for this
  machine (the backend node named like ``socket.gethostname()``, or the only node);
* a pool given as ``node_count`` takes that many otherwise unclaimed nodes whose
  GPUs are its model;
* ``gpus = [i, ...]`` restricts a pool to those GPU indices of each node.

GPUs are rebuilt with their live UUIDs (and MIG instances with their live MIG
UUIDs and placements), so :func:`~rlsched.runtime.audit.placement_devices` of a
placement yields exactly what goes into ``CUDA_VISIBLE_DEVICES``. A GPU that does
not match its pool (another model, MIG mode on in a whole-GPU pool) is shown
but closed to new work, with the reason in :attr:`LiveView.gpu_problems`.
Elastic pools are held at their live size: the service does not buy capacity.
"""

from __future__ import annotations

import dataclasses
import math
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlsched.cluster.catalog import resolve_model_name
from rlsched.cluster.estimate import DurationEstimator
from rlsched.cluster.feasibility import fits_pool_spec, profile_for, unschedulable_reason
from rlsched.cluster.job import Job
from rlsched.cluster.model import (
    ClusterState,
    Gpu,
    JobRun,
    Node,
    NodeStatus,
    Placement,
    PoolSpec,
    RunState,
    Sharing,
    Slice,
)
from rlsched.runtime.audit import placement_devices
from rlsched.runtime.backend import GpuInfo, NodeInfo
from rlsched.runtime.store import Allocation, JobRecord
from rlsched.spec.model import Spec
from rlsched.spec.pools import to_pool_specs


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """Where a GPU or MIG UUID lives in the live state."""

    uuid: str
    node: str
    pool: str
    position: int  # index of the GPU in the node's GPU list (what placements name)
    index: int  # the GPU's NVML index
    gpu_uuid: str
    profile: str | None = None  # MIG instance only
    slice_start: int | None = None


@dataclass
class LiveView:
    """One iteration's picture of the cluster (see the module doc)."""

    state: ClusterState
    pools: dict[str, PoolSpec]
    devices: dict[str, DeviceRef] = field(default_factory=dict)
    #: GPU UUID -> why it gets no new work (unhealthy, health event, pool mismatch).
    gpu_problems: dict[str, str] = field(default_factory=dict)
    #: GPU UUIDs that are unhealthy (a subset of ``gpu_problems``): their jobs are stopped.
    unhealthy: dict[str, str] = field(default_factory=dict)
    #: job id -> problem with its allocation (a device not in the inventory...).
    job_issues: dict[str, str] = field(default_factory=dict)
    #: inventory nodes no pool claims.
    unassigned: list[str] = field(default_factory=list)
    #: job id -> the only pools a queued job may run in (its ``pool``; MIG pools for a MIG request).
    allowed: dict[str, frozenset[str]] = field(default_factory=dict)
    #: node id -> position -> NVML index.
    physical: dict[str, list[int]] = field(default_factory=dict)
    #: job id -> the run of every running or preempted job (what :func:`release_job` frees).
    held: dict[str, JobRun] = field(default_factory=dict)

    # ------------------------------------------------------------------ placements <-> allocations
    def allocation(self, placement: Placement) -> Allocation:
        """The store's allocation for ``placement``: node, exact UUIDs, pool, NVML indices, slice."""
        devices = placement_devices(self.state, placement)
        node = placement.gpus[0][0] if placement.gpus else ""
        idx = tuple(self.physical.get(n, [])[p] if p < len(self.physical.get(n, [])) else p
                    for n, p in placement.gpus)
        return Allocation(node=node, devices=devices, pool=placement.pool, gpu_indices=idx,
                          slice_start=placement.slice_start)

    def device_problem(self, alloc: Allocation) -> str | None:
        """Why a job holding ``alloc`` must be stopped: one of its GPUs is unhealthy."""
        for dev in alloc.devices:
            ref = self.devices.get(dev)
            if ref is not None and ref.gpu_uuid in self.unhealthy:
                return f"GPU {ref.gpu_uuid} ({ref.node}/{ref.index}) is unhealthy: {self.unhealthy[ref.gpu_uuid]}"
        return None

    # ------------------------------------------------------------------ summaries
    def pool_summary(self) -> dict[str, dict[str, Any]]:
        """Per pool: kind, model, sharing, nodes, GPUs total/free/unhealthy, MIG instances total/free."""
        out: dict[str, dict[str, Any]] = {}
        now = self.state.time
        for name, pool in self.state.pools.items():
            spec = pool.spec
            total = free = unhealthy = 0
            slices: dict[str, dict[str, int]] = {}
            for node in pool.nodes.values():
                for g in node.gpus:
                    total += 1
                    open_ = node.ready and g.healthy and g.busy_until <= now
                    if not g.healthy:
                        unhealthy += 1
                    if g.slices:
                        for s in g.slices:
                            d = slices.setdefault(s.profile.name, {"total": 0, "free": 0, "allocated": 0})
                            d["total"] += 1
                            if s.holder is not None:
                                d["allocated"] += 1
                            elif open_:
                                d["free"] += 1
                    elif not g.holders and open_ and spec.sharing is not Sharing.MIG:
                        free += 1
            allocated = sum(1 for node in pool.nodes.values() for g in node.gpus if g.holders)
            out[name] = {"kind": spec.kind.value, "model": spec.model.name, "sharing": spec.sharing.value,
                         "nodes": sorted(pool.nodes), "gpus_total": total, "gpus_free": free,
                         "gpus_allocated": allocated, "gpus_unhealthy": unhealthy,
                         "mig_instances": dict(sorted(slices.items()))}
        return out

    def could_run(self, job: Job, pool_name: str) -> bool:
        """Could ``job`` run in the pool as it is now (free or not)? For MIG pools: an instance of its
        profile exists; otherwise: the pool's size allows it (``fits_pool_spec``)."""
        pool = self.state.pools.get(pool_name)
        if pool is None or not fits_pool_spec(job, pool.spec):
            return False
        allowed = self.allowed.get(job.job_id)
        if allowed is not None and pool_name not in allowed:
            return False
        if pool.spec.sharing is not Sharing.MIG:
            return True
        prof = profile_for(pool.spec.model, job.num_gpus, job.gpu_milli)
        return any(s.profile is prof for n in pool.nodes.values() for g in n.gpus for s in g.slices)

    def why_pending(self, job: Job) -> str:
        """Why a queued job (not held by a quota) is not running, in words for ``status``."""
        state = self.state
        allowed = self.allowed.get(job.job_id)
        pools = [p for p in state.pools.values() if (allowed is None or p.name in allowed)]
        fitting = [p for p in pools if fits_pool_spec(job, p.spec)]
        if not fitting:
            if not pools:
                return f"none of its pools ({', '.join(sorted(allowed or ()))}) is in the spec"
            return "no pool can run it: " + unschedulable_reason(job, [p.spec for p in pools])
        now = state.time
        first_short = ""
        unhealthy_would_fit = ""
        for pool in fitting:
            spec = pool.spec
            if spec.sharing is Sharing.MIG:
                prof = profile_for(spec.model, job.num_gpus, job.gpu_milli)
                assert prof is not None  # fits_pool_spec checked it
                free = sick = 0
                for node in pool.nodes.values():
                    for g in node.gpus:
                        for s in g.slices:
                            if s.profile is not prof or s.holder is not None or not node.ready:
                                continue
                            if g.healthy and g.busy_until <= now:
                                free += 1
                            elif not g.healthy:
                                sick += 1
                if free >= 1:
                    return "policy holds it (a fitting instance is free; other jobs go first or the policy waits)"
                if sick and not unhealthy_would_fit:
                    unhealthy_would_fit = f"GPU unhealthy: the free {prof.name} instances in pool {pool.name} are on " \
                                          f"unhealthy GPUs"
                if not first_short:
                    have = sum(1 for n in pool.nodes.values() for g in n.gpus for s in g.slices if s.profile is prof)
                    extra = "" if have else f"; no GPU in the pool has a {prof.name} instance"
                    first_short = f"waiting for a free {prof.name} MIG instance in pool {pool.name} (0 free{extra})"
                continue
            n = job.num_gpus
            best = total_free = 0
            best_with_sick = 0
            for node in pool.nodes.values():
                if not node.ready:
                    continue
                cap = spec.replicas if spec.sharing is Sharing.TIMESLICE else 1
                open_ = [g for g in node.gpus if len(g.holders) < cap and g.healthy and g.busy_until <= now]
                sick_gpus = [g for g in node.gpus if len(g.holders) < cap and not g.healthy]
                total_free += len(open_)
                best = max(best, len(open_))
                best_with_sick = max(best_with_sick, len(open_) + len(sick_gpus))
            enough = best >= n if n <= spec.gpus_per_node else total_free >= n
            if enough:
                return "policy holds it (enough GPUs are free; other jobs go first or the policy waits)"
            if best_with_sick >= n and not unhealthy_would_fit:
                unhealthy_would_fit = f"GPU unhealthy: pool {pool.name} would have {n} free GPU(s) but some are " \
                                      f"unhealthy"
            if not first_short:
                plural = "s" if n != 1 else ""
                first_short = f"waiting for {n} free {spec.model.name} GPU{plural} in pool {pool.name} " \
                              f"({total_free} free)"
        return unhealthy_would_fit or first_short


# ---------------------------------------------------------------------- node assignment
def assign_nodes(spec: Spec, inventory: Sequence[NodeInfo], local_hostname: str | None = None) -> dict[str, str]:
    """hostname -> pool name for every inventory node a pool claims (see the module doc)."""
    hosts = {n.hostname: n for n in inventory}
    local = local_hostname or socket.gethostname()
    out: dict[str, str] = {}
    for pool in spec.pools.values():
        for host in pool.nodes:
            target = host
            if host == "localhost" and host not in hosts:
                if local in hosts:
                    target = local
                elif len(hosts) == 1:
                    target = next(iter(hosts))
            if target in hosts and target not in out:
                out[target] = pool.name
    for pool in spec.pools.values():
        if pool.nodes or not pool.node_count:
            continue
        taken = 0
        for n in inventory:
            if taken >= pool.node_count:
                break
            if n.hostname in out or not n.gpus:
                continue
            models = {resolve_model_name(g.model or g.name) for g in n.gpus}
            if models == {pool.gpu_model}:
                out[n.hostname] = pool.name
                taken += 1
    return out


def _live_specs(spec: Spec, inventory: Sequence[NodeInfo], assignment: Mapping[str, str]) -> dict[str, PoolSpec]:
    declared = {p.name: p for p in to_pool_specs(spec)}
    per_pool: dict[str, list[NodeInfo]] = {name: [] for name in declared}
    for n in inventory:
        pool = assignment.get(n.hostname)
        if pool is not None:
            per_pool[pool].append(n)
    out: dict[str, PoolSpec] = {}
    for name, ps in declared.items():
        nodes = per_pool[name]
        decl = spec.pools[name]
        counts = [len(_pool_gpus(n, decl.gpus)) for n in nodes if n.reachable]
        per_node = max(counts) if counts else ps.gpus_per_node
        live = len(nodes)
        out[name] = dataclasses.replace(ps, gpus_per_node=max(per_node, 1), min_nodes=live, max_nodes=live,
                                        initial_nodes=live, provision_delay_s=0.0)
    return out


def _pool_gpus(node: NodeInfo, which: Any) -> list[GpuInfo]:
    gpus = sorted(node.gpus, key=lambda g: g.index)
    if which == "all":
        return gpus
    wanted = set(which)
    return [g for g in gpus if g.index in wanted]


# ---------------------------------------------------------------------- jobs
def allowed_pools(rec: JobRecord, pools: Mapping[str, PoolSpec] | None) -> frozenset[str] | None:
    """The pools a job may run in (None: any): its ``pool`` option, and only MIG pools for a MIG request.

    Feasibility would also let a MIG-sized request take a whole GPU of an exclusive
    pool; a user who asked for a MIG instance gets one.
    """
    allowed: frozenset[str] | None = None
    pin = (rec.options or {}).get("pool")
    if pin:
        allowed = frozenset({str(pin)})
    if rec.mig_profile is not None and pools is not None:
        mig = frozenset(name for name, p in pools.items() if p.sharing is Sharing.MIG)
        allowed = mig if allowed is None else allowed & mig
    return allowed


def job_of(rec: JobRecord, pools: Mapping[str, PoolSpec] | None = None) -> Job:
    """The :class:`Job` a policy sees for a stored job (options: cpus, memory, pool pin, estimate)."""
    opts = rec.options or {}
    duration = float(opts.get("estimated_duration_s") or 0.0)
    job = rec.to_job(duration=duration)
    changes: dict[str, Any] = {}
    if opts.get("cpus"):
        changes["cpus"] = float(opts["cpus"])
    if opts.get("memory_gib"):
        changes["mem_mib"] = int(float(opts["memory_gib"]) * 1024)
    allowed = allowed_pools(rec, pools)
    if allowed is not None and pools is not None and not job.gpu_models:
        models = frozenset(pools[p].model.name for p in allowed if p in pools)
        if models:
            changes["gpu_models"] = models
    return dataclasses.replace(job, **changes) if changes else job


# ---------------------------------------------------------------------- building
def build_view(spec: Spec, inventory: Sequence[NodeInfo], holding: Iterable[JobRecord], queued: Iterable[JobRecord],
               now: float, *, health_events: Mapping[str, str] | None = None, local_hostname: str | None = None,
               job_cache: dict[str, Job] | None = None, estimator: DurationEstimator | None = None) -> LiveView:
    """The live :class:`LiveView` (see the module doc).

    Args:
        spec: the loaded pool spec.
        inventory: the backend's nodes.
        holding: running and preempted jobs (their allocations are marked held).
        queued: queued jobs, in submission order.
        now: wall-clock seconds (the state's time; job submit times are wall-clock too).
        health_events: GPU UUID -> reason for GPUs a health event closed (Xid, ECC).
        local_hostname: what ``localhost`` in a pool's nodes means (default ``socket.gethostname()``).
        job_cache: job id -> its :func:`job_of` for these pools, filled as jobs are decoded (the
            caller keeps it while the pools stay the same: a job's request never changes).
        estimator: the duration estimator the state carries (the service's, learnt from its finished
            jobs; default a fresh one, which knows only its prior).
    """
    assignment = assign_nodes(spec, inventory, local_hostname)
    specs = _live_specs(spec, inventory, assignment)
    state = ClusterState(list(specs.values()))
    state.time = now
    if estimator is not None:
        state.estimator = estimator
    view = LiveView(state=state, pools=specs)
    events = dict(health_events or {})
    for info in inventory:
        pool_name = assignment.get(info.hostname)
        if pool_name is None:
            view.unassigned.append(info.hostname)
            continue
        ps = specs[pool_name]
        node = Node(info.hostname, ps, now, now)
        if not info.reachable or info.cordoned:
            node.status = NodeStatus.DRAINING
        gpus: list[Gpu] = []
        physical: list[int] = []
        for pos, gi in enumerate(_pool_gpus(info, spec.pools[pool_name].gpus)):
            g = Gpu(node, pos, ps.model, ps.sharing, ps.replicas)
            g._uuid = gi.uuid
            physical.append(gi.index)
            problem = None
            # The event's reason first: a backend that saw an Xid/ECC event also reports the GPU unhealthy in
            # its inventory, and "Xid 79 (critical error)" says more than "reported unhealthy".
            if gi.uuid in events:
                problem = view.unhealthy[gi.uuid] = events[gi.uuid]
            elif not gi.healthy:
                problem = view.unhealthy[gi.uuid] = "reported unhealthy by the backend"
            g.healthy = problem is None
            live_model = resolve_model_name(gi.model or gi.name)
            if problem is None and live_model != ps.model.name:
                problem = f"is a {live_model or gi.name}, pool {pool_name} declares {ps.model.name}"
            elif problem is None and ps.sharing is not Sharing.MIG and gi.mig_current:
                problem = f"has MIG enabled but pool {pool_name} uses whole GPUs (run rlsched apply)"
            if problem is not None:
                view.gpu_problems[gi.uuid] = problem
                if g.healthy:
                    g.busy_until = math.inf  # closed to new work, but not "unhealthy" (its jobs keep running)
            view.devices[gi.uuid] = DeviceRef(gi.uuid, node.id, pool_name, pos, gi.index, gi.uuid)
            if ps.sharing is Sharing.MIG and gi.mig_current and live_model == ps.model.name:
                for d in gi.mig_devices:
                    try:
                        prof = ps.model.profile(d.profile)
                    except Exception:
                        continue
                    s = Slice(g, prof, d.start)
                    s._uuid = d.uuid
                    g.slices.append(s)
                    view.devices[d.uuid] = DeviceRef(d.uuid, node.id, pool_name, pos, gi.index, gi.uuid,
                                                     prof.name, d.start)
                g.slices.sort(key=lambda s: s.start)
            gpus.append(g)
        node.gpus = gpus
        node.free_whole = len(gpus) if ps.sharing is not Sharing.MIG else 0
        view.physical[node.id] = physical
        state.pools[pool_name].nodes[node.id] = node
        state.nodes[node.id] = node
    for rec in holding:
        _hold(view, rec, job_cache)
    for rec in queued:
        enqueue_record(view, rec, job_cache)
    return view


def _cached_job(rec: JobRecord, pools: Mapping[str, PoolSpec], cache: dict[str, Job] | None) -> Job:
    if cache is None:
        return job_of(rec, pools)
    job = cache.get(rec.id)
    if job is None:
        job = cache[rec.id] = job_of(rec, pools)
    return job


def enqueue_record(view: LiveView, rec: JobRecord, job_cache: dict[str, Job] | None = None) -> None:
    """Put a queued job into the view's queue (a submission, or a requeue after its process ended)."""
    if rec.id in view.state.queue:
        return
    allowed = allowed_pools(rec, view.pools)
    if allowed is not None:
        view.allowed[rec.id] = allowed
    run = JobRun(_cached_job(rec, view.pools, job_cache))
    run.enqueued_at = rec.submitted_at
    view.state.enqueue(run)


def drop_queued(view: LiveView, job_id: str) -> None:
    """Take a job out of the view's queue (cancelled, or started elsewhere); no-op if it is not there."""
    if job_id in view.state.queue:
        view.state.dequeue(job_id)
    view.allowed.pop(job_id, None)


def release_job(view: LiveView, job_id: str) -> None:
    """Give back what a running/preempted job holds in the view (its process ended)."""
    run = view.held.pop(job_id, None)
    view.state.running.pop(job_id, None)
    view.job_issues.pop(job_id, None)
    if run is not None and run.placement is not None:
        view.state.release(run, view.state.time)


def _hold(view: LiveView, rec: JobRecord, job_cache: dict[str, Job] | None = None) -> None:
    """Mark what a running/preempted job holds; running jobs also enter ``state.running``."""
    alloc = rec.allocation
    if alloc is None:
        view.job_issues[rec.id] = "holds GPUs but has no allocation"
        return
    state = view.state
    refs = []
    for dev in alloc.devices:
        ref = view.devices.get(dev)
        if ref is None:
            view.job_issues[rec.id] = f"device {dev} is not in the live inventory"
            continue
        refs.append(ref)
    run = JobRun(_cached_job(rec, view.pools, job_cache), state=RunState.RUNNING)
    run.started_at = rec.started_at or state.time
    run.first_start = rec.started_at
    if refs:
        mig = [r for r in refs if r.slice_start is not None]
        whole = [r for r in refs if r.slice_start is None]
        pool = refs[0].pool
        if mig:
            r = mig[0]
            gpu = state.nodes[r.node].gpus[r.position]
            s = next(s for s in gpu.slices if s.start == r.slice_start)
            if s.holder is not None:
                view.job_issues[rec.id] = f"instance {r.uuid} is also held by {s.holder}"
            else:
                state.allocate(run, Placement(pool, ((r.node, r.position),), r.slice_start), r.profile)
        elif whole:
            gpus = [state.nodes[r.node].gpus[r.position] for r in whole]
            clash = next((g for g in gpus if g.holders and g.sharing is not Sharing.TIMESLICE), None)
            if clash is not None:
                view.job_issues[rec.id] = f"GPU {clash.uuid} is also held by {clash.holders[0]}"
            else:
                state.allocate(run, Placement(pool, tuple((r.node, r.position) for r in whole)))
    view.held[rec.id] = run
    if rec.state.value == "running":
        state.running[rec.id] = run
