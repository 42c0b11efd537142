"""Observation and action codec between a :class:`ClusterState` and fixed-shape arrays.

A learned policy needs fixed shapes while a cluster has a variable queue and
pools that come and go, so the codec looks at a *window*: the first ``window``
queued jobs in the queue's order (submission order, as the engine keeps it) and
the first ``max_pools`` pools in declared order. Pools beyond ``max_pools`` are
not controllable: they get no features and no actions (the engine still runs
them, but nothing the agent does places work there), so scenarios used for
learning should declare at most ``max_pools`` pools or put the ones that matter
first.

The codec is its own class, apart from the environment, because the very same
encoding must be used at serving time against a live :class:`ClusterState`;
:meth:`ObservationCodec.signature` hashes the layout so a model card can record
it and a server can refuse a model trained against a different one.

Legality comes only from :mod:`rlsched.cluster.feasibility` (``pool_candidates``,
``reconfigure_check``) and the pool bounds the engine enforces, so an action the
mask allows is one the engine accepts.

Speed: an RL environment calls :meth:`encode` and :meth:`mask` at every step, so
everything that can be cached is. A state followed with :meth:`track` keeps its
per-pool results (features, feasibility per request shape, reconfiguration and
scaling legality) until :meth:`invalidate` names the pool as changed; the
environment invalidates the pool a decision touched after ``apply`` and every
pool after ``advance`` (the only call that moves time). For any state that is not
tracked, every call recomputes from scratch, so direct use is always correct.
"""

from __future__ import annotations

import hashlib
import math
from itertools import islice
from typing import Any

import numpy as np
from gymnasium import spaces

from rlsched.cluster.decisions import Decision, Place, Reconfigure, Scale
from rlsched.cluster.feasibility import named_layouts, pack_layout, pool_candidates, reconfigure_check
from rlsched.cluster.model import ClusterState, JobRun, NodeStatus, Placement, Pool, PoolKind, Sharing
from rlsched.policies.autoscale import headroom
from rlsched.policies.placement import _leftover

#: Bumped whenever the meaning of any feature or action changes.
CODEC_VERSION = 1

#: Order of the reconfiguration targets (names from :func:`named_layouts`).
LAYOUT_ORDER: tuple[str, ...] = ("all-1g", "all-2g", "all-3g", "balanced", "mixed-4-3", "all-7g")

JOB_FEATURES: tuple[str, ...] = (
    "present",
    "log2_num_gpus",
    "gpu_fraction",
    "fractional",
    "log_est_duration_h",
    "log_wait_h",
    "priority",
    "preemptible",
    "log_deadline_slack_h",
    "log_attained_gpu_h",
    "log_restarts",
)
POOL_FEATURES: tuple[str, ...] = (
    "present",
    "kind_onprem",
    "kind_ondemand",
    "kind_spot",
    "sharing_exclusive",
    "sharing_mig",
    "sharing_timeslice",
    "held_nodes_frac",
    "ready_nodes_frac",
    "free_whole_gpus_frac",
    "free_mig_compute_frac",
    "provisioning_nodes_frac",
    "log_price_per_gpu_h",
    "log_ondemand_price_per_gpu_h",
    "spot_headroom_frac",
    "reclaim_rate_per_h",
    "can_scale_up",
    "can_scale_down",
)
GLOBAL_FEATURES: tuple[str, ...] = (
    "log_queue_length",
    "log_backlog_gpus",
    "log_running_jobs",
    "utilization",
    "time_of_day_sin",
    "time_of_day_cos",
    "log_demand_gpus",
    "log_cost_rate_usd_h",
)

#: Every feature is bounded to this range (they are logs and fractions; the clip
#: only guards against absurd inputs so the observation always lies in its space).
_BOUND = 50.0
#: Time constant of the arrival-rate estimate used when no demand forecast exists.
_ARRIVAL_TAU_S = 3600.0
_DAY_S = 86400.0
_TWO_PI_PER_DAY = 2.0 * math.pi / _DAY_S
_READY = NodeStatus.READY
_PROVISIONING = NodeStatus.PROVISIONING
_KIND_COLS = {PoolKind.ONPREM: 1, PoolKind.ONDEMAND: 2, PoolKind.SPOT: 3}
_SHARING_COLS = {Sharing.EXCLUSIVE: 4, Sharing.MIG: 5, Sharing.TIMESLICE: 6}
_F_STATIC = 4  # present, log2 gpus, fraction, fractional
_F_DYNAMIC = len(JOB_FEATURES)
_log1p = math.log1p


class _PoolCache:
    """What the codec knows about one pool slot between invalidations."""

    __slots__ = ("can_down", "can_up", "dirty", "feas", "held", "layouts", "pool", "price", "ready_gpus",
                 "reconf", "row")

    def __init__(self, pool: Pool, layouts: list[tuple[str, ...] | None]) -> None:
        self.pool = pool
        self.layouts = layouts
        self.dirty = True
        self.row: list[float] = []
        self.feas: dict[tuple[Any, ...], bool] = {}
        self.reconf: list[bool] = []
        self.can_up = False
        self.can_down = False
        self.held = 0
        self.ready_gpus = 0
        self.price = 0.0


class ObservationCodec:
    """Fixed-shape observations, action masks and action decoding for one cluster view.

    Args:
        window: job slots K: the first K queued jobs in submission order.
        max_pools: pool slots P: the first P pools in declared order (others are
            not controllable).
        layouts: layout slots L per pool for MIG reconfiguration (named layouts in
            :data:`LAYOUT_ORDER`, padded with masked slots).

    The action space is ``Discrete(K*P + P*L + 2*P + 1)``:

    * ``k*P + p``: place job slot ``k`` in pool slot ``p`` (best fit inside the pool);
    * ``K*P + p*L + l``: reconfigure one idle GPU of MIG pool ``p`` to layout ``l``;
    * ``K*P + P*L + 2*p``: scale pool ``p`` up by one node, ``+1``: down by one node;
    * ``K*P + P*L + 2*P``: wait (let time advance).
    """

    def __init__(self, window: int = 16, max_pools: int = 4, layouts: int = 6) -> None:
        if window < 1 or max_pools < 1 or layouts < 0:
            raise ValueError("window and max_pools must be >= 1 and layouts >= 0")
        self.window = window
        self.max_pools = max_pools
        self.layouts = layouts
        self.job_features: tuple[str, ...] = JOB_FEATURES + tuple(f"feasible_pool{p}" for p in range(max_pools))
        self.pool_features = POOL_FEATURES
        self.global_features = GLOBAL_FEATURES
        k, p, n_l = window, max_pools, layouts
        self.place_offset = 0
        self.reconfigure_offset = k * p
        self.scale_offset = k * p + p * n_l
        self.wait_action = self.scale_offset + 2 * p
        self.n_actions = self.wait_action + 1
        fj, fp, g = len(self.job_features), len(POOL_FEATURES), len(GLOBAL_FEATURES)
        self.observation_space = spaces.Dict(
            {
                "jobs": spaces.Box(-_BOUND, _BOUND, shape=(k, fj), dtype=np.float32),
                "pools": spaces.Box(-_BOUND, _BOUND, shape=(p, fp), dtype=np.float32),
                "globals": spaces.Box(-_BOUND, _BOUND, shape=(g,), dtype=np.float32),
            }
        )
        self.action_space = spaces.Discrete(self.n_actions)
        self._jobs = np.zeros((k, fj), dtype=np.float32)
        self._pools = np.zeros((p, fp), dtype=np.float32)
        self._globals = np.zeros((g,), dtype=np.float32)
        self._mask = np.zeros(self.n_actions, dtype=bool)
        self._state: ClusterState | None = None
        self._tracked = False
        self._slots: list[_PoolCache] = []
        self._all_pools: list[Pool] = []
        self._epoch = 0
        self._synced_epoch = -1
        self._rows: dict[str, tuple[int, list[float], tuple[Any, ...]]] = {}
        self._static: dict[str, tuple[list[float], tuple[Any, ...]]] = {}
        self._window_runs: list[JobRun] = []
        self._window_keys: list[tuple[Any, ...]] = []
        self._window_dirty = True
        self._arrival_rate = 0.0  # GPUs per hour, decayed to _arrival_t
        self._arrival_t = 0.0

    # ------------------------------------------------------------------ identity
    def signature(self) -> str:
        """A short hash of the layout (sizes, feature names, action order, version).

        Saved in model cards and compared at serving time: a policy only makes
        sense against the exact encoding it was trained with.
        """
        parts = [
            f"version={CODEC_VERSION}",
            f"K={self.window}",
            f"P={self.max_pools}",
            f"L={self.layouts}",
            "jobs=" + ",".join(self.job_features),
            "pools=" + ",".join(self.pool_features),
            "globals=" + ",".join(self.global_features),
            "layouts=" + ",".join(LAYOUT_ORDER[: self.layouts]),
            "actions=place(k*P+p),reconfigure(KP+p*L+l),scale(KP+PL+2p+{up,down}),wait",
        ]
        digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
        return f"gpupool-codec-v{CODEC_VERSION}-{digest}"

    def describe(self) -> dict[str, Any]:
        """The layout as data (for model cards and debugging)."""
        return {
            "signature": self.signature(),
            "window": self.window,
            "max_pools": self.max_pools,
            "layouts": list(LAYOUT_ORDER[: self.layouts]),
            "job_features": list(self.job_features),
            "pool_features": list(self.pool_features),
            "global_features": list(self.global_features),
            "n_actions": self.n_actions,
        }

    # ------------------------------------------------------------------ caching
    def track(self, state: ClusterState) -> None:
        """Follow ``state`` incrementally; the caller must then :meth:`invalidate` every change.

        The environment calls this once per episode; after it, results are reused
        until :meth:`invalidate` names a pool as changed.
        """
        self._bind(state)
        self._tracked = True
        self._arrival_rate = 0.0
        self._arrival_t = state.time

    def invalidate(self, pool: str | None = None) -> None:
        """Mark ``pool`` (None = every pool, and time) as changed since the last call.

        After ``Engine.apply`` only the pool the decision touched changes (time
        does not move); after ``Engine.advance`` anything may have changed.
        """
        if pool is None:
            self._epoch += 1
            for slot in self._slots:
                slot.dirty = True
            return
        self._window_dirty = True
        for slot in self._slots:
            if slot.pool.name == pool:
                slot.dirty = True

    def record_arrivals(self, gpus: float, now: float) -> None:
        """Feed the arrival-rate estimate (used when the state carries no demand forecast).

        Args:
            gpus: GPU demand (fractions count as their share) that arrived at ``now``.
            now: simulated time of the arrivals.
        """
        self._arrival_rate = self._decayed_rate(now) + gpus * 3600.0 / _ARRIVAL_TAU_S
        self._arrival_t = now

    def _decayed_rate(self, now: float) -> float:
        dt = now - self._arrival_t
        return self._arrival_rate * math.exp(-dt / _ARRIVAL_TAU_S) if dt > 0 else self._arrival_rate

    def _bind(self, state: ClusterState) -> None:
        self._state = state
        pools = list(state.pools.values())
        self._all_pools = pools
        self._slots = []
        for pool in pools[: self.max_pools]:
            named = named_layouts(pool.spec.model) if pool.spec.sharing is Sharing.MIG else {}
            layouts: list[tuple[str, ...] | None] = []
            for name in LAYOUT_ORDER[: self.layouts]:
                lay = named.get(name)
                layouts.append(lay if lay is not None and pack_layout(pool.spec.model, lay) is not None else None)
            layouts += [None] * (self.layouts - len(layouts))
            self._slots.append(_PoolCache(pool, layouts))
        self._epoch += 1
        self._synced_epoch = -1
        self._rows.clear()
        self._static.clear()
        self._window_dirty = True

    def _sync(self, state: ClusterState) -> None:
        """Bring every cache up to date for ``state``."""
        if state is not self._state:
            self._bind(state)
            self._tracked = False
        elif not self._tracked:
            self.invalidate(None)
        now = state.time
        for slot in self._slots:
            if slot.dirty:
                self._refresh_pool(slot, state, now)
        if self._synced_epoch != self._epoch or self._window_dirty:
            self._refresh_window(state, now)
            self._synced_epoch = self._epoch
            self._window_dirty = False

    def _refresh_pool(self, slot: _PoolCache, state: ClusterState, now: float) -> None:
        pool = slot.pool
        spec = pool.spec
        mig = spec.sharing is Sharing.MIG
        held = ready = prov = free_whole = free_mig = 0
        idle_node = False
        for node in pool.nodes.values():
            held += 1
            st = node.status
            if st is _READY:
                ready += 1
                free_whole += node.free_whole
                if not node.jobs:
                    idle_node = True
                if mig:
                    for gpu in node.gpus:
                        if gpu.busy_until <= now and gpu.healthy:
                            for s in gpu.slices:
                                if s.holder is None:
                                    free_mig += s.profile.compute_slices
            elif st is _PROVISIONING:
                prov += 1
                idle_node = True
        elastic = spec.kind.elastic
        room = headroom(state, pool) if elastic else 0
        slot.can_up = elastic and room > 0
        slot.can_down = elastic and idle_node and held > spec.min_nodes
        max_nodes = max(spec.max_nodes, 1)
        max_gpus = max_nodes * spec.gpus_per_node
        q = state.quotes.get(pool.name)
        price = q.price_per_gpu_hour if q is not None else (spec.cost_per_gpu_hour or 0.0)
        od = q.ondemand_per_gpu_hour if q is not None else price
        reclaim = q.reclaim_rate_per_hour if q is not None else 0.0
        row = [0.0] * len(POOL_FEATURES)
        row[0] = 1.0
        row[_KIND_COLS[spec.kind]] = 1.0
        row[_SHARING_COLS[spec.sharing]] = 1.0
        row[7] = held / max_nodes
        row[8] = ready / max_nodes
        row[9] = free_whole / max_gpus
        row[10] = free_mig / (7.0 * max_gpus) if mig else 0.0
        row[11] = prov / max_nodes
        row[12] = _log1p(max(price, 0.0))
        row[13] = _log1p(max(od, 0.0))
        row[14] = room / max_nodes
        row[15] = min(reclaim, _BOUND)
        row[16] = 1.0 if slot.can_up else 0.0
        row[17] = 1.0 if slot.can_down else 0.0
        slot.row = row
        slot.held = held
        slot.ready_gpus = ready * spec.gpus_per_node
        slot.price = price
        slot.feas.clear()
        reconf = [False] * self.layouts
        if mig and ready:
            # reconfigure_check is the authority; the pre-filter only skips GPUs it would refuse anyway.
            for li, lay in enumerate(slot.layouts):
                if lay is None:
                    continue
                for node in pool.nodes.values():
                    if node.status is not _READY:
                        continue
                    hit = False
                    for gpu in node.gpus:
                        if gpu.holders or gpu.busy_until > now:
                            continue
                        if reconfigure_check(state, node.id, gpu.index, lay) is None:
                            hit = True
                            break
                    if hit:
                        reconf[li] = True
                        break
        slot.reconf = reconf
        slot.dirty = False

    def _feasible(self, slot: _PoolCache, run: JobRun, key: tuple[Any, ...], now: float) -> bool:
        found = slot.feas.get(key)
        if found is None:
            found = bool(pool_candidates(slot.pool, run.job, now, first=True))
            slot.feas[key] = found
        return found

    def _refresh_window(self, state: ClusterState, now: float) -> None:
        runs = list(islice(state.queue.values(), self.window))
        epoch = self._epoch
        rows = self._rows
        if len(rows) > 4 * self.window + 64:
            live = {r.job.job_id for r in runs}
            for jid in [j for j in rows if j not in live]:
                del rows[jid]
        if len(self._static) > 4096:
            self._static.clear()
        est = state.estimator.estimate
        keys: list[tuple[Any, ...]] = []
        for run in runs:
            job = run.job
            jid = job.job_id
            cached = rows.get(jid)
            if cached is not None and cached[0] == epoch:
                keys.append(cached[2])
                continue
            st = self._static.get(jid)
            if st is None:
                frac = job.gpu_demand
                st = (
                    [1.0, math.log2(max(job.num_gpus, 1)) + 1.0, frac if job.fractional else 1.0,
                     1.0 if job.fractional else 0.0],
                    (run.shape, job.cpus, job.mem_mib),
                )
                self._static[jid] = st
            e = est(job)
            wait = run.queued_s + (now - run.enqueued_at)
            dl = job.deadline
            if dl is None:
                slack = 0.0
            else:
                s = (dl - now - e) / 3600.0
                slack = _log1p(s) if s >= 0 else -_log1p(-s)
            row = [
                *st[0],
                _log1p(e / 3600.0),
                _log1p(max(wait, 0.0) / 3600.0),
                math.tanh(job.priority / 2.0),
                1.0 if job.preemptible else 0.0,
                slack,
                _log1p(run.attained / 3600.0),
                _log1p(run.restarts),
            ]
            rows[jid] = (epoch, row, st[1])
            keys.append(st[1])
        self._window_runs = runs
        self._window_keys = keys

    # ------------------------------------------------------------------ public
    def encode(self, state: ClusterState) -> dict[str, np.ndarray]:
        """The observation of ``state`` (fresh arrays; safe to keep)."""
        self._sync(state)
        now = state.time
        slots = self._slots
        jobs = self._jobs
        n = len(self._window_runs)
        rows = self._rows
        out_rows = []
        for run, key in zip(self._window_runs, self._window_keys, strict=True):
            base = rows[run.job.job_id][1]
            out_rows.append(base + [1.0 if self._feasible(s, run, key, now) else 0.0 for s in slots]
                            + [0.0] * (self.max_pools - len(slots)))
        if n:
            jobs[:n] = out_rows
        jobs[n:] = 0.0
        pools = self._pools
        for i, slot in enumerate(slots):
            pools[i] = slot.row
        pools[len(slots):] = 0.0
        g = self._globals
        queue = state.queue
        total = 0.0
        for shape, count in state.queue_shapes.items():
            ng, milli = shape[0], shape[1]
            total += count * (milli / 1000.0 if ng == 1 and milli < 1000 else ng)  # type: ignore[operator]
        in_window = 0.0
        for run in self._window_runs:
            in_window += run.job.gpu_demand
        capacity = sum(s.ready_gpus for s in slots) + self._uncontrolled_capacity()
        cost_rate = sum(s.held * s.pool.spec.gpus_per_node * s.price for s in slots)
        tod = now % _DAY_S
        if state.demand_forecast:
            demand = sum(state.demand_forecast.values())
        else:
            demand = self._decayed_rate(now)
        g[0] = _log1p(len(queue))
        g[1] = _log1p(max(total - in_window, 0.0))
        g[2] = _log1p(len(state.running))
        g[3] = min(state.allocated / capacity, 1.0) if capacity > 0 else 0.0
        g[4] = math.sin(tod * _TWO_PI_PER_DAY)
        g[5] = math.cos(tod * _TWO_PI_PER_DAY)
        g[6] = _log1p(max(demand, 0.0))
        g[7] = _log1p(max(cost_rate, 0.0))
        np.clip(jobs, -_BOUND, _BOUND, out=jobs)
        return {"jobs": jobs.copy(), "pools": pools.copy(), "globals": g.copy()}

    def _uncontrolled_capacity(self) -> int:
        extra = 0
        for pool in self._all_pools[self.max_pools:]:
            for node in pool.nodes.values():
                if node.status is _READY:
                    extra += len(node.gpus)
        return extra

    def mask(self, state: ClusterState) -> np.ndarray:
        """Legal actions of ``state`` (bool array; wait is always legal)."""
        self._sync(state)
        m = self._mask
        m[:] = False
        now = state.time
        p_slots = self.max_pools
        slots = self._slots
        for k, (run, key) in enumerate(zip(self._window_runs, self._window_keys, strict=True)):
            base = k * p_slots
            for p, slot in enumerate(slots):
                if self._feasible(slot, run, key, now):
                    m[base + p] = True
        n_l = self.layouts
        off = self.reconfigure_offset
        so = self.scale_offset
        for p, slot in enumerate(slots):
            if n_l and True in slot.reconf:
                m[off + p * n_l: off + (p + 1) * n_l] = slot.reconf
            if slot.can_up:
                m[so + 2 * p] = True
            if slot.can_down:
                m[so + 2 * p + 1] = True
        m[self.wait_action] = True
        return m.copy()

    def only_wait(self, state: ClusterState) -> bool:
        """True if waiting is the only legal action (cheaper than :meth:`mask`)."""
        self._sync(state)
        slots = self._slots
        for slot in slots:
            if slot.can_up or slot.can_down or True in slot.reconf:
                return False
        now = state.time
        for run, key in zip(self._window_runs, self._window_keys, strict=True):
            for slot in slots:
                if self._feasible(slot, run, key, now):
                    return False
        return True

    def decode(self, action: int, state: ClusterState) -> Decision | None:
        """The decision an action stands for, or None for wait.

        An illegal action still decodes to a decision (the engine refuses it and
        counts the refusal) so that mistakes are visible rather than silently waits.
        """
        a = int(action)
        if not 0 <= a < self.n_actions:
            raise ValueError(f"action {a} outside Discrete({self.n_actions})")
        if a == self.wait_action:
            return None
        pools = list(state.pools.values())[: self.max_pools]
        p_slots = self.max_pools
        if a < self.reconfigure_offset:
            k, p = divmod(a, p_slots)
            run = next(islice(state.queue.values(), k, None), None)
            pool = pools[p] if p < len(pools) else None
            if run is None or pool is None:
                return Place(run.job.job_id if run else "", Placement(pool.name if pool else "", ()))
            found = pool_candidates(pool, run.job, state.time)
            if not found:
                return Place(run.job.job_id, Placement(pool.name, ()))
            best = found[0] if len(found) == 1 else min(found, key=lambda pl: _leftover(state, pl))
            return Place(run.job.job_id, best)
        if a < self.scale_offset:
            p, li = divmod(a - self.reconfigure_offset, self.layouts)
            if p >= len(pools):
                return Reconfigure("", 0, ())
            pool = pools[p]
            lay = self._layouts_for(pool)[li]
            if lay is None:
                return Reconfigure("", 0, ())
            best_gpu: tuple[int, str, int] | None = None
            for node in pool.nodes.values():
                for gpu in node.gpus:
                    if reconfigure_check(state, node.id, gpu.index, lay) is None:
                        cand = (len(node.jobs), node.id, gpu.index)
                        if best_gpu is None or cand < best_gpu:
                            best_gpu = cand
            if best_gpu is None:
                return Reconfigure("", 0, lay)
            return Reconfigure(best_gpu[1], best_gpu[2], lay)
        p, down = divmod(a - self.scale_offset, 2)
        name = pools[p].name if p < len(pools) else ""
        return Scale(name, -1 if down else 1)

    def _layouts_for(self, pool: Pool) -> list[tuple[str, ...] | None]:
        for slot in self._slots:
            if slot.pool is pool:
                return slot.layouts
        named = named_layouts(pool.spec.model) if pool.spec.sharing is Sharing.MIG else {}
        return [named.get(n) for n in LAYOUT_ORDER[: self.layouts]] + [None] * max(
            self.layouts - len(LAYOUT_ORDER), 0)

    def window_runs(self, state: ClusterState) -> list[JobRun]:
        """The queued jobs in the job slots, in slot order."""
        return list(islice(state.queue.values(), self.window))

    def action_name(self, action: int) -> str:
        """A readable name of an action (for logs)."""
        a = int(action)
        if a == self.wait_action:
            return "wait"
        if a < self.reconfigure_offset:
            k, p = divmod(a, self.max_pools)
            return f"place(job{k}, pool{p})"
        if a < self.scale_offset:
            p, li = divmod(a - self.reconfigure_offset, self.layouts)
            name = LAYOUT_ORDER[li] if li < len(LAYOUT_ORDER) else f"pad{li}"
            return f"reconfigure(pool{p}, {name})"
        p, down = divmod(a - self.scale_offset, 2)
        return f"scale(pool{p}, {'-1' if down else '+1'})"
