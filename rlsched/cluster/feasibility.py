"""The ONE module that decides which placements and MIG layouts are legal.

The simulator's engine, the Gymnasium action mask, every heuristic and the live
runtime ask this module; nothing else encodes the rules. The rules:

* A job may only run on a model it allows (``gpu_models``; empty = any).
* Only preemptible jobs may run on spot capacity (``shared/data/FORMAT.md``).
* Exclusive pools: ``n`` whole idle GPUs, on one node when ``n`` fits a node,
  otherwise a gang over several nodes of the pool, by the pool's gang mode
  (:class:`~rlsched.cluster.model.GangMode`): ``whole-nodes`` (default) takes
  ``n // G`` completely free nodes plus one node with ``n % G`` free GPUs (``G`` GPUs
  per node), first fit in node order, as the Tiresias simulator's ``ms_yarn``
  placement (``simulator/switch.py``, ``try_cross_node_alloc``) and Lucid's simulator
  do and as a real fleet must for jobs whose all-reduce runs over the node's
  NVLink/NVSwitch; ``packed`` takes any free GPUs, nodes with the most free GPUs
  first, at no speed cost (optimistic).
* Time-sliced pools: one replica on each of ``n`` GPUs of a node; a GPU serves at
  most ``replicas`` jobs, and the jobs on it share its speed equally.
* MIG pools: a fractional request takes a free instance of the smallest profile
  whose compute share covers ``gpu_milli`` (its placement is legal by
  construction of the layout); a whole-GPU request needs a free 7g instance; more
  than one GPU cannot be served by MIG instances and is infeasible there.
* A GPU under MIG reconfiguration, unhealthy, or on a node that is not ready
  accepts nothing; CPU and memory are checked when the node declares them.
* A MIG layout is legal when its instances can be placed at legal start positions
  without overlapping memory slices, use at most 7 compute slices, and respect
  each profile's maximum count. Every GPU backend checks a requested layout with
  :func:`place_mig_devices` before it touches the GPU.
* Every decision passes :func:`check_decision`: a placement and a re-split by the
  rules above; a preemption names a running job; a scale-up needs room in an
  elastic pool (its maximum and, for spot, the availability the market publishes in
  ``ClusterState.quotes``); a scale-down needs a provisioning or idle node above the
  pool's minimum; a wake-up is at a finite time in the future. Everything it reads
  is in the :class:`ClusterState` it is given, so the simulator and the live
  runtime decide from the same data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from math import ceil, isfinite

from rlsched.cluster.catalog import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, GpuModel, MigProfile
from rlsched.cluster.decisions import Decision, Place, Preempt, Reconfigure, Scale, WakeAt
from rlsched.cluster.job import Job
from rlsched.cluster.model import (
    ClusterState,
    GangMode,
    Node,
    NodeStatus,
    Placement,
    Pool,
    PoolKind,
    PoolSpec,
    Sharing,
)
from rlsched.errors import ClusterSpecError

# --- MIG layouts ---------------------------------------------------------------------


def pack_layout(model: GpuModel, names: Iterable[str]) -> list[tuple[MigProfile, int]] | None:
    """Place the named instances on one GPU of ``model``, or None if impossible.

    Returns ``(profile, start)`` pairs sorted by start. Search is exhaustive
    (at most 7 instances), so a None answer means the layout is truly illegal.
    """
    return _pack(model, tuple(sorted(names)))


@lru_cache(maxsize=4096)
def _pack(model: GpuModel, names: tuple[str, ...]) -> list[tuple[MigProfile, int]] | None:
    try:
        profiles = [model.profile(n) for n in names]
    except Exception:
        return None
    if not profiles:
        return []
    if sum(p.compute_slices for p in profiles) > MIG_COMPUTE_SLICES:
        return None
    counts: dict[str, int] = {}
    for p in profiles:
        counts[p.name] = counts.get(p.name, 0) + 1
        if counts[p.name] > p.max_count:
            return None
    # Largest first keeps the search tiny; starts are tried in ascending order.
    order = sorted(profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    used = [False] * MIG_MEMORY_SLICES
    chosen: list[tuple[MigProfile, int]] = []

    def place(i: int) -> bool:
        if i == len(order):
            return True
        prof = order[i]
        for start in prof.starts:
            span = range(start, start + prof.memory_slices)
            if span.stop > MIG_MEMORY_SLICES or any(used[s] for s in span):
                continue
            for s in span:
                used[s] = True
            chosen.append((prof, start))
            if place(i + 1):
                return True
            chosen.pop()
            for s in span:
                used[s] = False
        return False

    if not place(0):
        return None
    return sorted(chosen, key=lambda ps: ps[1])


def legal_layout(model: GpuModel, names: Sequence[str]) -> bool:
    """True if the instances ``names`` fit together on one GPU of ``model``."""
    return model.mig_capable and pack_layout(model, names) is not None


def named_layouts(model: GpuModel) -> dict[str, tuple[str, ...]]:
    """The standard layouts of a MIG-capable model, as mig-parted names them.

    ``all-1g`` .. ``all-7g`` fill the GPU with one profile; ``balanced`` is
    mig-parted's ``all-balanced`` (2x1g + 2g + 3g); ``mixed-4-3`` pairs a 4g with a 3g.
    These are the reconfiguration targets a policy chooses between.
    """
    if not model.mig_capable:
        return {}
    by_g: dict[int, MigProfile] = {}
    for p in model.mig_profiles:
        if "+me" in p.name:
            continue
        by_g.setdefault(p.compute_slices, p)  # first = smallest memory for that g
    one, two, three, four, seven = by_g[1], by_g[2], by_g[3], by_g[4], by_g[7]
    return {
        "all-1g": (one.name,) * one.max_count,
        "all-2g": (two.name,) * two.max_count,
        "all-3g": (three.name,) * three.max_count,
        "balanced": (one.name, one.name, two.name, three.name),
        "mixed-4-3": (four.name, three.name),
        "all-7g": (seven.name,),
    }


def layout_for_profile(model: GpuModel, profile: str) -> tuple[str, ...] | None:
    """The named layout of ``model`` with the most instances of ``profile`` (None: none has it).

    What a GPU is re-split to for a job needing ``profile`` (the heuristics and the MIG
    re-split rule alike): the most jobs of that shape per re-split.
    """
    best: tuple[str, ...] | None = None
    for layout in named_layouts(model).values():
        n = layout.count(profile)
        if n and (best is None or n > best.count(profile)):
            best = layout
    return best


def resolve_layout(model: GpuModel, layout: str | Sequence[str]) -> tuple[str, ...]:
    """A layout given by name (``balanced``) or as profile names, checked legal."""
    if isinstance(layout, str):
        named = named_layouts(model)
        if layout in named:
            return named[layout]
        names: tuple[str, ...] = tuple(x for x in layout.replace("+", ",").split(",") if x)
    else:
        names = tuple(layout)
    if not model.mig_capable:
        raise ClusterSpecError(f"{model.name} does not support MIG")
    for n in names:
        model.profile(n)
    if pack_layout(model, names) is None:
        raise ClusterSpecError(
            f"MIG layout {'+'.join(names)} does not fit on one {model.name} "
            f"(7 compute slices, 8 memory slices, per-profile maxima and placements)"
        )
    return names


def format_mig_counts(devices: Mapping[str, int]) -> str:
    """``devices`` (profile name -> count) as mig-parted writes them, e.g. ``{"1g.10gb"=2, "3g.40gb"=1}``."""
    inner = ", ".join(f'"{p}"={c}' for p, c in sorted(devices.items()) if c)
    return "{" + inner + "}"


def place_mig_devices(model: GpuModel, devices: Mapping[str, int], gpu_label: str) -> list[tuple[MigProfile, int]]:
    """Where the MIG instances ``devices`` (profile name -> count) go on one GPU of ``model``.

    The layout check every GPU backend makes before it destroys a GPU's instances, so
    a layout the NVML backend refuses is refused by the simulated one too, with the
    same words. Returns ``(profile, start)`` pairs sorted by start (as
    :func:`pack_layout`). ``gpu_label`` names the GPU in the message (its marketing name).

    Raises:
        ClusterSpecError: a count that is not an integer >= 0, or instances that do
            not fit one GPU together.
        UnknownGpuModelError: a profile ``model`` does not have.
    """
    names: list[str] = []
    for profile, count in devices.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ClusterSpecError(f"MIG device count for {profile!r} must be an integer >= 0, got {count!r}")
        names.extend([profile] * count)
    for name in sorted(set(names)):
        model.profile(name)
    placed = pack_layout(model, names)
    if placed is None:
        raise ClusterSpecError(
            f"MIG layout {format_mig_counts(devices)} does not fit one {gpu_label} ({model.name}): "
            f"7 compute slices, 8 memory slices, per-profile maxima and placements"
        )
    return placed


@lru_cache(maxsize=1024)
def profile_for(model: GpuModel, num_gpus: int, gpu_milli: int) -> MigProfile | None:
    """The smallest MIG profile serving a request on ``model`` (None if none can).

    A fraction needs ``ceil(milli * 7 / 1000)`` compute slices (with 1% tolerance,
    so 143 milli -> 1g, 250 -> 2g); among profiles with enough compute the one with
    least memory wins. A whole GPU needs the 7g profile.
    """
    if not model.mig_capable or num_gpus != 1:
        return None
    need = MIG_COMPUTE_SLICES if gpu_milli >= 1000 else max(1, ceil(gpu_milli * MIG_COMPUTE_SLICES / 1000 - 0.01))
    fitting = [p for p in model.mig_profiles if p.compute_slices >= need and "+me" not in p.name]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (p.compute_slices, p.memory_slices))


# --- jobs vs pools -------------------------------------------------------------------


def model_allowed(job: Job, model: GpuModel) -> bool:
    return not job.gpu_models or model.name in job.gpu_models


def pool_allows(job: Job, spec: PoolSpec) -> bool:
    """Model and capacity-kind admission: allowed GPU model, and spot only if preemptible."""
    if job.gpu_models and spec.model.name not in job.gpu_models:
        return False
    return job.preemptible or spec.kind is not PoolKind.SPOT


def fits_pool_spec(job: Job, spec: PoolSpec) -> bool:
    """Could the job ever run in this pool, at its largest size, with MIG layouts free to change?"""
    if job.num_gpus <= 0 or not pool_allows(job, spec):
        return False
    if spec.cpus_per_node and job.cpus > spec.cpus_per_node:
        return False
    if spec.mem_mib_per_node and job.mem_mib > spec.mem_mib_per_node:
        return False
    if spec.sharing is Sharing.MIG:
        return profile_for(spec.model, job.num_gpus, job.gpu_milli) is not None
    if job.num_gpus <= spec.gpus_per_node:
        return spec.max_nodes >= 1
    return job.num_gpus <= spec.max_nodes * spec.gpus_per_node


def unschedulable_reason(job: Job, pools: Sequence[PoolSpec]) -> str:
    """Why a job that fits no pool cannot run, for reports and ``status``."""
    if job.num_gpus <= 0:
        return "asks for no GPU"
    allowed = [p for p in pools if pool_allows(job, p)]
    if not allowed:
        if not any(model_allowed(job, p.model) for p in pools):
            return f"no pool has an allowed GPU model ({'|'.join(sorted(job.gpu_models))})"
        return "only spot pools have its GPU model and it is not preemptible"
    biggest = max(p.max_nodes * p.gpus_per_node for p in allowed)
    if job.num_gpus > biggest:
        return f"asks for {job.num_gpus} GPUs; the largest allowed pool has {biggest}"
    if job.num_gpus > 1 and all(p.sharing is Sharing.MIG for p in allowed):
        return f"asks for {job.num_gpus} whole GPUs; MIG pools give one instance per job"
    return "no pool can hold its request (MIG profile, CPU or memory)"


def _node_has_host(node: Node, job: Job) -> bool:
    if node.cpus and job.cpus > node.free_cpus + 1e-9:
        return False
    return not (node.mem_mib and job.mem_mib > node.free_mem)


def _gpu_open(gpu_busy_until: float, healthy: bool, now: float) -> bool:
    return healthy and gpu_busy_until <= now


def node_candidates(node: Node, job: Job, now: float) -> list[Placement]:
    """Legal placements of ``job`` on one ready node (one per distinct choice)."""
    spec_sharing = node.gpus[0].sharing if node.gpus else Sharing.EXCLUSIVE
    if not node.ready or not _node_has_host(node, job):
        return []
    out: list[Placement] = []
    if spec_sharing is Sharing.MIG:
        prof = profile_for(node.gpus[0].model, job.num_gpus, job.gpu_milli)
        if prof is None:
            return []
        for gpu in node.gpus:
            if not _gpu_open(gpu.busy_until, gpu.healthy, now):
                continue
            for s in gpu.slices:
                if s.holder is None and s.profile is prof:
                    out.append(Placement(node.pool, ((node.id, gpu.index),), s.start))
                    break
        return out
    n = job.num_gpus
    if spec_sharing is Sharing.EXCLUSIVE:
        if node.free_whole < n:
            return []
        free = [g.index for g in node.gpus if not g.holders and _gpu_open(g.busy_until, g.healthy, now)]
        if len(free) < n:
            return []
        return [Placement(node.pool, tuple((node.id, i) for i in free[:n]))]
    # time-slicing: least-shared GPUs first, one replica each
    open_gpus = sorted(
        (g for g in node.gpus if len(g.holders) < g.replicas and _gpu_open(g.busy_until, g.healthy, now)),
        key=lambda g: (len(g.holders), g.index),
    )
    if len(open_gpus) < n:
        return []
    return [Placement(node.pool, tuple((node.id, g.index) for g in open_gpus[:n]))]


def gang_shape(spec: PoolSpec, num_gpus: int) -> tuple[int, int]:
    """``(whole nodes, GPUs on one more node)`` a ``whole-nodes`` gang of ``num_gpus`` takes in ``spec``'s pool."""
    return divmod(num_gpus, spec.gpus_per_node)


def _open_whole(node: Node, now: float) -> list[int]:
    """Indices of the node's GPUs that no job holds and that accept work now."""
    return [g.index for g in node.gpus if not g.holders and _gpu_open(g.busy_until, g.healthy, now)]


def gang_candidate(pool: Pool, job: Job, now: float) -> Placement | None:
    """A multi-node placement of whole GPUs for a job larger than one node, by the pool's gang mode.

    ``whole-nodes``: the first ``n // G`` nodes (in node order) whose GPUs are all free,
    plus the first other node with at least ``n % G`` free GPUs for the remainder.
    ``packed``: any free GPUs, the nodes with the most free GPUs first.
    """
    spec = pool.spec
    if spec.sharing is Sharing.MIG:
        return None
    if spec.gang is GangMode.WHOLE_NODES:
        full, rest = gang_shape(spec, job.num_gpus)
        whole: list[tuple[str, int]] = []
        taken = 0
        remainder: list[tuple[str, int]] | None = None if rest else []
        size = spec.gpus_per_node
        for nd in pool.nodes.values():
            if not nd.ready or not _node_has_host(nd, job):
                continue
            if taken < full and nd.free_whole == size:
                free = _open_whole(nd, now)
                if len(free) == size:
                    whole.extend((nd.id, i) for i in free)
                    taken += 1
                    if taken == full and remainder is not None:
                        break
                    continue
            if remainder is None and nd.free_whole >= rest:
                free = _open_whole(nd, now)
                if len(free) >= rest:
                    remainder = [(nd.id, i) for i in free[:rest]]
                    if taken == full:
                        break
        if taken < full or remainder is None:
            return None
        return Placement(pool.name, tuple(whole + remainder))
    nodes = sorted(
        (nd for nd in pool.nodes.values() if nd.ready and nd.free_whole > 0 and _node_has_host(nd, job)),
        key=lambda nd: -nd.free_whole,
    )
    picked: list[tuple[str, int]] = []
    for nd in nodes:
        for g in nd.gpus:
            if not g.holders and _gpu_open(g.busy_until, g.healthy, now):
                picked.append((nd.id, g.index))
                if len(picked) == job.num_gpus:
                    return Placement(pool.name, tuple(picked))
    return None


def gang_fits_after(pool: Pool, job: Job, now: float, freed: dict[str, int]) -> bool:
    """Could a job larger than one node be placed in ``pool`` once ``freed[node]`` more GPUs are free there?

    The same gang rule as :func:`gang_candidate`, for a rule that makes room by
    preemption and must not suspend jobs whose GPUs would not add up to a legal place.
    """
    spec = pool.spec
    if spec.sharing is Sharing.MIG:
        return False
    free = [len(_open_whole(nd, now)) + freed.get(nd.id, 0)
            for nd in pool.nodes.values() if nd.ready and _node_has_host(nd, job)]
    if spec.gang is GangMode.PACKED:
        return sum(free) >= job.num_gpus
    full, rest = gang_shape(spec, job.num_gpus)
    whole = sum(1 for f in free if f >= spec.gpus_per_node)
    if whole < full:
        return False
    return rest == 0 or whole > full or any(rest <= f < spec.gpus_per_node for f in free)


def pool_candidates(pool: Pool, job: Job, now: float, *, first: bool = False) -> list[Placement]:
    """Every distinct legal placement of ``job`` in ``pool`` right now.

    With ``first=True`` the scan stops at the first legal placement (first-fit).
    """
    spec = pool.spec
    if job.num_gpus <= 0 or not pool_allows(job, spec):
        return []
    if job.num_gpus > spec.gpus_per_node:
        gang = gang_candidate(pool, job, now)
        return [gang] if gang else []
    n = job.num_gpus
    exclusive = spec.sharing is Sharing.EXCLUSIVE
    out: list[Placement] = []
    for node in pool.nodes.values():
        if exclusive and node.free_whole < n:
            continue
        found = node_candidates(node, job, now)
        if found:
            out.extend(found)
            if first:
                return out[:1]
    return out


def candidates(state: ClusterState, job: Job) -> list[Placement]:
    """Every distinct legal placement of ``job`` in the whole cluster right now."""
    out: list[Placement] = []
    for pool in state.pools.values():
        out.extend(pool_candidates(pool, job, state.time))
    return out


def check_placement(state: ClusterState, job: Job, placement: Placement) -> str | None:
    """None if ``placement`` is legal for ``job`` now, else the reason it is not.

    This is the gate every decision passes before it takes effect, whoever made it.
    """
    pool = state.pools.get(placement.pool)
    if pool is None:
        return f"unknown pool {placement.pool!r}"
    spec = pool.spec
    if job.num_gpus <= 0:
        return "job asks for no GPU"
    if not pool_allows(job, spec):
        if not model_allowed(job, spec.model):
            return f"job does not allow {spec.model.name}"
        return "a job that is not preemptible cannot run on spot capacity"
    if len(set(placement.gpus)) != len(placement.gpus):
        return "placement names a GPU twice"
    nodes = set()
    for node_id, gi in placement.gpus:
        node = state.nodes.get(node_id)
        if node is None or node.pool != pool.name:
            return f"node {node_id} is not in pool {pool.name}"
        if not node.ready:
            return f"node {node_id} is {node.status.value}"
        if not 0 <= gi < len(node.gpus):
            return f"node {node_id} has no GPU {gi}"
        gpu = node.gpus[gi]
        if not _gpu_open(gpu.busy_until, gpu.healthy, state.time):
            return f"GPU {node_id}/{gi} is reconfiguring or unhealthy"
        nodes.add(node_id)
    if spec.sharing is Sharing.MIG:
        prof = profile_for(spec.model, job.num_gpus, job.gpu_milli)
        if prof is None:
            return f"no MIG profile of {spec.model.name} serves {job.num_gpus} GPU(s) x {job.gpu_milli} milli"
        if len(placement.gpus) != 1 or placement.slice_start is None:
            return "a MIG placement names exactly one GPU and one instance"
        node_id, gi = placement.gpus[0]
        gpu = state.nodes[node_id].gpus[gi]
        for s in gpu.slices:
            if s.start == placement.slice_start:
                if s.profile is not prof:
                    return f"instance at slice {s.start} is {s.profile.name}, job needs {prof.name}"
                if s.holder is not None:
                    return f"instance {s.profile.name}@{s.start} on {node_id}/{gi} is held by {s.holder}"
                break
        else:
            return f"GPU {node_id}/{gi} has no instance starting at slice {placement.slice_start}"
    else:
        if placement.slice_start is not None:
            return "pool does not use MIG"
        if len(placement.gpus) != job.num_gpus:
            return f"job needs {job.num_gpus} GPUs, placement gives {len(placement.gpus)}"
        if job.num_gpus <= spec.gpus_per_node and len(nodes) != 1:
            return "a job that fits one node must run on one node"
        if job.num_gpus > spec.gpus_per_node and spec.gang is GangMode.WHOLE_NODES:
            why = _whole_nodes_problem(state, spec, job.num_gpus, placement)
            if why is not None:
                return why
        for node_id, gi in placement.gpus:
            gpu = state.nodes[node_id].gpus[gi]
            limit = gpu.replicas if spec.sharing is Sharing.TIMESLICE else 1
            if len(gpu.holders) >= limit:
                return f"GPU {node_id}/{gi} is full"
    first = state.nodes[placement.gpus[0][0]]
    if not _node_has_host(first, job):
        return f"node {first.id} lacks CPU or memory"
    return None


def _whole_nodes_problem(state: ClusterState, spec: PoolSpec, n: int, placement: Placement) -> str | None:
    """Why a gang placement breaks the ``whole-nodes`` rule (None if it keeps it)."""
    full, rest = gang_shape(spec, n)
    per_node: dict[str, int] = {}
    for node_id, gi in placement.gpus:
        if state.nodes[node_id].gpus[gi].holders:
            return f"GPU {node_id}/{gi} is shared; a gang takes whole GPUs"
        per_node[node_id] = per_node.get(node_id, 0) + 1
    want = sorted([spec.gpus_per_node] * full + ([rest] if rest else []))
    if sorted(per_node.values()) != want:
        got = "+".join(str(c) for c in sorted(per_node.values(), reverse=True))
        tail = f" plus {rest} GPU(s) on one more node" if rest else ""
        return (f"a {n}-GPU gang in pool {spec.name} (gang mode whole-nodes) takes {full} whole node(s){tail}, "
                f"not {got}")
    return None


def reconfigure_check(state: ClusterState, node_id: str, gpu_index: int, layout: Sequence[str]) -> str | None:
    """None if GPU ``node_id/gpu_index`` may be reconfigured to ``layout`` now."""
    node = state.nodes.get(node_id)
    if node is None or not node.ready:
        return f"node {node_id} is not ready"
    if not 0 <= gpu_index < len(node.gpus):
        return f"node {node_id} has no GPU {gpu_index}"
    gpu = node.gpus[gpu_index]
    if not gpu.mig:
        return f"GPU {node_id}/{gpu_index} is not in MIG mode"
    if not gpu.idle():
        return f"GPU {node_id}/{gpu_index} is in use (drain it first)"
    if gpu.busy_until > state.time:
        return f"GPU {node_id}/{gpu_index} is already reconfiguring"
    if pack_layout(gpu.model, layout) is None:
        return f"layout {'+'.join(layout)} does not fit {gpu.model.name}"
    if tuple(sorted(layout)) == tuple(sorted(gpu.layout())):
        return "GPU already has this layout"
    return None


# --- decisions -----------------------------------------------------------------------


def scale_up_room(state: ClusterState, pool: Pool) -> int:
    """Nodes ``pool`` may still add now (0 for an on-prem pool).

    Up to the pool's ``max_nodes`` and, for a spot pool, no more than the market's
    availability as ``state.quotes`` publishes it (a missing quote or None = unlimited).
    A scale-up is legal when this is positive and adds at most this many nodes.
    """
    spec = pool.spec
    if not spec.kind.elastic:
        return 0
    held = len(pool.nodes)
    room = spec.max_nodes - held
    if spec.kind is PoolKind.SPOT:
        q = state.quotes.get(pool.name)
        if q is not None and q.spot_available_nodes is not None:
            room = min(room, q.spot_available_nodes - held)
    return max(room, 0)


def _stoppable(node: Node) -> bool:
    """A scale-down may stop a node that is still provisioning or ready without jobs."""
    return node.status is NodeStatus.PROVISIONING or (node.ready and not node.jobs)


def stoppable_nodes(pool: Pool) -> list[Node]:
    """The nodes a scale-down of ``pool`` may stop, in the order it stops them.

    Provisioning nodes first (nothing runs there yet), then ready nodes without jobs,
    each in the pool's node order; a node with jobs is never stopped by a scale-down.
    """
    return sorted((n for n in pool.nodes.values() if _stoppable(n)), key=lambda n: n.ready)


def scale_down_room(pool: Pool) -> int:
    """Nodes a scale-down of ``pool`` may stop now, keeping its ``min_nodes`` (0 for on-prem)."""
    if not pool.spec.kind.elastic:
        return 0
    return max(min(len(stoppable_nodes(pool)), len(pool.nodes) - pool.spec.min_nodes), 0)


def _scale_problem(state: ClusterState, decision: Scale) -> str | None:
    pool = state.pools.get(decision.pool)
    if pool is None:
        return f"unknown pool {decision.pool!r}"
    spec = pool.spec
    if not spec.kind.elastic:
        return f"pool {decision.pool} is on-prem and cannot scale"
    held = len(pool.nodes)
    if decision.delta > 0:
        if scale_up_room(state, pool) > 0:
            return None
        q = state.quotes.get(pool.name)
        avail = q.spot_available_nodes if q is not None and spec.kind is PoolKind.SPOT else None
        market = f", spot available {avail}" if avail is not None else ""
        return f"pool {decision.pool} cannot grow (max {spec.max_nodes}, held {held}{market})"
    if decision.delta < 0:
        if held > spec.min_nodes and any(_stoppable(n) for n in pool.nodes.values()):
            return None
        return f"pool {decision.pool} has no idle node to stop"
    return "scale by 0"


def check_decision(state: ClusterState, decision: Decision) -> str | None:
    """None if ``decision`` may take effect on ``state`` now, else a short reason why not.

    The one legality gate for every kind of decision: the simulator's engine refuses
    exactly what this refuses, the runtime guard refuses and audits with its reason, and
    the action mask and the autoscalers size their requests by the same rules
    (:func:`scale_up_room`, :func:`scale_down_room`, :func:`pool_candidates`,
    :func:`reconfigure_check`). It reads nothing but ``state``.
    """
    if isinstance(decision, Place):
        run = state.queue.get(decision.job_id)
        if run is None:
            return f"job {decision.job_id} is not queued"
        return check_placement(state, run.job, decision.placement)
    if isinstance(decision, Reconfigure):
        return reconfigure_check(state, decision.node_id, decision.gpu_index, decision.layout)
    if isinstance(decision, Preempt):
        return None if decision.job_id in state.running else f"job {decision.job_id} is not running"
    if isinstance(decision, Scale):
        return _scale_problem(state, decision)
    if isinstance(decision, WakeAt):
        if not isfinite(decision.time):
            return "wake time is not finite"
        return None if decision.time > state.time else "wake time is not in the future"
    return f"unknown decision {decision!r}"


def has_free_capacity(state: ClusterState) -> bool:
    """True if any ready GPU, MIG instance or time-slice replica is free right now."""
    now = state.time
    for node in state.nodes.values():
        if not node.ready:
            continue
        if node.free_whole > 0:
            return True
        for gpu in node.gpus:
            if gpu.busy_until > now or not gpu.healthy:
                continue
            if gpu.slices:
                for s in gpu.slices:
                    if s.holder is None:
                        return True
            elif gpu.sharing is Sharing.TIMESLICE and len(gpu.holders) < gpu.replicas:
                return True
    return False
