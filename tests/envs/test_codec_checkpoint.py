"""The codec's checkpoint features: a queued job's checkpoint age, a spot pool's work at risk."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from rlsched.cluster.decisions import Decision, WakeAt
from rlsched.cluster.model import ClusterState, PoolKind
from rlsched.envs import ObservationCodec
from rlsched.sim.engine import Engine, SimConfig
from tests.sim.helpers import FakeMarket, Greedy, job, pool


def test_checkpoint_age_and_spot_exposure_follow_the_engine() -> None:
    # j (2 GPUs, 3000 s) runs on spot node 1 from t=0, checkpointing every 300 s; the node is reclaimed at
    # t=1000, keeping the checkpoint written at 900. The pool's minimum asks for a replacement (ready at 1100).
    market = FakeMarket(price=1.0, lifetimes=[1000.0, 1e9])
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=2, lo=1, gpus=2, delay=100.0),
             pool("od", kind=PoolKind.ONDEMAND, nodes=1, gpus=2, delay=100.0)]
    cfg = SimConfig(checkpoint_interval_s=300.0, restart_overhead_s=60.0)
    codec = ObservationCodec(window=4, max_pools=2)
    age = codec.job_features.index("log_checkpoint_age_h")
    exposed = codec.pool_features.index("log_exposed_gpu_h")
    seen: dict[float, dict[str, np.ndarray]] = {}

    def hook(state: ClusterState) -> Iterator[Decision]:
        seen[state.time] = codec.encode(state)
        if state.time == 0.0:
            yield WakeAt(500.0)
        if state.time == 1000.0:
            yield WakeAt(1050.0)

    e = Engine(pools, [job("j", 0, 3000, 2, preemptible=True)], market, cfg)
    e.run(Greedy(hook=hook))
    assert e.state.checkpoint_interval_s == 300.0  # the world's default reaches the state the codec reads
    # t=500: 500 s done, 300 checkpointed: 200 s x 2 GPUs at risk on the spot pool, none on on-demand
    assert seen[500.0]["pools"][0, exposed] == pytest.approx(math.log1p(400.0 / 3600.0))
    assert seen[500.0]["pools"][1, exposed] == 0.0
    # t=1000: reclaimed and queued; its checkpoint (work 900) was written at t=900, nothing runs any more
    assert seen[1000.0]["jobs"][0, age] == pytest.approx(math.log1p(100.0 / 3600.0))
    assert seen[1000.0]["pools"][0, exposed] == 0.0
    assert seen[1050.0]["jobs"][0, age] == pytest.approx(math.log1p(150.0 / 3600.0))
    # a job that never ran holds no checkpoint
    assert seen[0.0]["jobs"][0, age] == 0.0
    assert e.runs["j"].finish_time is not None
