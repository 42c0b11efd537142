"""An anchored codec: the observation carries its teacher's legal choice, and the signature says so."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rlsched.cluster.decisions import Decision
from rlsched.cluster.model import ClusterState, PoolKind
from rlsched.envs import ObservationCodec
from rlsched.envs.teacher_actions import teacher_action
from rlsched.sim.engine import Engine
from tests.sim.helpers import FakeMarket, Greedy, job, pool


def test_anchor_adds_a_one_hot_key_and_changes_the_signature() -> None:
    plain = ObservationCodec(window=4, max_pools=2)
    anchored = ObservationCodec(window=4, max_pools=2).anchor_to("sjf-spot-first")
    assert "anchor" not in plain.observation_space.spaces
    assert anchored.observation_space["anchor"].shape == (anchored.n_actions,)
    assert anchored.signature() != plain.signature()
    assert anchored.describe()["anchor"] == "sjf-spot-first" and "anchor" not in plain.describe()
    # another teacher is another encoding; None lifts the anchor again
    assert ObservationCodec(window=4, max_pools=2).anchor_to("sjf").signature() != anchored.signature()
    lifted = anchored.anchor_to(None)
    assert lifted.signature() == plain.signature() and "anchor" not in lifted.observation_space.spaces


@pytest.mark.parametrize("name", ["best-follow", "lookahead", "follow:sjf", "nope"])
def test_a_teacher_that_does_not_act_itself_cannot_anchor(name: str) -> None:
    # pickers choose among follow teachers; follow:NAME needs a codec nominating with NAME
    with pytest.raises(ValueError, match="unknown anchor teacher"):
        ObservationCodec(window=4, max_pools=2).anchor_to(name)


def test_the_anchor_is_the_teachers_choice_among_the_legal_actions() -> None:
    pools = [pool("spot", kind=PoolKind.SPOT, nodes=2, lo=1, gpus=2),
             pool("od", kind=PoolKind.ONDEMAND, nodes=2, lo=1, gpus=2)]
    jobs = [job(f"j{i}", 10.0 * i, 600.0 * (3 - i), 1, preemptible=True) for i in range(3)]
    codec = ObservationCodec(window=4, max_pools=2).anchor_to("sjf-spot-first")
    seen: list[tuple[np.ndarray, int, np.ndarray]] = []

    def hook(state: ClusterState) -> Iterator[Decision]:
        mask = codec.mask(state)
        if mask[: codec.wait_action].any():
            obs = codec.encode(state)
            seen.append((obs["anchor"], teacher_action(codec, state, mask, rule="sjf-spot-first"), mask))
        yield from ()

    e = Engine(pools, jobs, FakeMarket(price=1.0))
    e.run(Greedy(hook=hook))
    assert seen
    for onehot, chosen, mask in seen:
        assert onehot.dtype == np.float32 and onehot.sum() == 1.0
        assert int(np.argmax(onehot)) == chosen and mask[chosen]
