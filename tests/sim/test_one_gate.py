"""One legality gate: the engine, the action mask and the autoscalers agree with ``check_decision``.

Random worlds (on-prem, MIG, spot with changing availability and reclaims, on-demand)
are driven by random decisions, legal and not: the engine must refuse exactly what
:func:`~rlsched.cluster.feasibility.check_decision` refuses, with the same reason; every
action the codec's mask allows must decode to a decision the gate accepts; every
scale-up an autoscaler yields must be accepted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlsched.cluster.decisions import Decision, Place, Preempt, Reconfigure, Scale, WakeAt
from rlsched.cluster.feasibility import candidates, check_decision, named_layouts
from rlsched.cluster.model import MarketQuote, Placement, PoolKind, Sharing
from rlsched.envs.codec import ObservationCodec
from rlsched.policies.heuristics.autoscale import QueueAutoscaler, SpotFirstAutoscaler
from rlsched.sim.engine import Engine, SimConfig

from .helpers import A100, FakeMarket, job, pool

LAYOUTS = [*named_layouts(A100).values(), ("4g.40gb", "4g.40gb")]  # the last never fits


def _world(seed: int) -> Engine:
    rng = np.random.default_rng(seed)
    pools = [
        pool("op", nodes=2, gpus=4),
        pool("mig", nodes=1, gpus=2, sharing=Sharing.MIG, layout=named_layouts(A100)["balanced"]),
        pool("spot", kind=PoolKind.SPOT, nodes=3, lo=int(rng.integers(0, 2)), gpus=4, cost=1.0,
             delay=float(rng.choice([0.0, 30.0])), idle=60.0),
        pool("od", kind=PoolKind.ONDEMAND, nodes=2, gpus=4, cost=3.0, delay=30.0, idle=60.0),
    ]
    avail = [(0.0, int(rng.integers(0, 3)))]
    for t in sorted(rng.uniform(0, 2000, 5)):
        avail.append((float(t), int(rng.integers(0, 4))))
    market = FakeMarket(price=1.0, lifetimes=list(rng.uniform(100, 800, 30)), avail=avail)
    jobs = []
    for i in range(40):
        n = int(rng.choice([1, 1, 1, 2, 4, 6]))
        milli = int(rng.choice([250, 500, 1000])) if n == 1 else 1000
        jobs.append(job(f"j{i}", rng.uniform(0, 1500), rng.uniform(50, 500), n, gpu_milli=milli,
                        preemptible=bool(rng.random() < 0.6)))
    return Engine(pools, jobs, market, SimConfig(seed=seed, mig_reconfig_s=20.0))


def _random_decision(engine: Engine, codec: ObservationCodec, rng: np.random.Generator) -> Decision:
    st = engine.state
    kind = int(rng.integers(6))
    if kind == 0:
        d = codec.decode(int(rng.integers(codec.n_actions - 1)), st)  # never the wait action
        assert d is not None
        return d
    if kind == 1:
        return Scale(str(rng.choice(["op", "mig", "spot", "od", "ghost"])), int(rng.integers(-3, 4)))
    if kind == 2:
        ids = sorted(st.running) + sorted(st.queue)[:3] + ["ghost"]
        return Preempt(str(rng.choice(ids)), checkpoint=bool(rng.random() < 0.5))
    if kind == 3:
        return WakeAt(st.time + float(rng.choice([-10.0, 0.0, 5.0, 100.0, math.inf, math.nan])))
    if kind == 4:
        nodes = [*sorted(st.nodes), "ghost"]
        return Reconfigure(str(rng.choice(nodes)), int(rng.integers(0, 3)), LAYOUTS[int(rng.integers(len(LAYOUTS)))])
    queued = sorted(st.queue)
    if not queued:
        return Place("ghost", Placement("op", ()))
    jid = str(rng.choice(queued))
    found = candidates(st, st.queue[jid].job)
    if found and rng.random() < 0.7:
        return Place(jid, found[int(rng.integers(len(found)))])
    node = st.nodes[str(rng.choice(sorted(st.nodes)))]
    gpus = tuple((node.id, int(i)) for i in rng.integers(0, len(node.gpus) + 1, int(rng.integers(1, 3))))
    return Place(jid, Placement(node.pool, gpus, int(rng.integers(0, 7)) if rng.random() < 0.3 else None))


@pytest.mark.parametrize("seed", range(8))
def test_engine_mask_and_autoscaler_agree_with_check_decision(seed: int) -> None:
    engine = _world(seed)
    codec = ObservationCodec(window=4, max_pools=4, layouts=6)
    scalers = [QueueAutoscaler(max_step=2), SpotFirstAutoscaler(max_step=2)]
    rng = np.random.default_rng(1000 + seed)
    checked = {"refused": 0, "accepted": 0, "masked": 0, "scaled": 0}
    points = 0
    while points < 150 and engine.advance():
        points += 1
        st = engine.state
        for _ in range(int(rng.integers(1, 6))):
            mask = codec.mask(st)
            for a in np.flatnonzero(mask[:-1]):
                d = codec.decode(int(a), st)
                assert d is not None and check_decision(st, d) is None, (codec.action_name(int(a)), d)
                checked["masked"] += 1
            d = _random_decision(engine, codec, rng)
            want = check_decision(st, d)
            assert engine.apply(d) == want, d
            checked["refused" if want else "accepted"] += 1
        scaler = scalers[points % 2]
        for d in scaler.decide(st, list(st.queue.values())):
            assert check_decision(st, d) is None, d
            assert engine.apply(d) is None, d
            checked["scaled"] += 1
    assert engine.refused == checked["refused"]
    assert min(checked.values()) > 0, checked  # every path was exercised


def test_engine_grows_a_spot_pool_by_the_availability_in_the_state() -> None:
    """The engine decides from ``state.quotes``, as the live guard does, not from its own market reads."""
    engine = Engine([pool("spot", kind=PoolKind.SPOT, nodes=4, gpus=1)], [job("a", 0.0, 10.0)],
                    FakeMarket(avail=[(0.0, 3)]))
    st = engine.state
    assert st.quotes["spot"].spot_available_nodes == 3  # published by the engine before any decision
    st.quotes["spot"] = MarketQuote(0.0, 0.0, spot_available_nodes=1)
    assert engine.apply(Scale("spot", 3)) is None
    assert len(st.pools["spot"].nodes) == 1  # the quote's one node, not the market's three
    why = engine.apply(Scale("spot", 1))
    assert why == check_decision(st, Scale("spot", 1)) == "pool spot cannot grow (max 4, held 1, spot available 1)"
