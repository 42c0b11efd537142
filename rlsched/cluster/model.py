"""The shared cluster model: pools, nodes, GPUs, MIG slices, allocations.

One model serves the simulator and the live runtime. Static facts (a pool's
specification, a job's request) are frozen dataclasses; the occupancy of nodes,
GPUs and slices is mutable, because a discrete-event replay of a million jobs
cannot afford to copy the cluster at every decision. Policies receive a
:class:`ClusterState` and must treat it as read-only: the only way to change it is
a decision that :mod:`rlsched.cluster.feasibility` accepted, applied through
:meth:`ClusterState.allocate` / :meth:`ClusterState.release`.
"""

from __future__ import annotations

import uuid as _uuid
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from rlsched.cluster.catalog import GpuModel, MigProfile
from rlsched.cluster.estimate import DurationEstimator
from rlsched.cluster.job import Job

#: seconds of work between two checkpoints for a job that names no interval (the simulator's
#: default; see :mod:`rlsched.cluster.checkpoint`).
DEFAULT_CHECKPOINT_INTERVAL_S = 1800.0


class PoolKind(str, Enum):
    """How capacity is obtained and paid for."""

    ONPREM = "onprem"
    ONDEMAND = "ondemand"
    SPOT = "spot"

    @property
    def elastic(self) -> bool:
        return self is not PoolKind.ONPREM


class Sharing(str, Enum):
    """How one physical GPU is shared between jobs."""

    EXCLUSIVE = "exclusive"
    MIG = "mig"
    TIMESLICE = "timeslice"


class GangMode(str, Enum):
    """Where a job larger than one node may take its GPUs (see :func:`rlsched.cluster.feasibility.gang_candidate`).

    ``WHOLE_NODES`` (the default) is what real fleets and the Tiresias and Lucid
    simulators do: ``n // G`` completely free nodes plus one node with ``n % G`` free
    GPUs for the remainder (``G`` = GPUs per node). ``PACKED`` takes any free GPUs of
    the pool, the nodes with the most free GPUs first (so the fewest nodes that hold
    them), at no speed cost - rlsched's rule before whole nodes became the default; it
    is optimistic (a 16-GPU job may run 7+4+3+2 over four partly used nodes as fast as
    on two whole ones).
    """

    WHOLE_NODES = "whole-nodes"
    PACKED = "packed"


class NodeStatus(str, Enum):
    PROVISIONING = "provisioning"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


class RunState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    UNSCHEDULABLE = "unschedulable"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A pool's declaration: what its nodes are, how many, and what they cost.

    Attributes:
        name: unique pool name.
        kind: on-prem (fixed), on-demand or spot (elastic).
        model: GPU model of every node.
        gpus_per_node: GPUs in one node.
        min_nodes / max_nodes: elastic bounds (equal for on-prem).
        initial_nodes: nodes up at time 0 (defaults to ``min_nodes``).
        sharing: exclusive, MIG or time-slicing.
        replicas: time-slicing replicas per GPU.
        mig_layout: initial profile names per GPU in MIG pools (e.g. balanced).
        cpus_per_node / mem_mib_per_node: host resources (0 = unconstrained).
        cost_per_gpu_hour: fixed price; None = taken from the market series.
        provision_delay_s: time from scale-up to a ready node.
        idle_stop_s: an elastic node idle this long is stopped (auto start/stop).
        region: market region for prices and availability ("" = any).
        gang: where a job larger than one node takes its GPUs (:class:`GangMode`).
    """

    name: str
    kind: PoolKind
    model: GpuModel
    gpus_per_node: int
    min_nodes: int
    max_nodes: int
    initial_nodes: int | None = None
    sharing: Sharing = Sharing.EXCLUSIVE
    replicas: int = 1
    mig_layout: tuple[str, ...] = ()
    cpus_per_node: float = 0.0
    mem_mib_per_node: int = 0
    cost_per_gpu_hour: float | None = None
    provision_delay_s: float = 180.0
    idle_stop_s: float = 600.0
    region: str = ""
    gang: GangMode = GangMode.WHOLE_NODES

    @property
    def start_nodes(self) -> int:
        return self.min_nodes if self.initial_nodes is None else self.initial_nodes


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job runs: whole GPUs / replicas, or one MIG slice.

    ``gpus`` lists ``(node_id, gpu_index)``; for a MIG placement it has one entry
    and ``slice_start`` is the start memory slice of the instance the job takes.
    """

    pool: str
    gpus: tuple[tuple[str, int], ...]
    slice_start: int | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for n, _ in self.gpus))


class Slice:
    """A MIG GPU instance and the job (if any) holding it."""

    __slots__ = ("_uuid", "gpu", "holder", "profile", "start")

    def __init__(self, gpu: Gpu, profile: MigProfile, start: int) -> None:
        self.gpu = gpu
        self.profile = profile
        self.start = start
        self._uuid: str | None = None
        self.holder: str | None = None

    @property
    def uuid(self) -> str:
        """A stable MIG UUID, derived lazily: reconfigurations are hot in simulation."""
        if self._uuid is None:
            self._uuid = f"MIG-{_uuid.uuid5(_uuid.NAMESPACE_URL, f'{self.gpu.uuid}/{self.profile.name}/{self.start}')}"
        return self._uuid


class Gpu:
    """One physical GPU: who holds it, and its MIG slices when MIG is enabled."""

    __slots__ = (
        "_uuid",
        "busy_until",
        "healthy",
        "holders",
        "index",
        "model",
        "node",
        "replicas",
        "sharing",
        "slices",
    )

    def __init__(self, node: Node, index: int, model: GpuModel, sharing: Sharing, replicas: int) -> None:
        self.node = node
        self.index = index
        self._uuid: str | None = None
        self.model = model
        self.sharing = sharing
        self.replicas = replicas if sharing is Sharing.TIMESLICE else 1
        self.holders: list[str] = []
        self.slices: list[Slice] = []
        self.healthy = True
        #: MIG reconfiguration in progress until this time (no new work).
        self.busy_until = 0.0

    @property
    def uuid(self) -> str:
        """A stable GPU UUID from node id and index, derived lazily: elastic nodes come and go."""
        if self._uuid is None:
            self._uuid = f"GPU-{_uuid.uuid5(_uuid.NAMESPACE_URL, f'{self.node.id}/{self.index}')}"
        return self._uuid

    @property
    def mig(self) -> bool:
        return self.sharing is Sharing.MIG

    def idle(self) -> bool:
        """No job on the GPU or any of its slices."""
        return not self.holders and all(s.holder is None for s in self.slices)

    def layout(self) -> tuple[str, ...]:
        """Profile names of the current MIG instances, in placement order."""
        return tuple(s.profile.name for s in sorted(self.slices, key=lambda s: s.start))


class Node:
    """A machine of a pool; elastic nodes come and go."""

    __slots__ = (
        "cpus",
        "free_cpus",
        "free_mem",
        "free_whole",
        "gpus",
        "id",
        "idle_since",
        "jobs",
        "mem_mib",
        "pool",
        "ready_at",
        "reclaim_at",
        "requested_at",
        "status",
    )

    def __init__(self, node_id: str, spec: PoolSpec, now: float, ready_at: float) -> None:
        self.id = node_id
        self.pool = spec.name
        self.gpus = [Gpu(self, i, spec.model, spec.sharing, spec.replicas) for i in range(spec.gpus_per_node)]
        self.cpus = spec.cpus_per_node
        self.mem_mib = spec.mem_mib_per_node
        self.free_cpus = spec.cpus_per_node
        self.free_mem = spec.mem_mib_per_node
        self.status = NodeStatus.PROVISIONING if ready_at > now else NodeStatus.READY
        self.requested_at = now
        self.ready_at = ready_at
        self.idle_since = ready_at
        #: GPUs with no holder at all (exclusive/timeslice pools); kept current by allocate/release.
        self.free_whole = spec.gpus_per_node if spec.sharing is not Sharing.MIG else 0
        self.jobs: set[str] = set()
        self.reclaim_at: float | None = None

    @property
    def ready(self) -> bool:
        return self.status is NodeStatus.READY


class Pool:
    """A pool's specification plus its current nodes."""

    __slots__ = ("_seq", "nodes", "spec")

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.nodes: dict[str, Node] = {}
        self._seq = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def new_node_id(self) -> str:
        self._seq += 1
        return f"{self.spec.name}-{self._seq:04d}"

    def capacity_gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes.values() if n.status is NodeStatus.READY)

    def free_whole_gpus(self) -> int:
        return sum(n.free_whole for n in self.nodes.values() if n.status is NodeStatus.READY)

    def provisioning_gpus(self) -> int:
        """GPUs of the nodes bought and not ready yet: capacity already on its way."""
        return sum(len(n.gpus) for n in self.nodes.values() if n.status is NodeStatus.PROVISIONING)


@dataclass(slots=True)
class JobRun:
    """A job's life in a cluster: queueing, running, preemption, completion.

    Attributes:
        job: the request.
        state: where it is in its life.
        placement: current placement when running.
        profile: the MIG profile it holds (MIG placements only).
        work_done: seconds of progress (at full speed) made and kept so far.
        checkpointed: the part of ``work_done`` that survives a preemption.
        checkpoint_at: when that checkpoint was written (None: the job holds none yet).
        attained: GPU-seconds of service received (Tiresias' 2D-LAS attained service).
        rate: progress per second (below 1 when time-sliced with other jobs).
        started_at: start of the current run segment.
        first_start: first time it started (queueing delay ends here).
        finish_time: completion time when done.
        preemptions / restarts: how often it was stopped / restarted.
        lost_gpu_seconds: GPU-seconds of work thrown away by preemption.
        enqueued_at: when it last entered the queue.
        queued_s: total time spent queued so far (all segments).
        reason: why it is pending / unschedulable.
        version: bumped whenever its scheduled completion changes (stale events are dropped).
        on_spot: it runs (or last ran) on spot capacity.
        shape: the request shape (see :func:`queue_shape`), computed once.
    """

    job: Job
    state: RunState = RunState.QUEUED
    placement: Placement | None = None
    profile: str | None = None
    work_done: float = 0.0
    checkpointed: float = 0.0
    checkpoint_at: float | None = None
    attained: float = 0.0
    rate: float = 1.0
    started_at: float = 0.0
    first_start: float | None = None
    finish_time: float | None = None
    preemptions: int = 0
    restarts: int = 0
    lost_gpu_seconds: float = 0.0
    enqueued_at: float = 0.0
    queued_s: float = 0.0
    reason: str = ""
    version: int = 0
    on_spot: bool = False
    shape: tuple[object, ...] = ()

    def __post_init__(self) -> None:
        self.shape = queue_shape(self.job)

    @property
    def remaining(self) -> float:
        return max(self.job.duration - self.work_done, 0.0)


@dataclass(slots=True)
class MarketQuote:
    """Prices and spot availability a policy may look at for one pool."""

    price_per_gpu_hour: float
    ondemand_per_gpu_hour: float
    spot_available_nodes: int | None = None
    reclaim_rate_per_hour: float = 0.0


def _submit_time(run: JobRun) -> float:
    return run.job.submit_time


def queue_shape(job: Job) -> tuple[object, ...]:
    """Jobs with equal keys fit in exactly the same places (request shape, host needs, spot eligibility)."""
    return (*job.shape, job.cpus, job.mem_mib, job.preemptible)


def estimate_key(job: Job) -> tuple[str, int, int]:
    """What a duration estimate may depend on: user, whole GPUs and milli-GPU share."""
    return (job.user, job.num_gpus, job.gpu_milli)


class ClusterState:
    """The one snapshot type every policy sees, in simulation and live.

    Holds the time, pools with their nodes/GPUs/slices, the queue (submission order)
    and the running jobs, plus market quotes per elastic pool and a demand signal.
    Mutation happens only through :meth:`allocate`, :meth:`release` and the node
    lifecycle helpers, which the simulator engine and the runtime both call after a
    feasibility check.
    """

    def __init__(self, pools: list[PoolSpec]) -> None:
        self.time = 0.0
        self.pools: dict[str, Pool] = {p.name: Pool(p) for p in pools}
        self.nodes: dict[str, Node] = {}
        #: queued jobs, always in submission order (see :meth:`enqueue`).
        self.queue: dict[str, JobRun] = {}
        #: the same jobs per priority level, each in submission order.
        self.queue_by_priority: dict[int, dict[str, JobRun]] = {}
        #: bumped by every enqueue/dequeue, so readers may cache views of the queue.
        self.queue_version = 0
        #: how many queued jobs have each request shape (see ``Job.shape``).
        self.queue_shapes: dict[tuple[object, ...], int] = {}
        #: queued jobs per duration-estimate key (user, GPUs, milli-GPU: what
        #: :class:`~rlsched.cluster.estimate.DurationEstimator` reads), each in submission
        #: order, so "the shortest-estimated queued jobs" costs O(keys), not O(queue).
        self.queue_by_estimate_key: dict[tuple[str, int, int], dict[str, JobRun]] = {}
        self.running: dict[str, JobRun] = {}
        self.quotes: dict[str, MarketQuote] = {}
        #: forecast GPU demand per request-size class ("fractional", "1", "2-4", "8+", total "*")
        #: over the next horizon, in average busy GPUs; set by a forecaster when one runs.
        self.demand_forecast: dict[str, float] = {}
        #: the horizon (seconds) ``demand_forecast`` covers; 0 while there is no forecast.
        self.demand_forecast_horizon_s = 0.0
        # Arrival-rate signal (GPUs requested per hour, exponentially decayed), fed by
        # :meth:`note_arrival` in simulation and live alike, so a policy sees the same
        # signal in training and in serving.
        self._arrival_rate = 0.0
        self._arrival_t = 0.0
        #: what schedulers may know about durations (learnt from completions).
        self.estimator = DurationEstimator()
        #: GPU-equivalents allocated now (a slice counts its compute share).
        self.allocated = 0.0
        #: seconds of work between checkpoints for jobs that name none (the world's default:
        #: the simulator sets its ``SimConfig`` value; see :mod:`rlsched.cluster.checkpoint`).
        self.checkpoint_interval_s = DEFAULT_CHECKPOINT_INTERVAL_S
        #: when the next event is due (None: nothing is left to happen), where the world can say: the
        #: simulator sets its own ``next_event_time``; the live runtime leaves it None (time goes on).
        #: The codec masks waiting only where nothing is left to happen (see ``ObservationCodec.unstranded``).
        self.next_event_due: Callable[[], float | None] | None = None

    # --- demand signal ------------------------------------------------------------------
    ARRIVAL_TAU_S = 3600.0

    def note_arrival(self, job: Job, now: float) -> None:
        """Record a submission for the arrival-rate demand signal."""
        rate = self.arrival_rate(now)
        self._arrival_rate = rate + job.gpu_demand * 3600.0 / self.ARRIVAL_TAU_S
        self._arrival_t = now

    def arrival_rate(self, now: float) -> float:
        """GPUs requested per hour recently (exponentially weighted, time constant 1 h)."""
        import math

        dt = now - self._arrival_t
        return self._arrival_rate * math.exp(-dt / self.ARRIVAL_TAU_S) if dt > 0 else self._arrival_rate

    # --- queue ------------------------------------------------------------------------
    def enqueue(self, run: JobRun) -> None:
        """Add a job to the queue, keeping submission order.

        Arrivals come in submission order and are appended; a preempted job
        re-entering with an earlier submission time triggers a re-sort (rare), so
        policies can always read ``queue`` as a FIFO without sorting it.
        """
        self.queue_version += 1
        jid = run.job.job_id
        st = run.job.submit_time
        level = self.queue_by_priority.setdefault(run.job.priority, {})
        by_key = self.queue_by_estimate_key.setdefault(estimate_key(run.job), {})
        for d in (self.queue, level, by_key):
            last = next(reversed(d.values()), None) if d else None
            if last is None or last.job.submit_time <= st:
                d[jid] = run
                continue
            # Re-entering behind later submissions: after every job submitted at or before it (where
            # a stable sort would put it), found by bisection; the dict is rebuilt once, in C.
            keys, vals = list(d), list(d.values())
            pos = bisect_right(vals, st, key=_submit_time)
            keys.insert(pos, jid)
            vals.insert(pos, run)
            d.clear()
            d.update(zip(keys, vals, strict=True))
        key = run.shape
        self.queue_shapes[key] = self.queue_shapes.get(key, 0) + 1

    def dequeue(self, job_id: str) -> JobRun:
        """Remove a job from the queue (it starts, or it can never run)."""
        self.queue_version += 1
        run = self.queue.pop(job_id)
        level = self.queue_by_priority[run.job.priority]
        del level[job_id]
        if not level:
            del self.queue_by_priority[run.job.priority]
        ek = estimate_key(run.job)
        same = self.queue_by_estimate_key[ek]
        del same[job_id]
        if not same:
            del self.queue_by_estimate_key[ek]
        key = run.shape
        n = self.queue_shapes[key] - 1
        if n:
            self.queue_shapes[key] = n
        else:
            del self.queue_shapes[key]
        return run

    # --- node lifecycle -------------------------------------------------------------
    def add_node(self, pool: str, now: float, ready_at: float) -> Node:
        """Add a node to a pool (ready now or provisioning until ``ready_at``)."""
        p = self.pools[pool]
        node = Node(p.new_node_id(), p.spec, now, ready_at)
        if p.spec.sharing is Sharing.MIG:
            from rlsched.cluster.feasibility import pack_layout

            layout = p.spec.mig_layout or (p.spec.model.mig_profiles[-1].name,)
            packed = pack_layout(p.spec.model, layout)
            assert packed is not None, "pool layouts are validated when the spec is built"
            for gpu in node.gpus:
                gpu.slices = [Slice(gpu, prof, start) for prof, start in packed]
        p.nodes[node.id] = node
        self.nodes[node.id] = node
        return node

    def remove_node(self, node: Node) -> None:
        """Drop a node that holds no jobs (stopped or reclaimed after preemption)."""
        assert not node.jobs, f"node {node.id} still holds jobs {sorted(node.jobs)}"
        node.status = NodeStatus.STOPPED
        del self.pools[node.pool].nodes[node.id]
        del self.nodes[node.id]

    # --- allocation ------------------------------------------------------------------
    def allocate(self, run: JobRun, placement: Placement, profile: str | None = None) -> None:
        """Record ``run`` on ``placement``; the caller checked feasibility first."""
        job_id = run.job.job_id
        job = run.job
        for node_id, gi in placement.gpus:
            node = self.nodes[node_id]
            gpu = node.gpus[gi]
            if placement.slice_start is not None:
                for s in gpu.slices:
                    if s.start == placement.slice_start:
                        s.holder = job_id
                        self.allocated += s.profile.fraction
                        break
            else:
                if not gpu.holders:
                    node.free_whole -= 1
                    self.allocated += 1.0
                gpu.holders.append(job_id)
            node.jobs.add(job_id)
        if job.cpus or job.mem_mib:
            first = self.nodes[placement.gpus[0][0]] if placement.gpus else None
            if first is not None:
                first.free_cpus -= job.cpus
                first.free_mem -= job.mem_mib
        run.placement = placement
        run.profile = profile

    def release(self, run: JobRun, now: float) -> list[Gpu]:
        """Free what ``run`` holds; returns the GPUs touched (their sharing changed)."""
        placement = run.placement
        assert placement is not None
        job_id = run.job.job_id
        touched: list[Gpu] = []
        for node_id, gi in placement.gpus:
            node = self.nodes[node_id]
            gpu = node.gpus[gi]
            if placement.slice_start is not None:
                for s in gpu.slices:
                    if s.holder == job_id:
                        s.holder = None
                        self.allocated -= s.profile.fraction
            else:
                gpu.holders.remove(job_id)
                if not gpu.holders:
                    node.free_whole += 1
                    self.allocated -= 1.0
            node.jobs.discard(job_id)
            if not node.jobs:
                node.idle_since = now
            touched.append(gpu)
        job = run.job
        if (job.cpus or job.mem_mib) and placement.gpus:
            first = self.nodes[placement.gpus[0][0]]
            first.free_cpus += job.cpus
            first.free_mem += job.mem_mib
        run.placement = None
        run.profile = None
        return touched

    # --- summaries -----------------------------------------------------------------
    def capacity_gpus(self) -> int:
        return sum(p.capacity_gpus() for p in self.pools.values())

    def allocated_gpus(self) -> float:
        """GPUs in use: a MIG slice counts its compute share, a time-sliced GPU with any job counts 1."""
        used = 0.0
        for node in self.nodes.values():
            if not node.jobs:
                continue
            for gpu in node.gpus:
                if gpu.slices:
                    used += sum(s.profile.fraction for s in gpu.slices if s.holder is not None)
                elif gpu.holders:
                    used += 1.0
        return used
