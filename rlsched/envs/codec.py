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

With ``preempt_slots=R`` (opt-in; 0 keeps the layout above unchanged) the codec also
shows R running jobs and offers to preempt each: see :class:`ObservationCodec`.

Legality comes only from :mod:`rlsched.cluster.feasibility` (``pool_candidates``,
``reconfigure_check``, and ``check_decision`` for scaling), the gate the engine
applies, so an action the mask allows is one the engine accepts.

A codec built with ``trained=`` (a model's
:class:`~rlsched.envs.trained_actions.TrainedActions`) also masks every action kind
the model was not trained with on the pool kind at hand, so a served model never acts
through an output that no training step shaped. Observations are unchanged (the
network sees the fleet as it is); waiting stays legal whenever nothing else is.

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
import heapq
import math
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

import numpy as np
from gymnasium import spaces

from rlsched.cluster.checkpoint import checkpoint_age, exposure, progress_now
from rlsched.cluster.decisions import Decision, Place, Preempt, Reconfigure, Scale
from rlsched.cluster.estimate import believed_work
from rlsched.cluster.feasibility import (
    check_decision,
    named_layouts,
    pack_layout,
    pool_candidates,
    reconfigure_check,
    scale_up_room,
)
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, Gpu, JobRun, Node, NodeStatus, Placement, Pool, PoolKind, Sharing
from rlsched.envs.nominate import Nomination
from rlsched.envs.trained_actions import TrainedActions
from rlsched.policies.heuristics.placement import leftover

#: Bumped whenever the meaning of any feature or action changes.
CODEC_VERSION = 6
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
    "log_checkpoint_age_h",
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
    "log_exposed_gpu_h",
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
#: Global features a codec adds only when asked (``extra_globals``), after :data:`GLOBAL_FEATURES`:
#: ``estimate_log_error`` - the duration estimator's running mean of ``|log(actual / estimate)|``
#: over finished jobs (:attr:`~rlsched.cluster.estimate.DurationEstimator.log_error`): how far an
#: ordering by estimates can be trusted on this cluster.
_OPTIONAL_GLOBAL_VALUES: dict[str, Callable[[ClusterState], float]] = {
    "estimate_log_error": lambda state: min(state.estimator.log_error, _BOUND),
}
OPTIONAL_GLOBALS: tuple[str, ...] = tuple(_OPTIONAL_GLOBAL_VALUES)
#: Per running slot (only with ``preempt_slots`` > 0).
RUNNING_FEATURES: tuple[str, ...] = (
    "present",
    "log2_num_gpus",
    "log_attained_gpu_h",
    "log_believed_remaining_h",
    "log_run_time_h",
    "log_checkpoint_age_h",
    "log_restarts",
    "user_gpu_share",
)

#: Every feature is bounded to this range (they are logs and fractions; the clip
#: only guards against absurd inputs so the observation always lies in its space).
_BOUND = 50.0
_DAY_S = 86400.0
_TWO_PI_PER_DAY = 2.0 * math.pi / _DAY_S
_READY = NodeStatus.READY
_PROVISIONING = NodeStatus.PROVISIONING
_KIND_COLS = {PoolKind.ONPREM: 1, PoolKind.ONDEMAND: 2, PoolKind.SPOT: 3}
_SHARING_COLS = {Sharing.EXCLUSIVE: 4, Sharing.MIG: 5, Sharing.TIMESLICE: 6}
_F_STATIC = 4  # present, log2 gpus, fraction, fractional
_F_DYNAMIC = len(JOB_FEATURES)
_log1p = math.log1p


def _memo_estimate(memo: dict[tuple[str, int, int], float] | None, raw: Callable[[Job], float],
                   job: Job) -> float:
    """``raw(job)`` through :meth:`ObservationCodec._estimate_memo`'s memo (None: the oracle, per job)."""
    if memo is None:
        return raw(job)
    ck = (job.user, job.num_gpus, job.gpu_milli)
    got = memo.get(ck)
    return got if got is not None else memo.setdefault(ck, raw(job))


class _PoolCache:
    """What the codec knows about one pool slot between invalidations."""

    __slots__ = ("can_down", "can_up", "dirty", "feas", "held", "index", "layout_keys", "layouts", "max_gpus",
                 "max_nodes", "pool", "price", "ready_gpus", "reconf", "row0")

    def __init__(self, index: int, pool: Pool, layouts: list[tuple[str, ...] | None]) -> None:
        self.index = index
        self.pool = pool
        self.layouts = layouts
        self.layout_keys = [tuple(sorted(lay)) if lay is not None else None for lay in layouts]
        self.dirty = True
        #: request-shape id -> can it be placed now (pool_candidates non-empty)
        self.feas: dict[int, bool] = {}
        self.reconf: list[bool] = []
        self.can_up = False
        self.can_down = False
        self.held = 0
        self.ready_gpus = 0
        self.price = 0.0
        spec = pool.spec
        self.max_nodes = max(spec.max_nodes, 1)
        self.max_gpus = self.max_nodes * spec.gpus_per_node
        #: the pool row's constant part (presence and one-hots); the rest is refreshed
        self.row0 = [0.0] * len(POOL_FEATURES)
        self.row0[0] = 1.0
        self.row0[_KIND_COLS[spec.kind]] = 1.0
        self.row0[_SHARING_COLS[spec.sharing]] = 1.0


class ObservationCodec:
    """Fixed-shape observations, action masks and action decoding for one cluster view.

    Args:
        window: job slots K: the first K queued jobs in submission order.
        max_pools: pool slots P: the first P pools in declared order (others are
            not controllable).
        layouts: layout slots L per pool for MIG reconfiguration (named layouts in
            :data:`LAYOUT_ORDER`, padded with masked slots).
        nominators: heuristics whose next jobs fill the job slots (:mod:`rlsched.envs.nominate`).
        preempt_slots: running slots R (default 0: no running slots, no preempt actions,
            the layout and signature of a codec built without the option).
        extra_globals: names from :data:`OPTIONAL_GLOBALS` appended to the global features
            (default none: the layout and signature of a codec built without the option).

    The action space is ``Discrete(K*P + P*L + 2*P + R + 1)``:

    * ``k*P + p``: place job slot ``k`` in pool slot ``p`` (best fit inside the pool);
    * ``K*P + p*L + l``: reconfigure one idle GPU of MIG pool ``p`` to layout ``l``;
    * ``K*P + P*L + 2*p``: scale pool ``p`` up by one node, ``+1``: down by one node;
    * ``K*P + P*L + 2*P + r``: preempt the job of running slot ``r`` (only with R > 0):
      a graceful, checkpointed :class:`~rlsched.cluster.decisions.Preempt` (reason
      ``"policy"``); the job requeues keeping its progress and pays the restart overhead.
      Legal only when the engine accepts it (``check_decision``), some window job is
      blocked (fits no pool slot the model may place in), and, with ``trained``, the
      model was trained to preempt: preempting with nothing waiting only wastes work;
    * last (``K*P + P*L + 2*P + R``): wait (let time advance); legal only when no window
      job fits a pool slot other than an on-demand one (see :meth:`mask`).

    With R > 0 the observation has a ``running`` array (R, len(:data:`RUNNING_FEATURES`)):
    the R preemptible running jobs with a placement that have received the most GPU
    service (Tiresias' order: the most attained GPU-time first, job id on ties), each with
    its presence, ``log2`` GPUs, attained GPU-hours, believed remaining hours (the
    estimate doubled past the progress made, :func:`~rlsched.cluster.estimate.believed_work`),
    hours since it started, checkpoint age, restarts (``log1p`` of each) and its user's
    share of the GPUs in use.

    Every feature is bounded by construction (fractions, one-hots, ``log1p`` of
    hours or counts), well inside the observation space's +-50 for any input
    below 1e20 seconds.
    """

    def __init__(self, window: int = 16, max_pools: int = 4, layouts: int = 6, nominators: Sequence[str] = (),
                 preempt_slots: int = 0, extra_globals: Sequence[str] = ()) -> None:
        if window < 1 or max_pools < 1 or layouts < 0 or preempt_slots < 0:
            raise ValueError("window and max_pools must be >= 1, layouts and preempt_slots >= 0")
        #: the teacher whose choice the observation carries (None: no ``anchor`` key; see :meth:`anchor_to`)
        self.anchor: str | None = None
        unknown = [g for g in extra_globals if g not in OPTIONAL_GLOBALS]
        if unknown:
            raise ValueError(f"unknown extra global feature {unknown[0]!r} (known: {', '.join(OPTIONAL_GLOBALS)})")
        #: the optional global features this codec adds, in :data:`OPTIONAL_GLOBALS` order
        self.extra_globals: tuple[str, ...] = tuple(g for g in OPTIONAL_GLOBALS if g in extra_globals)
        self.window = window
        self.max_pools = max_pools
        self.layouts = layouts
        #: the action kinds a served model was trained with (:meth:`restrict`); None: no restriction
        self.trained: TrainedActions | None = None
        #: with nominators: the window holds what each of these heuristics would run next
        self.nomination = Nomination(nominators, window) if nominators else None
        self._nom_cols = np.zeros((window, len(self.nomination.features) if self.nomination else 0), dtype=np.float32)
        self.job_features: tuple[str, ...] = JOB_FEATURES + tuple(f"feasible_pool{p}" for p in range(max_pools))
        if self.nomination is not None:
            self.job_features += self.nomination.features
        self.pool_features = POOL_FEATURES
        self.global_features = GLOBAL_FEATURES + self.extra_globals
        k, p, n_l = window, max_pools, layouts
        self.place_offset = 0
        self.reconfigure_offset = k * p
        self.scale_offset = k * p + p * n_l
        self.preempt_slots = preempt_slots
        self.running_features: tuple[str, ...] = RUNNING_FEATURES if preempt_slots else ()
        self.preempt_offset = self.scale_offset + 2 * p
        self.wait_action = self.preempt_offset + preempt_slots
        self.n_actions = self.wait_action + 1
        fj, fp, g = len(self.job_features), len(POOL_FEATURES), len(self.global_features)
        obs_spaces: dict[str, spaces.Space[Any]] = {
            "jobs": spaces.Box(-_BOUND, _BOUND, shape=(k, fj), dtype=np.float32),
            "pools": spaces.Box(-_BOUND, _BOUND, shape=(p, fp), dtype=np.float32),
            "globals": spaces.Box(-_BOUND, _BOUND, shape=(g,), dtype=np.float32),
        }
        if preempt_slots:
            obs_spaces["running"] = spaces.Box(-_BOUND, _BOUND, shape=(preempt_slots, len(RUNNING_FEATURES)),
                                               dtype=np.float32)
        self.observation_space = spaces.Dict(obs_spaces)
        #: running slots: their rows, the jobs in them, and whether the engine would preempt each now
        self._running = np.zeros((preempt_slots, len(RUNNING_FEATURES)), dtype=np.float32)
        self._running_runs: list[JobRun] = []
        self.action_space = spaces.Discrete(self.n_actions)
        self._pools = np.zeros((p, fp), dtype=np.float32)
        #: legality of reconfigure/scale/wait actions (the part of the mask after the place block)
        self._tail = np.zeros(self.n_actions - k * p, dtype=bool)
        self._tail[-1] = True
        # Job rows live in a store indexed by a per-job slot; row 0 stays zero (padding).
        self._store = np.zeros((64, _F_DYNAMIC), dtype=np.float32)
        self._free_rows: list[int] = list(range(63, 0, -1))
        self._job_row: dict[str, list[Any]] = {}  # job id -> [store row, epoch, shape id, ...]
        # Feasibility per request-shape id (row 0 = padding, all zero) and pool slot.
        self._feas = np.zeros((16, p), dtype=np.float32)
        #: pool slots whose free capacity makes waiting illegal (all but on-demand pools)
        self._binding = np.zeros(p, dtype=bool)
        self._shape_ids: dict[tuple[Any, ...], int] = {}
        self._state: ClusterState | None = None
        self._tracked = False
        self._clean = False
        self._slots: list[_PoolCache] = []
        self._all_pools: list[Pool] = []
        self._epoch = 0
        self._window_epoch = -1
        self._window_dirty = True
        self._window_runs: list[JobRun] = []
        self._window_demand = 0.0
        self._win_key: tuple[int, ...] | None = None
        self._demand_key: tuple[int, int] | None = None
        self._demand_total = 0.0
        self._est_version: tuple[int, int] = (0, -1)
        self._sel_key: tuple[int, int, int, int] | None = None
        self._sel_runs: list[JobRun] = []
        self._est_memo: dict[tuple[str, int, int], float] = {}
        self._row_idx = np.zeros(window, dtype=np.intp)
        self._shape_idx = np.zeros(window, dtype=np.intp)
        self._window_shapes: list[int] = []
        self._gpu_layouts: dict[Gpu, tuple[list[Any], tuple[str, ...]]] = {}
        self._reconf_memo: dict[tuple[int, tuple[str, ...], int], bool] = {}
        #: with ``trained``: pool slots the model may place in, and the legal-by-training part of the tail
        self._place_ok = np.ones(p, dtype=bool)
        self._tail_ok = np.ones(self.n_actions - k * p, dtype=bool)

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
            (f"window=nominated-by:{','.join(self.nomination.names)}" if self.nomination is not None
             else f"window=head{self.window // 2}+shortest{self.window - self.window // 2}ofqueue"),
            "wait=only-when-nothing-fits-but-on-demand",
        ]
        if self.preempt_slots:
            parts += [
                f"R={self.preempt_slots}",
                "running=" + ",".join(self.running_features),
                "running=preemptible-placed-by-most-attained-gpu-service",
                "actions+=preempt(KP+PL+2P+r),wait-last",
                "preempt=graceful-checkpointed-only-when-a-window-job-is-blocked",
            ]
        if self.anchor is not None:
            parts += [f"anchor={self.anchor}", "anchor=one-hot-of-its-legal-choice"]
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
            "nominators": list(self.nomination.names) if self.nomination is not None else [],
            **({"extra_globals": list(self.extra_globals)} if self.extra_globals else {}),
            **({"anchor": self.anchor} if self.anchor is not None else {}),
            **({"preempt_slots": self.preempt_slots, "running_features": list(self.running_features)}
               if self.preempt_slots else {}),
        }

    # ------------------------------------------------------------------ caching
    def track(self, state: ClusterState) -> None:
        """Follow ``state`` incrementally; the caller must then :meth:`invalidate` every change.

        The environment calls this once per episode; after it, results are reused
        until :meth:`invalidate` names a pool as changed.
        """
        self._bind(state)
        self._tracked = True

    def invalidate(self, pool: str | None = None) -> None:
        """Mark ``pool`` (None = every pool, and time) as changed since the last call.

        After ``Engine.apply`` only the pool the decision touched (and the queue)
        changes, since time does not move; after ``Engine.advance`` anything may
        have changed. Unknown or uncontrolled pool names only refresh the queue.
        """
        self._clean = False
        self._window_dirty = True
        if pool is None:
            self._epoch += 1
            for slot in self._slots:
                slot.dirty = True
            return
        for slot in self._slots:
            if slot.pool.name == pool:
                slot.dirty = True

    def anchor_to(self, teacher: str | None) -> ObservationCodec:
        """Carry ``teacher``'s choice in the observation (None: no anchor). Returns the codec.

        ``teacher`` is a codec-space teacher that acts itself (:data:`~rlsched.envs.teacher_actions.TEACHERS`
        but the pickers, or ``follow:NAME`` for a nominator NAME). The observation gains an
        ``anchor`` array over the actions: the one-hot of the teacher's legal choice
        (:meth:`anchor_onehot`), and the signature says so. A network that adds a large fixed
        weight times this array to its logits acts as the teacher until it learns where to depart
        from it (:mod:`rlsched.learned.ppo_net`).
        """
        from rlsched.envs.teacher_actions import acts_itself

        names = self.nomination.names if self.nomination is not None else ()
        if teacher is not None and not acts_itself(teacher, tuple(names)):
            raise ValueError(f"unknown anchor teacher {teacher!r} (a codec-space teacher that acts itself)")
        self.anchor = teacher
        obs = dict(self.observation_space.spaces)
        obs.pop("anchor", None)
        if teacher is not None:
            obs["anchor"] = spaces.Box(0.0, 1.0, shape=(self.n_actions,), dtype=np.float32)
        self.observation_space = spaces.Dict(obs)
        return self

    def restrict(self, trained: TrainedActions | None) -> ObservationCodec:
        """Mask every action outside ``trained`` from now on (a served model's record, or the
        training environment's when a rule owns an action kind); None lifts it. Returns the codec."""
        self.trained = trained
        self._state = None  # bind again: the masks of the bound pools depend on it
        return self

    def _bind(self, state: ClusterState) -> None:
        self._state = state
        pools = list(state.pools.values())
        self._all_pools = pools
        self._slots = []
        for i, pool in enumerate(pools[: self.max_pools]):
            named = named_layouts(pool.spec.model) if pool.spec.sharing is Sharing.MIG else {}
            layouts: list[tuple[str, ...] | None] = []
            for name in LAYOUT_ORDER[: self.layouts]:
                lay = named.get(name)
                layouts.append(lay if lay is not None and pack_layout(pool.spec.model, lay) is not None else None)
            layouts += [None] * (self.layouts - len(layouts))
            self._slots.append(_PoolCache(i, pool, layouts))
        self._binding[:] = False
        for slot in self._slots:
            self._binding[slot.index] = slot.pool.spec.kind is not PoolKind.ONDEMAND
        self._bind_trained()
        self._pools[:] = 0.0
        self._tail[:] = False
        self._tail[-1] = True
        self._epoch += 1
        self._window_dirty = True
        self._clean = False
        self._store[:] = 0.0
        self._free_rows = list(range(len(self._store) - 1, 0, -1))
        self._job_row = {}
        self._win_key = None
        self._demand_key = None
        self._sel_key = None
        self._feas[:] = 0.0
        self._shape_ids = {}
        self._gpu_layouts = {}
        self._reconf_memo = {}

    def _bind_trained(self) -> None:
        """Which place / reconfigure / scale actions of the bound pools lie inside ``trained``."""
        self._place_ok[:] = True
        self._tail_ok[:] = True
        trained = self.trained
        if trained is None:
            return
        n_l = self.layouts
        scale0 = self.max_pools * n_l
        for slot in self._slots:
            kind, i = slot.pool.spec.kind, slot.index
            self._place_ok[i] = trained.allows("place", kind)
            self._tail_ok[i * n_l:(i + 1) * n_l] = trained.allows("reconfigure", kind)
            self._tail_ok[scale0 + 2 * i] = trained.allows("scale_up", kind)
            self._tail_ok[scale0 + 2 * i + 1] = trained.allows("scale_down", kind)
        if self.preempt_slots:
            pre0 = self.preempt_offset - self.reconfigure_offset
            self._tail_ok[pre0:pre0 + self.preempt_slots] = trained.preempt

    def _sync(self, state: ClusterState) -> None:
        """Bring every cache up to date for ``state``."""
        if state is not self._state:
            self._bind(state)
            self._tracked = False
        elif not self._tracked:
            self.invalidate(None)
        elif self._clean:
            return
        now = state.time
        for slot in self._slots:
            if slot.dirty:
                self._refresh_pool(slot, state, now)
        if self._window_dirty:
            self._refresh_window(state, now)
            self._window_dirty = False
        # Feasibility of the window's request shapes in pools refreshed since they were last asked.
        feas = self._feas
        for sid, run in zip(self._window_shapes, self._window_runs, strict=True):
            for slot in self._slots:
                f = slot.feas
                if sid not in f:
                    ok = bool(pool_candidates(slot.pool, run.job, now, first=True))
                    f[sid] = ok
                    feas[sid, slot.index] = 1.0 if ok else 0.0
        if self.preempt_slots:
            self._refresh_running(state, now)
        self._clean = True

    def _refresh_running(self, state: ClusterState, now: float) -> None:
        """The running slots' jobs, rows and preempt legality (the preempt part of the tail).

        Recomputed whenever anything was invalidated: every apply and advance changes
        the running set, the window or the free capacity a blocked job is judged by.
        """
        r_slots = self.preempt_slots
        running = state.running.values()
        cands = [(run.attained + (now - run.started_at) * run.job.gpu_demand, run.job.job_id, run)
                 for run in running if run.job.preemptible and run.placement is not None]
        top = heapq.nsmallest(r_slots, cands, key=lambda c: (-c[0], c[1]))
        rows = self._running
        rows[:] = 0.0
        runs: list[JobRun] = []
        usage: dict[str, float] = {}
        total = 0.0
        if top:  # the users' shares of the GPUs in use (only needed for a filled slot)
            for run in running:
                job = run.job
                usage[job.user] = usage.get(job.user, 0.0) + job.gpu_demand
                total += job.gpu_demand
        memo, raw = self._estimate_memo(state)
        for i, (attained, _, run) in enumerate(top):
            job = run.job
            e = _memo_estimate(memo, raw, job)
            progress = progress_now(run, now)
            remaining = max(believed_work(e, progress) - progress, 0.0)
            rows[i] = (1.0, math.log2(max(job.num_gpus, 1)) + 1.0, _log1p(max(attained, 0.0) / 3600.0),
                       _log1p(remaining / 3600.0), _log1p(max(now - run.started_at, 0.0) / 3600.0),
                       _log1p(checkpoint_age(run, now) / 3600.0), _log1p(run.restarts),
                       usage.get(job.user, 0.0) / total if total > 0 else 0.0)
            runs.append(run)
        self._running_runs = runs
        n = len(self._window_runs)
        # a window job is blocked when it fits no pool slot the model may place in
        blocked = n > 0 and bool(((self._feas.take(self._shape_idx[:n], axis=0) * self._place_ok).max(axis=1)
                                  <= 0.0).any())
        pre0 = self.preempt_offset - self.reconfigure_offset
        tail = self._tail
        for i in range(r_slots):
            tail[pre0 + i] = (blocked and i < len(runs)
                              and check_decision(state, Preempt(runs[i].job.job_id, reason="policy")) is None)

    def _refresh_pool(self, slot: _PoolCache, state: ClusterState, now: float) -> None:
        pool = slot.pool
        spec = pool.spec
        mig = spec.sharing is Sharing.MIG
        held = ready = prov = free_whole = free_mig = 0
        # first idle, open GPU per distinct current layout (MIG pools): reconfiguration candidates
        idle_by_layout: dict[tuple[str, ...], tuple[Node, Gpu]] = {}
        # layouts some GPU of the pool is being re-split to right now
        inflight: set[tuple[str, ...]] = set()
        nodes = pool.nodes
        held = len(nodes)
        for node in nodes.values():
            st = node.status
            if st is _READY:
                ready += 1
                free_whole += node.free_whole
                if mig:
                    for gpu in node.gpus:
                        if gpu.busy_until > now:
                            inflight.add(self._gpu_layout_key(gpu))
                        elif gpu.healthy:
                            all_free = not gpu.holders
                            for sl in gpu.slices:
                                if sl.holder is None:
                                    free_mig += sl.profile.compute_slices
                                else:
                                    all_free = False
                            # Two distinct current layouts already give every target a candidate.
                            if all_free and len(idle_by_layout) < 2:
                                key = self._gpu_layout_key(gpu)
                                if key not in idle_by_layout:
                                    idle_by_layout[key] = (node, gpu)
            elif st is _PROVISIONING:
                prov += 1
        room = scale_up_room(state, pool)
        slot.can_up = check_decision(state, Scale(spec.name, 1)) is None
        slot.can_down = check_decision(state, Scale(spec.name, -1)) is None
        max_nodes = slot.max_nodes
        max_gpus = slot.max_gpus
        q = state.quotes.get(spec.name)
        price = q.price_per_gpu_hour if q is not None else (spec.cost_per_gpu_hour or 0.0)
        od = q.ondemand_per_gpu_hour if q is not None else price
        reclaim = q.reclaim_rate_per_hour if q is not None else 0.0
        row = slot.row0.copy()
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
        if spec.kind is PoolKind.SPOT:
            # GPU-hours of work a reclaim of the whole pool would throw away now
            ci = state.checkpoint_interval_s
            name = spec.name
            exposed = sum(exposure(r, now, ci) * r.job.gpu_demand for r in state.running.values()
                          if r.placement is not None and r.placement.pool == name)
            row[18] = _log1p(exposed / 3600.0)
        self._pools[slot.index] = row
        slot.held = held
        slot.ready_gpus = ready * spec.gpus_per_node
        slot.price = price
        slot.feas.clear()
        n_l = self.layouts
        reconf = [False] * n_l
        if idle_by_layout:
            # The pre-filter (ready, open, idle, layout differs) only picks the GPU to ask;
            # reconfigure_check has the final word. For a GPU that passed the pre-filter its
            # answer depends only on (model, current layout, target), so it is memoised on that.
            memo = self._reconf_memo
            model = id(spec.model)  # GpuModel's own hash walks its whole profile table
            for li, lay in enumerate(slot.layouts):
                if lay is None:
                    continue
                target = slot.layout_keys[li]
                if target in inflight:
                    continue  # one re-split per layout at a time: the one in flight serves the same jobs
                for key, (node, gpu) in idle_by_layout.items():
                    if key == target:
                        continue
                    mk = (model, key, li)
                    ok = memo.get(mk)
                    if ok is None:
                        ok = reconfigure_check(state, node.id, gpu.index, lay) is None
                        memo[mk] = ok
                    reconf[li] = ok
                    break
        slot.reconf = reconf
        base = slot.index * n_l
        tail = self._tail
        if n_l:
            tail[base: base + n_l] = reconf
        so = self.max_pools * n_l + 2 * slot.index
        tail[so] = slot.can_up
        tail[so + 1] = slot.can_down
        slot.dirty = False

    def _gpu_layout_key(self, gpu: Gpu) -> tuple[str, ...]:
        """Sorted profile names of ``gpu``'s instances, cached until its slices are replaced."""
        cached = self._gpu_layouts.get(gpu)
        slices = gpu.slices
        if cached is not None and cached[0] is slices:
            return cached[1]
        key = tuple(sorted(s.profile.name for s in slices))
        self._gpu_layouts[gpu] = (slices, key)
        return key

    def _reconfigure_target(self, state: ClusterState, pool: Pool, li: int,
                            lay: tuple[str, ...]) -> tuple[Node, Gpu] | None:
        """The ready, open, idle MIG GPU of ``pool`` to re-split to layout slot ``li``.

        Least-loaded node first (then node id, GPU index), skipping GPUs already in the
        target layout. For a GPU that passed the idle pre-filter the legality answer
        depends only on (model, current layout, target), so it shares
        :meth:`_refresh_pool`'s memo.
        """
        now = state.time
        target = tuple(sorted(lay))
        memo, model = self._reconf_memo, id(pool.spec.model)
        best: tuple[Node, Gpu] | None = None
        best_key: tuple[int, str, int] | None = None
        for node in pool.nodes.values():
            if node.status is not _READY:
                continue
            load = len(node.jobs)
            if best_key is not None and load > best_key[0]:
                continue
            for gpu in node.gpus:
                if gpu.holders or gpu.busy_until > now or not gpu.healthy:
                    continue
                if any(sl.holder is not None for sl in gpu.slices):
                    continue
                key = self._gpu_layout_key(gpu)
                if key == target:
                    continue
                rank = (load, node.id, gpu.index)
                if best_key is not None and rank >= best_key:
                    continue
                mk = (model, key, li)
                ok = memo.get(mk)
                if ok is None:
                    ok = memo[mk] = reconfigure_check(state, node.id, gpu.index, lay) is None
                if ok:
                    best, best_key = (node, gpu), rank
        return best

    def _shape_id(self, key: tuple[Any, ...]) -> int:
        sid = self._shape_ids.get(key)
        if sid is None:
            sid = len(self._shape_ids) + 1
            self._shape_ids[key] = sid
            if sid >= len(self._feas):
                grown = np.zeros((2 * len(self._feas), self.max_pools), dtype=np.float32)
                grown[: len(self._feas)] = self._feas
                self._feas = grown
        return sid

    def _new_row(self) -> int:
        if not self._free_rows:
            n = len(self._store)
            grown = np.zeros((2 * n, _F_DYNAMIC), dtype=np.float32)
            grown[:n] = self._store
            self._store = grown
            self._free_rows = list(range(2 * n - 1, n - 1, -1))
        return self._free_rows.pop()

    def _select_window(self, state: ClusterState) -> list[JobRun]:
        """Head + short tail: the oldest K/2 queued jobs, then the K - K/2 queued jobs with
        the shortest estimated duration among ALL the others (oldest first on ties).

        A head-only window fills with jobs that cannot start and hides the short jobs
        that backfilling (and SJF-like ordering) would run (the window-staleness
        problem of Deep Back-Filling); the tail half gives the policy those choices,
        taken from the whole queue because in a burst of a thousand queued jobs a
        bounded look-ahead hides exactly the short ones. Estimates depend only on
        (user, GPUs, milli-GPU), so the state's per-key queue index gives the
        candidates in O(keys + K) (the oracle estimator, per job, scans the queue).
        """
        if self.nomination is not None:
            runs, self._nom_cols = self.nomination.select(state, self._fits_somewhere)
            return runs
        k = self.window
        queue = state.queue
        if len(queue) <= k:
            return list(queue.values())
        estimator = state.estimator
        key = (id(state), state.queue_version, id(estimator), estimator.version)
        if key == self._sel_key:
            return list(self._sel_runs)  # queue and estimates unchanged (scale/reconfigure steps)
        head_n = k // 2
        need = k - head_n
        head = list(islice(iter(queue.values()), head_n))
        head_ids = {r.job.job_id for r in head}
        memo, raw = self._estimate_memo(state)
        cands: list[tuple[float, float, str, JobRun]] = []
        if memo is None:
            for run in queue.values():
                job = run.job
                if job.job_id not in head_ids:
                    cands.append((raw(job), job.submit_time, job.job_id, run))
        else:
            keyed = []
            for ck, same_key in state.queue_by_estimate_key.items():
                got = memo.get(ck)
                e = got if got is not None else memo.setdefault(ck, raw(next(iter(same_key.values())).job))
                keyed.append((e, ck, same_key))
            keyed.sort(key=lambda t: t[0])
            cut = None
            for e, _, same_key in keyed:
                if cut is not None and e > cut:
                    break  # every later key is strictly longer than the K-th candidate
                taken = 0
                for run in same_key.values():  # each key's jobs oldest first: only its first `need` can win
                    job = run.job
                    if job.job_id in head_ids:
                        continue
                    cands.append((e, job.submit_time, job.job_id, run))
                    taken += 1
                    if taken >= need:
                        break
                if cut is None and len(cands) >= need:
                    cut = e
        picked = heapq.nsmallest(need, cands, key=lambda c: (c[0], c[1], c[2]))
        # the window lists its jobs in submission order, as the queue does
        picked.sort(key=lambda c: (c[1], c[2]))
        runs = head + [c[3] for c in picked]
        self._sel_key, self._sel_runs = key, runs
        return list(runs)

    def _fits_somewhere(self, run: JobRun) -> bool:
        """Whether ``run`` could be placed now in a controlled pool the model may place in."""
        now = self._state.time if self._state is not None else 0.0
        return any(self._place_ok[s.index] and pool_candidates(s.pool, run.job, now, first=True)
                   for s in self._slots)

    def _estimate_memo(self, state: ClusterState) -> tuple[dict[tuple[str, int, int], float] | None,
                                                           Callable[[Job], float]]:
        """``state.estimator.estimate`` and a memo of its answers keyed on what it reads.

        The estimator is a per-(user, request shape) statistic, so jobs of one
        (user, GPUs, milli-GPU) share an answer until the estimator learns something
        new (its version moves). The oracle answers per job: no memo (None).
        """
        estimator = state.estimator
        if estimator.oracle:
            return None, estimator.estimate
        if self._est_version != (id(estimator), estimator.version):
            self._est_version = (id(estimator), estimator.version)
            self._est_memo = {}
        return self._est_memo, estimator.estimate

    def _refresh_window(self, state: ClusterState, now: float) -> None:
        estimator = state.estimator
        win_key = (id(state), state.queue_version, id(estimator), estimator.version, self._epoch)
        if win_key == self._win_key:
            return  # same queue, same estimates, same time: e.g. after a scale or reconfigure step
        if self.nomination is None:
            self._win_key = win_key  # nominations also depend on free capacity: never reused
        runs = self._select_window(state)
        epoch = self._epoch
        job_row = self._job_row
        if len(job_row) > 4 * self.window + 64:
            live = {r.job.job_id for r in runs}
            for jid in [j for j in job_row if j not in live]:
                self._free_rows.append(job_row.pop(jid)[0])
        memo, raw = self._estimate_memo(state)
        demand = 0.0
        rows: list[int] = []
        shapes: list[int] = []
        # Rows whose dynamic features are stale are written in one assignment at the end
        # (one numpy call instead of two per job); new rows get their static part there too.
        upd_rows: list[int] = []
        upd_vals: list[tuple[float, ...]] = []
        for run in runs:
            job = run.job
            entry = job_row.get(job.job_id)
            if entry is None:
                sid = self._shape_id((run.shape, job.cpus, job.mem_mib))
                static = (1.0, math.log2(max(job.num_gpus, 1)) + 1.0,
                          job.gpu_demand if job.fractional else 1.0, 1.0 if job.fractional else 0.0)
                mid = (math.tanh(job.priority / 2.0), 1.0 if job.preemptible else 0.0)
                # [store row, epoch of its dynamic features, shape id, GPU demand, static cols 0-3, cols 6-7]
                entry = [self._new_row(), -1, sid, job.gpu_demand, static, mid]
                job_row[job.job_id] = entry
            demand += entry[3]
            if entry[1] != epoch:
                e = _memo_estimate(memo, raw, job)
                wait = run.queued_s + (now - run.enqueued_at)
                dl = job.deadline
                if dl is None:
                    slack = 0.0
                else:
                    s = (dl - now - e) / 3600.0
                    slack = _log1p(s) if s >= 0 else -_log1p(-s)
                upd_rows.append(entry[0])
                upd_vals.append((*entry[4], _log1p(e / 3600.0), _log1p(max(wait, 0.0) / 3600.0), *entry[5],
                                 slack, _log1p(run.attained / 3600.0), _log1p(run.restarts),
                                 _log1p(checkpoint_age(run, now) / 3600.0)))
                entry[1] = epoch
            rows.append(entry[0])
            shapes.append(entry[2])
        if upd_rows:
            self._store[upd_rows] = upd_vals
        n = len(runs)
        row_idx, shape_idx = self._row_idx, self._shape_idx
        row_idx[:n] = rows
        row_idx[n:] = 0
        shape_idx[:n] = shapes
        shape_idx[n:] = 0
        self._window_runs = runs
        self._window_shapes = shapes
        self._window_demand = demand

    # ------------------------------------------------------------------ public
    def encode(self, state: ClusterState) -> dict[str, np.ndarray]:
        """The observation of ``state`` (fresh arrays; safe to keep)."""
        self._sync(state)
        now = state.time
        slots = self._slots
        nf = _F_DYNAMIC + self.max_pools
        jobs = np.empty((self.window, len(self.job_features)), dtype=np.float32)
        jobs[:, :_F_DYNAMIC] = self._store.take(self._row_idx, axis=0)
        jobs[:, _F_DYNAMIC:nf] = self._feas.take(self._shape_idx, axis=0)
        if self.nomination is not None:
            jobs[:, nf:] = self._nom_cols
        total = self._queue_demand(state)
        in_window = self._window_demand
        capacity = 0
        cost_rate = 0.0
        for s in slots:
            capacity += s.ready_gpus
            cost_rate += s.held * s.pool.spec.gpus_per_node * s.price
        if len(self._all_pools) > self.max_pools:
            capacity += self._uncontrolled_capacity()
        tod = (now % _DAY_S) * _TWO_PI_PER_DAY
        # A forecaster's total ("*") when one runs, else the engine's arrival-rate signal.
        demand = state.demand_forecast.get("*", 0.0) if state.demand_forecast else state.arrival_rate(now)
        g = np.array(
            (
                _log1p(len(state.queue)),
                _log1p(max(total - in_window, 0.0)),
                _log1p(len(state.running)),
                min(state.allocated / capacity, 1.0) if capacity > 0 else 0.0,
                math.sin(tod),
                math.cos(tod),
                _log1p(max(demand, 0.0)),
                _log1p(max(cost_rate, 0.0)),
                *(_OPTIONAL_GLOBAL_VALUES[name](state) for name in self.extra_globals),
            ),
            dtype=np.float32,
        )
        obs = {"jobs": jobs, "pools": self._pools.copy(), "globals": g}
        if self.preempt_slots:
            obs["running"] = self._running.copy()
        if self.anchor is not None:
            obs["anchor"] = self.anchor_onehot(state)
        return obs

    def _queue_demand(self, state: ClusterState) -> float:
        """GPUs the whole queue asks for (a MIG request counts its fraction), cached per queue version."""
        qkey = (id(state), state.queue_version)
        if qkey == self._demand_key:
            return self._demand_total
        total = 0.0
        for shape, count in state.queue_shapes.items():
            ng, milli = shape[0], shape[1]
            total += count * (milli / 1000.0 if ng == 1 and milli < 1000 else ng)  # type: ignore[operator]
        self._demand_key, self._demand_total = qkey, total
        return total

    def legal(self, state: ClusterState) -> np.ndarray:
        """The actions a policy may take in ``state``, wherever it acts.

        :meth:`mask`, less buying beyond the blocked queue (:meth:`within_queue`), less a stranding wait
        (:meth:`unstranded`). The environment, the served loop and the anchor all ask this one
        method, so a network is served under exactly the options it was trained under.
        """
        return self.unstranded(state, self.within_queue(state, self.mask(state)))

    def within_queue(self, state: ClusterState, mask: np.ndarray) -> np.ndarray:
        """``mask`` without buying a node for a pool whose provisioning GPUs already cover the window's jobs
        that fit none of its ready nodes now.

        A bought node serves the jobs the pool cannot take as it is; once the nodes on their way cover
        those, another buys nothing but an idle node. Without the rule, a network served on a workload
        it had not seen bought on-demand node after node for one queued pod while the first was still
        provisioning (BENCHMARKS.md, "No buying beyond the queue"). A job that fits a ready node of the
        pool needs no node either: it can be placed now. Counting what is *blocked*, not what is free,
        keeps a buy legal where free GPUs are too scattered for a gang; counting free GPUs forbade that
        buy and left on-demand as the only one. The teachers never meet the rule: they place every
        window job that fits before they buy. The price: no buying ahead of arrivals - a forecast may
        not pre-provision.

        The rule never leaves the queue stranded: where the masked scale-ups were all that was legal,
        and waiting is illegal or nothing is left to happen, ``mask`` is returned as it is.
        ``mask`` itself is never changed.
        """
        so = self.scale_offset
        ups = np.flatnonzero(mask[so: so + 2 * self.max_pools: 2])
        if not len(ups):
            return mask
        self._sync(state)
        runs = self._window_runs
        fits = self._feas.take(self._shape_idx[: len(runs)], axis=0) > 0.0
        demand = np.fromiter((r.job.gpu_demand for r in runs), dtype=np.float64, count=len(runs))
        out: np.ndarray | None = None
        for p in ups:
            pool = self._all_pools[int(p)]
            if pool.provisioning_gpus() >= float(demand[~fits[:, p]].sum()):
                if out is None:
                    out = mask.copy()
                out[so + 2 * int(p)] = False
        if out is None:
            return mask
        if not out[: self.wait_action].any() and (not out[self.wait_action] or self._stranding(state)):
            return mask
        return out

    def _stranding(self, state: ClusterState) -> bool:
        """Would waiting now strand the queue: nothing left to happen (see :meth:`unstranded`)."""
        due = state.next_event_due
        if due is not None:
            return due() is None
        return not state.running and not any(n.status is NodeStatus.PROVISIONING for n in state.nodes.values())

    def unstranded(self, state: ClusterState, mask: np.ndarray) -> np.ndarray:
        """``mask`` without waiting where waiting could strand the queue and something else is legal.

        That is where nothing is left to happen: the environment's rule, read from the simulator
        (``state.next_event_due``). Where the world cannot say (the live runtime), the guess is that
        nothing runs and nothing is coming up. The served loop, the environment and the anchor all
        use this, so a policy may wait in serving exactly where it could in training. (They used to
        differ: the served loop and the anchor took the guess everywhere, so a network trained to wait
        while a job fitted nowhere and arrivals were still due was made to act in serving instead -
        BENCHMARKS.md, "A teacher for bursts".) ``mask`` itself is never changed."""
        if not mask[: self.wait_action].any():
            return mask
        if self._stranding(state):
            mask = mask.copy()
            mask[self.wait_action] = False
        return mask

    def anchor_onehot(self, state: ClusterState) -> np.ndarray:
        """The :attr:`anchor` teacher's choice among the legal actions of ``state``, one-hot.

        Waiting is taken off the teacher's options where the environment and the served loop
        take it off (nothing runs, nothing is coming up, something else is legal), so the
        anchor never points at an action the policy cannot take there.
        """
        from rlsched.envs.teacher_actions import teacher_action

        assert self.anchor is not None
        mask = self.legal(state)
        out = np.zeros(self.n_actions, dtype=np.float32)
        out[teacher_action(self, state, mask, rule=self.anchor)] = 1.0
        return out

    def _uncontrolled_capacity(self) -> int:
        extra = 0
        for pool in self._all_pools[self.max_pools:]:
            for node in pool.nodes.values():
                if node.status is _READY:
                    extra += len(node.gpus)
        return extra

    def mask(self, state: ClusterState) -> np.ndarray:
        """Legal actions of ``state`` (bool array).

        Work-conserving, except for on-demand capacity: waiting is legal only when no
        window job can be placed in an on-prem or spot pool. The policy decides *which*
        job goes *where* (and when to buy, release or re-split capacity), never whether
        to leave an owned or spot GPU idle in front of a job that fits it. Letting it wait
        there made learning fragile: a job's start delay barely moves the episode's
        reward at the next step, and policies trained on small fleets learned to idle
        large ones. On-demand capacity is the exception because holding it is the
        expensive choice: a fully work-conserving policy must feed every on-demand node
        it holds, so a node bought for one burst never drains and never reaches the idle
        stop (BENCHMARKS.md, "Design notes moved from docstrings"). Waiting while only
        on-demand fits lets it drain them.

        A MIG layout that a GPU of the pool is being re-split to right now is not offered
        again until that re-split finishes: the one in flight serves the same blocked jobs,
        and offering it at every step (time does not move between steps) let a policy
        re-split one idle GPU after another for a single job.
        """
        self._sync(state)
        feas = self._feas.take(self._shape_idx, axis=0)
        if self.trained is None:
            place = feas.ravel() > 0.0
            mask = np.concatenate((place, self._tail))
            if feas[:, self._binding].any():
                mask[self.wait_action] = False
            return mask
        # Only the actions the model was trained with; waiting stays legal when nothing else is.
        feas = feas * self._place_ok
        mask = np.concatenate((feas.ravel() > 0.0, self._tail & self._tail_ok))
        if feas[:, self._binding].any() or (not self.trained.wait and mask[: self.wait_action].any()):
            mask[self.wait_action] = False
        return mask

    def only_wait(self, state: ClusterState) -> bool:
        """True if waiting is the only legal action (cheaper than :meth:`mask`)."""
        self._sync(state)
        if self.trained is None:
            if self._tail[:-1].any():
                return False
            return not self._feas.take(self._shape_idx, axis=0).any()
        if (self._tail[:-1] & self._tail_ok[:-1]).any():
            return False
        return not (self._feas.take(self._shape_idx, axis=0) * self._place_ok).any()

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
        self._sync(state)
        pools = self._all_pools[: self.max_pools]
        p_slots = self.max_pools
        if a < self.reconfigure_offset:
            k, p = divmod(a, p_slots)
            window = self.window_runs(state)
            run = window[k] if k < len(window) else None
            pool = pools[p] if p < len(pools) else None
            if run is None or pool is None:
                return Place(run.job.job_id if run else "", Placement(pool.name if pool else "", ()))
            found = pool_candidates(pool, run.job, state.time)
            if not found:
                return Place(run.job.job_id, Placement(pool.name, ()))
            best = found[0] if len(found) == 1 else min(found, key=lambda pl: leftover(state, pl))
            return Place(run.job.job_id, best)
        if a >= self.preempt_offset:
            r = a - self.preempt_offset
            running = self._running_runs
            return Preempt(running[r].job.job_id if r < len(running) else "", reason="policy")
        if a < self.scale_offset:
            p, li = divmod(a - self.reconfigure_offset, self.layouts)
            if p >= len(pools):
                return Reconfigure("", 0, ())
            pool = pools[p]
            lay = self._layouts_for(pool)[li]
            if lay is None:
                return Reconfigure("", 0, ())
            target = self._reconfigure_target(state, pool, li, lay)
            if target is None:
                return Reconfigure("", 0, lay)
            return Reconfigure(target[0].id, target[1].index, lay)
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

    def layouts_of(self, pool: Pool) -> list[tuple[str, ...] | None]:
        """The layout of each reconfiguration slot of ``pool`` (None: a masked slot)."""
        return self._layouts_for(pool)

    def nomination_columns(self, state: ClusterState) -> np.ndarray:
        """Per job slot, who nominated it (``nominated_<name>`` = 1 / (1 + rank)) and the user's GPU share.

        Columns as :attr:`Nomination.features`; zero columns without nominators.
        """
        self._sync(state)
        return self._nom_cols

    def window_runs(self, state: ClusterState) -> list[JobRun]:
        """The queued jobs in the job slots, in slot order (see :meth:`_select_window`)."""
        self._sync(state)
        return list(self._window_runs)

    def running_runs(self, state: ClusterState) -> list[JobRun]:
        """The running jobs in the running slots, in slot order (empty without preempt slots)."""
        self._sync(state)
        return list(self._running_runs)

    def action_name(self, action: int) -> str:
        """A readable name of an action (for logs)."""
        a = int(action)
        if a == self.wait_action:
            return "wait"
        if self.preempt_offset <= a < self.wait_action:
            return f"preempt(running{a - self.preempt_offset})"
        if a < self.reconfigure_offset:
            k, p = divmod(a, self.max_pools)
            return f"place(job{k}, pool{p})"
        if a < self.scale_offset:
            p, li = divmod(a - self.reconfigure_offset, self.layouts)
            name = LAYOUT_ORDER[li] if li < len(LAYOUT_ORDER) else f"pad{li}"
            return f"reconfigure(pool{p}, {name})"
        p, down = divmod(a - self.scale_offset, 2)
        return f"scale(pool{p}, {'-1' if down else '+1'})"
