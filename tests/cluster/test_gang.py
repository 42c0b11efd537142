"""Gang placement modes: whole nodes (the default) vs packed, on constructed clusters.

A job larger than one node takes ``n // G`` completely free nodes plus one node with
``n % G`` free GPUs under ``whole-nodes`` (the Tiresias and Lucid simulators' rule);
``packed`` takes any free GPUs, the nodes with the most free GPUs first. The same rule
answers the simulator (``pool_candidates`` / ``check_placement``) and the live service
(which gates every decision with ``runtime.fallback.illegal_reason`` -> ``check_placement``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlsched.cluster.catalog import gpu_model
from rlsched.cluster.decisions import Place
from rlsched.cluster.feasibility import check_placement, gang_candidate, gang_shape, pool_candidates
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, GangMode, JobRun, Placement, PoolKind, PoolSpec, RunState
from rlsched.cluster.shorthand import format_cluster, parse_cluster
from rlsched.errors import ClusterSpecError, ScenarioError
from rlsched.runtime.fallback import illegal_reason

V100 = gpu_model("V100-16GB")


def _state(free: list[int], gang: GangMode = GangMode.WHOLE_NODES, gpus: int = 8) -> ClusterState:
    """Nodes of ``gpus`` GPUs with ``free[i]`` free GPUs on node i (the rest held by 1-GPU jobs)."""
    spec = PoolSpec(name="p", kind=PoolKind.ONPREM, model=V100, gpus_per_node=gpus, min_nodes=len(free),
                    max_nodes=len(free), gang=gang)
    state = ClusterState([spec])
    for _ in free:
        state.add_node("p", 0.0, 0.0)
    for k, (node, f) in enumerate(zip(state.nodes.values(), free, strict=True)):
        for gi in range(gpus - f):
            run = JobRun(Job(f"busy-{k}-{gi}", 0.0, 100.0))
            state.allocate(run, Placement("p", ((node.id, gi),)))
    return state


def _per_node(state: ClusterState, placement: Placement) -> list[int]:
    """GPUs the placement takes on each node, in node order (0 where it takes none)."""
    return [sum(1 for nid, _ in placement.gpus if nid == node) for node in state.nodes]


def test_gang_shape_is_whole_nodes_plus_a_remainder() -> None:
    spec = parse_cluster("4x8xV100-16GB")[0]
    assert gang_shape(spec, 16) == (2, 0)
    assert gang_shape(spec, 19) == (2, 3)
    assert gang_shape(spec, 9) == (1, 1)


def test_a_16_gpu_job_waits_for_two_whole_nodes_where_packed_spreads_it() -> None:
    # The case: 7 + 4 + 3 + 2 free GPUs over four partly used nodes.
    job = Job("g", 0.0, 10.0, num_gpus=16)
    whole = _state([7, 4, 3, 2])
    assert gang_candidate(whole.pools["p"], job, 0.0) is None
    assert pool_candidates(whole.pools["p"], job, 0.0) == []
    packed = _state([7, 4, 3, 2], GangMode.PACKED)
    got = gang_candidate(packed.pools["p"], job, 0.0)
    assert got is not None and _per_node(packed, got) == [7, 4, 3, 2]
    assert check_placement(packed, job, got) is None
    # The same spread placement is illegal in a whole-nodes pool, with the rule in the reason.
    why = check_placement(whole, job, Placement("p", got.gpus))
    assert why is not None and "whole node" in why and "7+4+3+2" in why


def test_whole_nodes_takes_free_nodes_then_the_first_node_that_holds_the_remainder() -> None:
    # 12 GPUs = one whole node + 4: node 0 is the first free node, node 1 (5 free) the first
    # other node with 4 free GPUs - first fit in node order, as Tiresias' try_cross_node_alloc.
    state = _state([8, 5, 8, 4])
    got = gang_candidate(state.pools["p"], Job("g", 0.0, 10.0, num_gpus=12), 0.0)
    assert got is not None and _per_node(state, got) == [8, 4, 0, 0]
    # 19 GPUs = two whole nodes + 3.
    state = _state([8, 8, 3])
    job = Job("g", 0.0, 10.0, num_gpus=19)
    got = gang_candidate(state.pools["p"], job, 0.0)
    assert got is not None and _per_node(state, got) == [8, 8, 3]
    assert check_placement(state, job, got) is None
    # 20 GPUs need 4 on the third node, which has 3: no placement (packed would not fit either: 19 free).
    assert gang_candidate(state.pools["p"], Job("h", 0.0, 10.0, num_gpus=20), 0.0) is None


def test_the_remainder_may_take_a_free_node_and_whole_nodes_skip_partly_used_ones() -> None:
    # 9 GPUs on [5, 8, 8]: node 1 whole, node 0 holds the remainder of 1 (first fit).
    state = _state([5, 8, 8])
    got = gang_candidate(state.pools["p"], Job("g", 0.0, 10.0, num_gpus=9), 0.0)
    assert got is not None and _per_node(state, got) == [1, 8, 0]
    # 9 GPUs on [8, 8]: one whole node and one GPU of the other free node.
    state = _state([8, 8])
    got = gang_candidate(state.pools["p"], Job("g", 0.0, 10.0, num_gpus=9), 0.0)
    assert got is not None and sorted(_per_node(state, got)) == [1, 8]


def test_whole_nodes_refuses_a_remainder_split_over_two_nodes() -> None:
    state = _state([8, 8, 8])
    job = Job("g", 0.0, 10.0, num_gpus=12)
    ids = list(state.nodes)
    split = Placement("p", (*((ids[0], i) for i in range(8)), (ids[1], 0), (ids[1], 1), (ids[2], 0), (ids[2], 1)))
    why = check_placement(state, job, split)
    assert why is not None and "1 whole node(s) plus 4 GPU(s) on one more node" in why
    ok = Placement("p", tuple((ids[0], i) for i in range(8)) + tuple((ids[2], i) for i in range(4)))
    assert check_placement(state, job, ok) is None


def test_the_live_service_gate_applies_the_same_rule() -> None:
    # The service refuses any decision illegal_reason refuses; it is check_placement.
    state = _state([7, 4, 3, 2])
    job = Job("g", 0.0, 10.0, num_gpus=16)
    state.enqueue(JobRun(job))
    packed = _state([7, 4, 3, 2], GangMode.PACKED)
    spread = gang_candidate(packed.pools["p"], job, 0.0)
    assert spread is not None
    why = illegal_reason(state, Place("g", spread))
    assert why is not None and "whole-nodes" in why


def test_pools_default_to_whole_nodes() -> None:
    # Pools the live service builds from HCL (rlsched.spec.pools) name no mode: they get the default.
    assert PoolSpec(name="x", kind=PoolKind.ONPREM, model=V100, gpus_per_node=8, min_nodes=1,
                    max_nodes=1).gang is GangMode.WHOLE_NODES


# --------------------------------------------------------------------------- spec and scenario


def test_cluster_spec_names_the_gang_mode() -> None:
    assert parse_cluster("4x8xV100-16GB")[0].gang is GangMode.WHOLE_NODES
    pools = parse_cluster("4x8xV100-16GB/gang=packed,spot:0-4x8xV100-16GB/gang=whole-nodes")
    assert [p.gang for p in pools] == [GangMode.PACKED, GangMode.WHOLE_NODES]
    assert format_cluster(pools) == "4x8xV100-16GB/gang=packed,spot:0-4x8xV100-16GB"
    assert parse_cluster(format_cluster(pools)) == pools
    with pytest.raises(ClusterSpecError, match="unknown gang mode 'spread'; known: whole-nodes, packed"):
        parse_cluster("4x8xV100-16GB/gang=spread")


def test_scenario_gang_key_sets_every_pool(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from rlsched.scenario import load_scenario

    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,duration,num_gpus\na,0,10,1\n")
    base = {"cluster": "2x8xV100-16GB,1x4xV100-16GB", "workload": str(trace)}
    assert {p.gang for p in load_scenario(base).pools} == {GangMode.WHOLE_NODES}
    assert {p.gang for p in load_scenario({**base, "gang": "packed"}).pools} == {GangMode.PACKED}
    with pytest.raises(ScenarioError, match="gang: unknown gang mode"):
        load_scenario({**base, "gang": "anywhere"})
    with pytest.raises(ScenarioError, match="name the gang mode once"):
        load_scenario({**base, "cluster": "2x8xV100-16GB/gang=packed", "gang": "packed"})
    assert replace(load_scenario(base).pools[0], gang=GangMode.PACKED).gang is GangMode.PACKED


# --------------------------------------------------------------------------- rules that make room


def test_gang_fits_after_follows_the_pool_rule() -> None:
    from rlsched.cluster.feasibility import gang_fits_after

    job = Job("g", 0.0, 10.0, num_gpus=16)
    state = _state([7, 4, 3, 2])
    ids = list(state.nodes)
    assert not gang_fits_after(state.pools["p"], job, 0.0, {})
    assert not gang_fits_after(state.pools["p"], job, 0.0, {ids[1]: 4})  # one whole node, 16 needs two
    assert gang_fits_after(state.pools["p"], job, 0.0, {ids[0]: 1, ids[1]: 4})
    packed = _state([7, 4, 3, 2], GangMode.PACKED)
    assert gang_fits_after(packed.pools["p"], job, 0.0, {})


def _guard_state(gang: GangMode) -> tuple[ClusterState, JobRun]:
    """Three on-demand nodes of 2 GPUs: node 0 runs x (not preemptible) and v, node 1 runs w;
    a 4-GPU gang u (1,000 s, deadline 2,400) is urgent at 1,000 with 3 GPUs free."""
    spec = PoolSpec(name="od", kind=PoolKind.ONDEMAND, model=V100, gpus_per_node=2, min_nodes=3, max_nodes=3,
                    gang=gang)
    state = ClusterState([spec])
    state.estimator.oracle = True
    for _ in range(3):
        state.add_node("od", 0.0, 0.0)
    ids = list(state.nodes)
    for name, pre, where in (("x", False, (ids[0], 0)), ("v", True, (ids[0], 1)), ("w", True, (ids[1], 0))):
        run = JobRun(Job(name, 0.0, 10_000.0, preemptible=pre))
        state.allocate(run, Placement("od", (where,)))
        run.state = RunState.RUNNING
        state.running[name] = run
    u = JobRun(Job("u", 0.0, 1000.0, num_gpus=4, preemptible=True, deadline=2400.0))
    state.enqueue(u)
    state.time = 1000.0
    return state, u


@pytest.mark.parametrize("gang", [GangMode.WHOLE_NODES, GangMode.PACKED])
def test_the_deadline_guard_suspends_nobody_for_a_gang_it_cannot_place(gang: GangMode) -> None:
    # Suspending v (the first 1-GPU victim) leaves node 0 held by x: 3 + 1 free GPUs but only one
    # whole node. Under whole-nodes the guard must not suspend it for nothing; under packed it may.
    from rlsched.cluster.feasibility import gang_fits_after
    from rlsched.policies.rules.deadline_guard import DeadlineGuard

    state, u = _guard_state(gang)
    guard = DeadlineGuard(preempt=True)
    urgency = guard.urgency(state, u)
    assert urgency is not None
    victims = guard.victims(state, urgency)
    freed: dict[str, int] = {}
    for v in victims:
        assert v.placement is not None
        for nid, _ in v.placement.gpus:
            freed[nid] = freed.get(nid, 0) + 1
    if gang is GangMode.PACKED:
        assert [v.job.job_id for v in victims] == ["v"]
    assert not victims or gang_fits_after(state.pools["od"], u.job, state.time, freed)
