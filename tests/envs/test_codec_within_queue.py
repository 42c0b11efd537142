"""``ObservationCodec.within_queue``: no node is bought for a pool whose nodes on their way already cover what it cannot
take now."""

from __future__ import annotations

import numpy as np

from rlsched.cluster.decisions import Place, Scale
from rlsched.cluster.job import Job
from rlsched.cluster.model import Placement, PoolKind
from rlsched.envs import ObservationCodec
from rlsched.learned.ppo import decide_through_codec
from rlsched.sim.engine import Engine
from tests.sim.helpers import FakeMarket, job, pool


def _engine(jobs: list[Job], spot_ready: int = 1, od_delay: float = 300.0, spot_gpus: int = 2) -> Engine:
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=4, lo=spot_ready, gpus=spot_gpus),
             pool("od", kind=PoolKind.ONDEMAND, nodes=4, gpus=8, delay=od_delay)]
    e = Engine(pools, jobs, FakeMarket(price=1.0))
    e.reset()
    assert e.advance()
    return e


def test_a_pool_that_can_take_the_window_may_not_grow() -> None:
    # One ready spot node with 2 free GPUs and one queued 2-GPU job: it fits spot now, so buying spot is masked;
    # it fits no on-demand node (none is held), so buying on-demand is not.
    e = _engine([job("a", 0, 100, 2, preemptible=True), job("later", 5000, 100, 1)])
    codec = ObservationCodec(window=4, max_pools=2)
    raw, legal = codec.mask(e.state), codec.legal(e.state)
    spot_up, od_up = codec.scale_offset, codec.scale_offset + 2
    assert raw[spot_up] and not legal[spot_up]
    assert raw[od_up] and legal[od_up]
    np.testing.assert_array_equal(np.delete(raw, spot_up), np.delete(legal, spot_up))  # nothing else changes


def test_free_gpus_too_scattered_for_a_job_do_not_stop_a_buy() -> None:
    # Two ready 4-GPU spot nodes, each half busy: 4 GPUs free, but no node can take the queued 4-GPU job. A node
    # bought for it is what it waits for, so the buy stays legal (counting free GPUs against the queue forbade it).
    e = _engine([job("r1", 0, 10_000, 2, preemptible=True), job("r2", 0, 10_000, 2, preemptible=True),
                 job("big", 0, 100, 4, preemptible=True), job("later", 5000, 100, 1)], spot_ready=2, spot_gpus=4)
    n1, n2 = sorted(e.state.pools["spot"].nodes)
    assert e.apply(Place("r1", Placement("spot", ((n1, 0), (n1, 1))))) is None
    assert e.apply(Place("r2", Placement("spot", ((n2, 0), (n2, 1))))) is None
    assert e.state.pools["spot"].free_whole_gpus() == 4
    codec = ObservationCodec(window=4, max_pools=2)
    assert codec.legal(e.state)[codec.scale_offset]
    assert e.apply(Scale("spot", 1)) is None
    # the node on its way covers the blocked job: a second one is not bought
    assert not codec.legal(e.state)[codec.scale_offset]


def test_a_buyer_served_through_the_codec_buys_one_node_for_one_job() -> None:
    # The AWS 2020 openb failure: a network that scores "buy on-demand" first bought node after node for
    # one queued 8-GPU pod while the first was still provisioning. Served through the codec, it buys one.
    e = _engine([job("pod", 0, 100, 8, preemptible=True), job("later", 5000, 100, 1)], spot_ready=0)
    codec = ObservationCodec(window=4, max_pools=2)
    od_up = codec.scale_offset + 2

    def buyer(mask: np.ndarray) -> int:
        return od_up if mask[od_up] else int(np.flatnonzero(mask)[-1])

    bought = []
    for decision in decide_through_codec(codec, e.state, buyer):
        if isinstance(decision, Scale):
            bought.append(decision)
        assert e.apply(decision) is None
    assert [(d.pool, d.delta) for d in bought] == [("od", 1)]
    assert e.state.pools["od"].provisioning_gpus() == 8


def test_the_rule_never_strands_the_queue() -> None:
    # Nothing runs, nothing provisions, nothing is due: where buying was all that was legal besides a
    # stranding wait, the rule steps aside (the mask comes back as it was).
    e = _engine([job("a", 0, 100, 2, preemptible=True)])
    e.state.next_event_due = lambda: None  # the engine's answer once nothing is left (here a node's idle check is)
    codec = ObservationCodec(window=4, max_pools=2)
    spot_up = codec.scale_offset
    only_buy = np.zeros(codec.n_actions, dtype=bool)
    only_buy[[spot_up, codec.wait_action]] = True
    assert codec.within_queue(e.state, only_buy) is only_buy
    no_wait = only_buy.copy()
    no_wait[codec.wait_action] = False
    assert codec.within_queue(e.state, no_wait) is no_wait
    # the live runtime cannot say what is due: with nothing running or provisioning it takes the guess
    e.state.next_event_due = None
    assert codec.within_queue(e.state, only_buy) is only_buy
    # with something still due, waiting strands nothing: the buy is masked
    e2 = _engine([job("a", 0, 100, 2, preemptible=True), job("later", 5000, 100, 1)])
    out = codec.within_queue(e2.state, only_buy)
    assert not out[spot_up] and out[codec.wait_action]
    assert only_buy[spot_up]  # the input is never changed
