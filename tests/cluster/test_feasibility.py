"""Feasibility: MIG layout legality, profile choice, and the allocation invariants."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.cluster.catalog import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, GpuModel, MigProfile, gpu_model
from rlsched.cluster.decisions import Place, Preempt, Reconfigure, Scale, WakeAt
from rlsched.cluster.feasibility import (
    candidates,
    check_decision,
    check_placement,
    fits_pool_spec,
    legal_layout,
    named_layouts,
    pack_layout,
    place_mig_devices,
    profile_for,
    reconfigure_check,
    resolve_layout,
    scale_down_room,
    scale_up_room,
    stoppable_nodes,
    unschedulable_reason,
)
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, JobRun, MarketQuote, NodeStatus, Placement, PoolKind, PoolSpec, Sharing
from rlsched.errors import ClusterSpecError, UnknownGpuModelError

MIG_MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")
A100 = gpu_model("A100-80GB")
H100 = gpu_model("H100-80GB")


# --------------------------------------------------------------------------- MIG layouts


@pytest.mark.parametrize("model_name", MIG_MODELS)
def test_every_all_profile_config_is_legal_at_its_max_and_illegal_beyond(model_name: str) -> None:
    model = gpu_model(model_name)
    for prof in model.mig_profiles:
        full = [prof.name] * prof.max_count
        packed = pack_layout(model, full)
        assert packed is not None, f"all-{prof.name} x{prof.max_count} should be legal"
        assert sorted(p.name for p, _ in packed) == sorted(full)
        assert legal_layout(model, full)
        assert pack_layout(model, [*full, prof.name]) is None, f"{prof.max_count + 1} x {prof.name} is illegal"
        assert not legal_layout(model, [*full, prof.name])


def test_eight_1g_instances_on_an_h100_are_illegal() -> None:
    assert legal_layout(H100, ["1g.10gb"] * 7)
    assert not legal_layout(H100, ["1g.10gb"] * 8)


@pytest.mark.parametrize("model_name", MIG_MODELS)
def test_mixed_layouts(model_name: str) -> None:
    model = gpu_model(model_name)
    by = {}
    for p in model.mig_profiles:
        if "+me" not in p.name:
            by.setdefault((p.compute_slices, p.memory_slices), p.name)
    g1, g1d, g2, g3, g4, g7 = by[(1, 1)], by[(1, 2)], by[(2, 2)], by[(3, 4)], by[(4, 4)], by[(7, 8)]
    assert legal_layout(model, [g4, g3])
    assert not legal_layout(model, [g4, g4])
    assert legal_layout(model, [g2, g2, g2, g1])
    assert legal_layout(model, [g2, g2, g2, g1d])  # the 2-memory-slice 1g fits at start 6
    assert legal_layout(model, [g1, g1, g2, g3])  # mig-parted all-balanced
    assert legal_layout(model, [g4, g2, g1])
    assert legal_layout(model, [g3, g2, g2])
    assert legal_layout(model, [g3, g3])
    # Compute fits (7) but memory does not (4 + 4 + 1 > 8): placement, not counts, decides.
    assert not legal_layout(model, [g3, g3, g1])
    # Four 2-memory 1g use all 8 memory slices: nothing else fits although compute is 4/7.
    assert legal_layout(model, [g1d] * 4)
    assert not legal_layout(model, [*[g1d] * 4, g1])
    assert not legal_layout(model, [g7, g1])
    assert not legal_layout(model, [g4, g3, g1])  # 8 compute slices
    assert legal_layout(model, [])


def test_named_layouts_are_legal_and_balanced_is_mig_parted_all_balanced() -> None:
    for name in MIG_MODELS:
        model = gpu_model(name)
        layouts = named_layouts(model)
        assert set(layouts) >= {"all-1g", "all-2g", "all-3g", "balanced", "mixed-4-3", "all-7g"}
        for lname, layout in layouts.items():
            assert legal_layout(model, layout), (name, lname)
            assert resolve_layout(model, lname) == layout
    assert sorted(named_layouts(A100)["balanced"]) == sorted(["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
    assert named_layouts(gpu_model("V100-32GB")) == {}


def test_resolve_layout_errors() -> None:
    assert resolve_layout(A100, "3g.40gb+3g.40gb") == ("3g.40gb", "3g.40gb")
    with pytest.raises(ClusterSpecError, match="does not fit"):
        resolve_layout(A100, "4g.40gb+4g.40gb")
    with pytest.raises(UnknownGpuModelError, match=r"1g\.5gb"):
        resolve_layout(A100, "1g.5gb")
    with pytest.raises(ClusterSpecError, match="does not support MIG"):
        resolve_layout(gpu_model("V100-32GB"), "balanced")


def test_pack_layout_unknown_profile_is_none() -> None:
    assert pack_layout(A100, ["5g.50gb"]) is None
    assert pack_layout(gpu_model("T4"), ["1g.10gb"]) is None


# --------------------------------------------------------------------------- profile_for


@pytest.mark.parametrize(
    ("milli", "expected"),
    [(1, "1g.10gb"), (143, "1g.10gb"), (250, "2g.20gb"), (286, "2g.20gb"), (400, "3g.40gb"),
     (429, "3g.40gb"), (500, "4g.40gb"), (571, "4g.40gb"), (600, "7g.80gb"), (999, "7g.80gb"),
     (1000, "7g.80gb")],
)
def test_profile_for_fractions(milli: int, expected: str) -> None:
    prof = profile_for(A100, 1, milli)
    assert prof is not None and prof.name == expected


def test_profile_for_other_models_and_impossible_requests() -> None:
    assert profile_for(gpu_model("A100-40GB"), 1, 143).name == "1g.5gb"  # type: ignore[union-attr]
    assert profile_for(gpu_model("H200-141GB"), 1, 250).name == "2g.35gb"  # type: ignore[union-attr]
    assert profile_for(A100, 2, 1000) is None
    assert profile_for(A100, 8, 1000) is None
    assert profile_for(gpu_model("V100-32GB"), 1, 500) is None


@given(st.integers(min_value=1, max_value=1000))
def test_profile_for_covers_the_request_and_is_monotone(milli: int) -> None:
    prof = profile_for(A100, 1, milli)
    assert prof is not None
    assert "+me" not in prof.name
    # Covers the request (1% of a compute slice of tolerance).
    assert prof.compute_slices >= milli * MIG_COMPUTE_SLICES / 1000 - 0.011
    # No smaller-compute profile would have covered it.
    smaller = [p for p in A100.mig_profiles if p.compute_slices < prof.compute_slices]
    for p in smaller:
        assert p.compute_slices < milli * MIG_COMPUTE_SLICES / 1000 - 0.009
    # Least memory among those with that compute.
    assert prof.memory_slices == min(p.memory_slices for p in A100.mig_profiles
                                     if p.compute_slices == prof.compute_slices)
    if milli < 1000:
        nxt = profile_for(A100, 1, milli + 1)
        assert nxt is not None and nxt.compute_slices >= prof.compute_slices


# --------------------------------------------------------------------------- pack_layout vs brute force


def _brute_force(profiles: list[MigProfile]) -> bool:
    """Exhaustive: is there any assignment of legal starts with no memory overlap?"""
    if sum(p.compute_slices for p in profiles) > MIG_COMPUTE_SLICES:
        return False
    for name, n in Counter(p.name for p in profiles).items():
        if n > next(p for p in profiles if p.name == name).max_count:
            return False
    used = [False] * MIG_MEMORY_SLICES

    def go(i: int) -> bool:
        if i == len(profiles):
            return True
        p = profiles[i]
        for s in p.starts:
            span = range(s, s + p.memory_slices)
            if span.stop > MIG_MEMORY_SLICES or any(used[k] for k in span):
                continue
            for k in span:
                used[k] = True
            ok = go(i + 1)
            for k in span:
                used[k] = False
            if ok:
                return True
        return False

    return go(0)


def _check_packed(model: GpuModel, names: list[str], packed: list[tuple[MigProfile, int]]) -> None:
    assert sorted(p.name for p, _ in packed) == sorted(names)
    occupied: set[int] = set()
    for prof, start in packed:
        assert prof is model.profile(prof.name)
        assert start in prof.starts
        span = set(range(start, start + prof.memory_slices))
        assert span <= set(range(MIG_MEMORY_SLICES))
        assert not (span & occupied), f"overlap in {packed}"
        occupied |= span
    assert sum(p.compute_slices for p, _ in packed) <= MIG_COMPUTE_SLICES
    for name, n in Counter(names).items():
        assert n <= model.profile(name).max_count
    assert [s for _, s in packed] == sorted(s for _, s in packed)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(MIG_MODELS).flatmap(
    lambda m: st.tuples(st.just(m), st.lists(st.sampled_from([p.name for p in gpu_model(m).mig_profiles]),
                                             max_size=8))))
def test_pack_layout_agrees_with_brute_force(case: tuple[str, list[str]]) -> None:
    model_name, names = case
    model = gpu_model(model_name)
    packed = pack_layout(model, names)
    possible = _brute_force([model.profile(n) for n in names])
    if packed is None:
        assert not possible, f"pack_layout refused {names} but a legal placement exists"
    else:
        _check_packed(model, names, packed)
        assert possible
    # Order of the request does not matter.
    assert (pack_layout(model, list(reversed(names))) is None) == (packed is None)


# --------------------------------------------------------------------------- allocation invariants


def _pool(name: str, sharing: Sharing, *, kind: PoolKind = PoolKind.ONPREM, nodes: int = 1, gpus: int = 2,
          replicas: int = 1, layout: tuple[str, ...] = (), model: GpuModel = A100) -> PoolSpec:
    return PoolSpec(name=name, kind=kind, model=model, gpus_per_node=gpus, min_nodes=nodes, max_nodes=nodes,
                    sharing=sharing, replicas=replicas if sharing is Sharing.TIMESLICE else 1, mig_layout=layout)


def _state(specs: list[PoolSpec]) -> ClusterState:
    s = ClusterState(specs)
    for spec in specs:
        for _ in range(spec.start_nodes):
            s.add_node(spec.name, 0.0, 0.0)
    return s


def _check_invariants(state: ClusterState, held: dict[str, JobRun]) -> None:
    seen_slices: set[tuple[str, int, int]] = set()
    for node in state.nodes.values():
        spec = state.pools[node.pool].spec
        node_jobs: set[str] = set()
        for gpu in node.gpus:
            if spec.sharing is Sharing.EXCLUSIVE:
                assert len(gpu.holders) <= 1, f"{node.id}/{gpu.index} held by {gpu.holders}"
            elif spec.sharing is Sharing.TIMESLICE:
                assert len(gpu.holders) <= spec.replicas
                assert len(set(gpu.holders)) == len(gpu.holders)
            else:
                assert not gpu.holders
                assert pack_layout(spec.model, gpu.layout()) is not None
            node_jobs.update(gpu.holders)
            for s in gpu.slices:
                if s.holder is not None:
                    key = (node.id, gpu.index, s.start)
                    assert key not in seen_slices
                    seen_slices.add(key)
                    node_jobs.add(s.holder)
        if spec.sharing is Sharing.MIG:
            assert node.free_whole == 0
        else:
            assert node.free_whole == sum(1 for g in node.gpus if not g.holders)
        assert node.jobs == node_jobs
    # Every held job holds exactly what its placement says, and nothing else holds anything.
    holders: Counter[str] = Counter()
    for node in state.nodes.values():
        for gpu in node.gpus:
            holders.update(gpu.holders)
            holders.update(s.holder for s in gpu.slices if s.holder is not None)
    assert set(holders) == set(held)
    for jid, run in held.items():
        assert run.placement is not None
        assert holders[jid] == len(run.placement.gpus)
        if run.placement.slice_start is not None:
            nid, gi = run.placement.gpus[0]
            (sl,) = [s for s in state.nodes[nid].gpus[gi].slices if s.holder == jid]
            assert sl.start == run.placement.slice_start
            assert sl.profile.name == run.profile
    assert state.allocated == pytest.approx(state.allocated_gpus(), abs=1e-9)


_layouts = st.sampled_from(["balanced", "all-1g", "all-2g", "all-3g", "mixed-4-3", "all-7g"])


@st.composite
def _pools(draw: st.DrawFn) -> list[PoolSpec]:
    specs = []
    for i in range(draw(st.integers(1, 3))):
        sharing = draw(st.sampled_from(list(Sharing)))
        kind = draw(st.sampled_from([PoolKind.ONPREM, PoolKind.ONPREM, PoolKind.SPOT]))
        layout = resolve_layout(A100, draw(_layouts)) if sharing is Sharing.MIG else ()
        specs.append(_pool(f"p{i}", sharing, kind=kind, nodes=draw(st.integers(1, 2)), gpus=draw(st.integers(1, 4)),
                           replicas=draw(st.integers(1, 3)), layout=layout))
    return specs


_jobs = st.builds(
    lambda n, milli, pre: Job("", 0.0, 100.0, num_gpus=n, gpu_milli=milli if n == 1 else 1000, preemptible=pre),
    st.integers(1, 5), st.sampled_from([100, 143, 250, 400, 500, 1000, 1000]), st.booleans(),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pools(), st.lists(_jobs, min_size=1, max_size=25), st.randoms(use_true_random=False))
def test_allocation_invariants(specs: list[PoolSpec], jobs: list[Job], rnd) -> None:  # type: ignore[no-untyped-def]
    state = _state(specs)
    held: dict[str, JobRun] = {}
    _check_invariants(state, held)
    for i, job in enumerate(jobs):
        job = replace(job, job_id=f"j{i}")
        cands = candidates(state, job)
        for c in cands:
            assert check_placement(state, job, c) is None, (job, c)
        if cands:
            pl = rnd.choice(cands)
            run = JobRun(job)
            prof = None
            if pl.slice_start is not None:
                (sl,) = [s for s in state.nodes[pl.gpus[0][0]].gpus[pl.gpus[0][1]].slices
                         if s.start == pl.slice_start]
                prof = sl.profile.name
                assert sl.profile is profile_for(A100, job.num_gpus, job.gpu_milli)
            state.allocate(run, pl, prof)
            held[job.job_id] = run
            # The same placement is now refused (the GPU or slice is taken), unless time-slicing has room.
            again = replace(job, job_id=f"again{i}")
            if state.pools[pl.pool].spec.sharing is not Sharing.TIMESLICE:
                assert check_placement(state, again, pl) is not None
        else:
            # No single GPU of a non-MIG pool would have been accepted either.
            if job.num_gpus == 1:
                for node in state.nodes.values():
                    if not node.gpus[0].mig:
                        for g in node.gpus:
                            assert check_placement(state, job, Placement(node.pool, ((node.id, g.index),))) is not None
        _check_invariants(state, held)
        if held and rnd.random() < 0.3:
            jid = rnd.choice(sorted(held))
            state.release(held.pop(jid), 1.0)
            _check_invariants(state, held)
    for jid in sorted(held):
        state.release(held.pop(jid), 2.0)
        _check_invariants(state, held)
    assert state.allocated == pytest.approx(0.0, abs=1e-9)
    assert all(g.idle() for n in state.nodes.values() for g in n.gpus)


# --------------------------------------------------------------------------- refusals


def test_check_placement_refusals() -> None:
    specs = [
        _pool("ex", Sharing.EXCLUSIVE, nodes=2, gpus=4),
        _pool("spot", Sharing.EXCLUSIVE, kind=PoolKind.SPOT, nodes=1, gpus=4),
        _pool("mig", Sharing.MIG, nodes=1, gpus=1, layout=resolve_layout(A100, "balanced")),
    ]
    state = _state(specs)
    n1, n2 = list(state.pools["ex"].nodes)
    (sn,) = list(state.pools["spot"].nodes)
    (mn,) = list(state.pools["mig"].nodes)
    job = Job("a", 0.0, 10.0, num_gpus=2)
    assert check_placement(state, job, Placement("ex", ((n1, 0), (n1, 1)))) is None

    wrong_model = replace(job, gpu_models=frozenset({"H100-80GB"}))
    assert "H100" not in (why := check_placement(state, wrong_model, Placement("ex", ((n1, 0), (n1, 1)))) or "")
    assert why and "A100-80GB" in why

    assert "preemptible" in (check_placement(state, job, Placement("spot", ((sn, 0), (sn, 1)))) or "")
    assert check_placement(state, replace(job, preemptible=True), Placement("spot", ((sn, 0), (sn, 1)))) is None

    assert "one node" in (check_placement(state, job, Placement("ex", ((n1, 0), (n2, 0)))) or "")
    assert "twice" in (check_placement(state, job, Placement("ex", ((n1, 0), (n1, 0)))) or "")
    assert "needs 2" in (check_placement(state, job, Placement("ex", ((n1, 0),))) or "")
    assert check_placement(state, job, Placement("nope", ((n1, 0), (n1, 1)))) is not None
    assert check_placement(state, job, Placement("ex", ((sn, 0), (sn, 1)))) is not None  # node of another pool
    assert check_placement(state, job, Placement("ex", ((n1, 7), (n1, 1)))) is not None
    assert check_placement(state, Job("c", 0, 1, num_gpus=0), Placement("ex", ((n1, 0),))) is not None

    # A GPU already held.
    other = JobRun(Job("b", 0.0, 10.0, num_gpus=1))
    state.allocate(other, Placement("ex", ((n1, 1),)))
    why = check_placement(state, job, Placement("ex", ((n1, 0), (n1, 1))))
    assert why is not None and "full" in why
    assert check_placement(state, job, Placement("ex", ((n1, 2), (n1, 3)))) is None

    # A job larger than a node may span nodes (gang).
    big = Job("g", 0.0, 10.0, num_gpus=6)
    gang = candidates(state, big)
    assert gang and all(check_placement(state, big, p) is None for p in gang)
    assert all(len(p.nodes) == 2 and len(p.gpus) == 6 for p in gang)

    # MIG: wrong instance for the profile, held instance, whole-GPU request on a non-7g layout.
    frac = Job("f", 0.0, 10.0, num_gpus=1, gpu_milli=143)
    slices = {s.profile.name: s.start for s in state.nodes[mn].gpus[0].slices}
    assert "needs 1g.10gb" in (check_placement(state, frac, Placement("mig", ((mn, 0),), slices["3g.40gb"])) or "")
    assert check_placement(state, frac, Placement("mig", ((mn, 0),), slices["1g.10gb"])) is None
    assert check_placement(state, frac, Placement("mig", ((mn, 0),), None)) is not None
    assert check_placement(state, frac, Placement("mig", ((mn, 0),), 5)) is not None  # no instance starts at 5
    assert check_placement(state, frac, Placement("ex", ((n1, 0),), 0)) is not None  # slice on a non-MIG pool
    assert candidates(state, Job("w", 0.0, 1.0, num_gpus=1)) != []
    assert not [p for p in candidates(state, Job("w", 0.0, 1.0, num_gpus=1)) if p.pool == "mig"]
    assert check_placement(state, Job("m2", 0.0, 1.0, num_gpus=2), Placement("mig", ((mn, 0),), 0)) is not None


def test_reconfiguring_gpu_accepts_nothing_and_reconfigure_check() -> None:
    state = _state([_pool("mig", Sharing.MIG, nodes=1, gpus=1, layout=resolve_layout(A100, "balanced"))])
    (mn,) = list(state.nodes)
    gpu = state.nodes[mn].gpus[0]
    frac = Job("f", 0.0, 10.0, num_gpus=1, gpu_milli=143)
    assert candidates(state, frac)
    assert reconfigure_check(state, mn, 0, ("7g.80gb",)) is None
    assert reconfigure_check(state, mn, 0, tuple(gpu.layout())) is not None  # same layout
    assert reconfigure_check(state, mn, 0, ("4g.40gb", "4g.40gb")) is not None
    assert reconfigure_check(state, mn, 3, ("7g.80gb",)) is not None
    assert reconfigure_check(state, "nope", 0, ("7g.80gb",)) is not None
    gpu.busy_until = 100.0
    assert candidates(state, frac) == []
    pl = Placement("mig", ((mn, 0),), gpu.slices[0].start)
    assert "reconfiguring" in (check_placement(state, frac, pl) or "")
    assert reconfigure_check(state, mn, 0, ("7g.80gb",)) is not None
    gpu.busy_until = 0.0
    run = JobRun(frac)
    state.allocate(run, pl, gpu.slices[0].profile.name)
    assert "in use" in (reconfigure_check(state, mn, 0, ("7g.80gb",)) or "")


def test_unschedulable_reasons() -> None:
    pools = [_pool("ex", Sharing.EXCLUSIVE, nodes=2, gpus=4),
             _pool("spot", Sharing.EXCLUSIVE, kind=PoolKind.SPOT, nodes=1, gpus=8, model=H100)]
    assert not any(fits_pool_spec(Job("a", 0, 1, num_gpus=9), p) for p in pools)
    assert "9 GPUs" in unschedulable_reason(Job("a", 0, 1, num_gpus=9), pools)
    h100_only = Job("b", 0, 1, num_gpus=1, gpu_models=frozenset({"H100-80GB"}))
    assert not any(fits_pool_spec(h100_only, p) for p in pools)
    assert "not preemptible" in unschedulable_reason(h100_only, pools)
    assert any(fits_pool_spec(replace(h100_only, preemptible=True), p) for p in pools)
    v100 = Job("c", 0, 1, num_gpus=1, gpu_models=frozenset({"V100-32GB"}))
    assert "allowed GPU model" in unschedulable_reason(v100, pools)
    assert unschedulable_reason(Job("d", 0, 1, num_gpus=0), pools) == "asks for no GPU"
    assert any(fits_pool_spec(Job("e", 0, 1, num_gpus=8), p) for p in pools)  # gang over the two 4-GPU nodes


# --------------------------------------------------------------------------- MIG device requests (backends)


def test_place_mig_devices_places_what_pack_layout_places() -> None:
    placed = place_mig_devices(H100, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1, "7g.80gb": 0}, "NVIDIA H100")
    assert placed == pack_layout(H100, ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
    assert place_mig_devices(H100, {}, "NVIDIA H100") == []


def test_place_mig_devices_refusals_name_gpu_and_model() -> None:
    fit = r'MIG layout \{"1g.10gb"=8\} does not fit one NVIDIA H100 \(H100-80GB\)'
    with pytest.raises(ClusterSpecError, match=fit):
        place_mig_devices(H100, {"1g.10gb": 8}, "NVIDIA H100")
    with pytest.raises(UnknownGpuModelError, match=r"MIG profile '1g\.5gb' does not exist on H100-80GB"):
        place_mig_devices(H100, {"1g.5gb": 1}, "NVIDIA H100")
    for bad in (-1, 1.0, True, "2"):
        with pytest.raises(ClusterSpecError, match="must be an integer >= 0"):
            place_mig_devices(H100, {"1g.10gb": bad}, "NVIDIA H100")  # type: ignore[dict-item]


# --------------------------------------------------------------------------- decisions


def _elastic(name: str, kind: PoolKind, *, lo: int = 0, hi: int = 3) -> PoolSpec:
    return PoolSpec(name=name, kind=kind, model=A100, gpus_per_node=2, min_nodes=lo, max_nodes=hi)


def _hybrid() -> ClusterState:
    """One on-prem node (a job queued, one running), an empty spot pool and an on-demand pool with one node."""
    state = _state([_pool("op", Sharing.EXCLUSIVE), _elastic("spot", PoolKind.SPOT), _elastic("od", PoolKind.ONDEMAND)])
    state.add_node("od", 0.0, 0.0)
    state.time = 50.0
    state.enqueue(JobRun(Job("q", 0.0, 10.0, num_gpus=1)))
    run = JobRun(Job("r", 0.0, 10.0, num_gpus=1))
    (op,) = [n for n in state.nodes.values() if n.pool == "op"]
    state.allocate(run, Placement("op", ((op.id, 0),)))
    state.running["r"] = run
    return state


def test_scale_up_room_reads_spot_availability_from_the_quotes() -> None:
    state = _hybrid()
    spot, od, op = state.pools["spot"], state.pools["od"], state.pools["op"]
    assert (scale_up_room(state, spot), scale_up_room(state, od), scale_up_room(state, op)) == (3, 2, 0)
    state.quotes["spot"] = MarketQuote(1.0, 3.0, spot_available_nodes=1)
    assert scale_up_room(state, spot) == 1
    assert check_decision(state, Scale("spot", 5)) is None  # legal; it adds what the room allows
    state.add_node("spot", 50.0, 60.0)
    assert scale_up_room(state, spot) == 0
    assert check_decision(state, Scale("spot", 1)) == "pool spot cannot grow (max 3, held 1, spot available 1)"
    state.quotes["od"] = MarketQuote(3.0, 3.0, spot_available_nodes=0)  # availability only binds spot pools
    assert check_decision(state, Scale("od", 1)) is None
    assert check_decision(state, Scale("op", 1)) == "pool op is on-prem and cannot scale"
    assert check_decision(state, Scale("nope", 1)) == "unknown pool 'nope'"
    assert check_decision(state, Scale("od", 0)) == "scale by 0"


def test_scale_down_stops_provisioning_then_idle_nodes_above_the_minimum() -> None:
    state = _hybrid()
    od = state.pools["od"]
    (idle,) = od.nodes.values()
    assert stoppable_nodes(od) == [idle] and scale_down_room(od) == 1
    assert check_decision(state, Scale("od", -1)) is None
    coming = state.add_node("od", 50.0, 100.0)
    assert coming.status is NodeStatus.PROVISIONING
    assert stoppable_nodes(od) == [coming, idle] and scale_down_room(od) == 2
    run = JobRun(Job("b", 0.0, 10.0, num_gpus=1))
    state.allocate(run, Placement("od", ((idle.id, 0),)))
    assert stoppable_nodes(od) == [coming]
    state.remove_node(coming)
    assert scale_down_room(od) == 0
    assert check_decision(state, Scale("od", -1)) == "pool od has no idle node to stop"
    floor = _state([_elastic("min", PoolKind.ONDEMAND, lo=1)])  # starts with its one idle node
    assert len(floor.nodes) == 1 and scale_down_room(floor.pools["min"]) == 0
    assert check_decision(floor, Scale("min", -1)) is not None
    assert scale_down_room(_hybrid().pools["op"]) == 0


def test_check_decision_for_every_kind() -> None:
    state = _hybrid()
    (op,) = [n.id for n in state.nodes.values() if n.pool == "op"]
    assert check_decision(state, Place("q", Placement("op", ((op, 1),)))) is None
    assert check_decision(state, Place("q", Placement("op", ((op, 0),)))) == f"GPU {op}/0 is full"
    assert check_decision(state, Place("r", Placement("op", ((op, 1),)))) == "job r is not queued"
    assert check_decision(state, Preempt("r")) is None
    assert check_decision(state, Preempt("q")) == "job q is not running"
    assert check_decision(state, Reconfigure(op, 0, ("7g.80gb",))) == f"GPU {op}/0 is not in MIG mode"
    assert check_decision(state, WakeAt(50.5)) is None
    assert check_decision(state, WakeAt(50.0)) == "wake time is not in the future"
    assert check_decision(state, WakeAt(float("inf"))) == "wake time is not finite"
    assert check_decision(state, WakeAt(float("nan"))) == "wake time is not finite"
    assert check_decision(state, "hold everything") == "unknown decision 'hold everything'"  # type: ignore[arg-type]
