"""The trained-actions record and the codec's mask of what a model was not trained with."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.cluster.model import PoolKind, Sharing
from rlsched.cluster.shorthand import parse_cluster
from rlsched.envs import ObservationCodec
from rlsched.envs.trained_actions import TrainedActions
from rlsched.sim.engine import Engine
from tests.sim.helpers import FakeMarket, job, pool

ONPREM = frozenset({PoolKind.ONPREM})


def test_record_of_fleets_round_trip_and_bad_documents() -> None:
    onprem = parse_cluster("8x8xV100-16GB")
    hybrid = parse_cluster("2x8xA100-80GB/mig=balanced,spot:0-4x8xA100-80GB,ondemand:2-2x8xA100-80GB")
    rec = TrainedActions.of_fleets([onprem], max_pools=4, layouts=6, source="philly")
    assert (rec.place, rec.reconfigure, rec.scale_up, rec.scale_down) == (ONPREM, frozenset(), frozenset(),
                                                                            frozenset())
    both = TrainedActions.of_fleets([onprem, hybrid], max_pools=4, layouts=6, source="x")
    assert both.place == frozenset(PoolKind) and both.reconfigure == ONPREM
    # an on-demand pool fixed at 2 nodes never scales
    assert both.scale_up == both.scale_down == frozenset({PoolKind.SPOT})
    # pools past max_pools are not controllable: they teach nothing
    assert TrainedActions.of_fleets([hybrid], max_pools=1, layouts=6, source="").place == ONPREM
    assert not rec.covers(hybrid, max_pools=4, layouts=6) and both.covers(hybrid, max_pools=4, layouts=6)
    assert TrainedActions.from_dict(both.to_dict()) == both
    assert rec.describe() == "place: onprem; reconfigure: -; scale up: -; scale down: -; wait"
    for doc, msg in [({"format": 2}, "format 2"),
                     ({**rec.to_dict(), "scale_up": "spot"}, "'scale_up' must be a list"),
                     ({**rec.to_dict(), "place": ["cloud"]}, "unknown pool kind 'cloud'"),
                     ({**rec.to_dict(), "wait": "yes"}, "'wait' must be true or false"),
                     ([], "expected a JSON object")]:
        with pytest.raises(ValueError, match=msg):
            TrainedActions.from_dict(doc)  # type: ignore[arg-type]


def _hybrid_engine() -> Engine:
    """One on-prem MIG node (1 GPU, idle), an elastic spot pool holding one idle node, an on-demand pool."""
    pools = [pool("onprem", nodes=1, gpus=1, sharing=Sharing.MIG, layout=("3g.40gb", "3g.40gb")),
             pool("spot", kind=PoolKind.SPOT, nodes=2, lo=1, gpus=2),
             pool("od", kind=PoolKind.ONDEMAND, nodes=2, lo=0, gpus=2)]
    jobs = [job("big", 0, 100, 2, preemptible=True), job("small", 0, 100, 1, preemptible=True)]
    e = Engine(pools, jobs, FakeMarket(price=1.0))
    e.reset()
    e.advance()
    return e


def test_the_mask_keeps_only_trained_actions_and_waiting_stays_possible() -> None:
    e = _hybrid_engine()
    free = ObservationCodec(window=4, max_pools=3, layouts=6)
    full = free.mask(e.state)
    scale = slice(free.scale_offset, free.wait_action)
    reconf = slice(free.reconfigure_offset, free.scale_offset)
    # without a record the codec offers scaling, MIG re-splits and spot placement here
    assert full[scale].any() and full[reconf].any() and full[1] and not full[free.wait_action]

    onprem_only = TrainedActions(ONPREM, frozenset(), frozenset(), frozenset(), True, "test")
    codec = ObservationCodec(window=4, max_pools=3, layouts=6).restrict(onprem_only)
    mask = codec.mask(e.state)
    assert not mask[scale].any() and not mask[reconf].any()
    place = mask[: codec.reconfigure_offset].reshape(4, 3)
    assert not place[:, 1:].any()  # nothing into the spot or on-demand pool
    # "big" (2 GPUs) fits only spot, which the model may not use; "small" fits neither on-prem instance
    # (a 3g slice is not a whole GPU), so waiting is the only legal action - never an empty mask
    assert mask[codec.wait_action] and mask.sum() == 1
    assert codec.only_wait(e.state) and not free.only_wait(e.state)
    # the observation is the one the network was trained on: the record changes legality only
    for key, arr in codec.encode(e.state).items():
        assert np.array_equal(arr, free.encode(e.state)[key])

    spot = TrainedActions(frozenset({PoolKind.SPOT}), frozenset(), frozenset({PoolKind.SPOT}), frozenset(), True, "")
    mask = ObservationCodec(window=4, max_pools=3, layouts=6).restrict(spot).mask(e.state)
    assert mask[free.scale_offset + 2] and not mask[free.scale_offset + 3]  # spot up yes, spot down no
    assert not mask[free.scale_offset + 4]  # on-demand up: not trained
    assert mask[1] and not mask[free.wait_action]  # "big" into spot is trained and binding: no waiting
