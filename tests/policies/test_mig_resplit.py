"""The MIG re-split rule: re-splits for blocked jobs only, counts re-splits in flight, owns the action."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from sim.helpers import FakeMarket, job, pool

from rlsched.cluster.decisions import Decision, Reconfigure
from rlsched.cluster.model import ClusterState, PoolKind, Sharing
from rlsched.envs.trained_actions import TrainedActions
from rlsched.learned.complement import Complement
from rlsched.policies import make_policy
from rlsched.policies.rules import RuledScheduler, build_rules, owned_actions
from rlsched.policies.rules.mig_resplit import MigResplit
from rlsched.sim.engine import Engine, SimConfig

WHOLE = ("7g.80gb",)


class Log:
    """Records every decision of a scheduler, with the time it was made."""

    def __init__(self, inner: RuledScheduler) -> None:
        self.inner = inner
        self.name = inner.name
        self.decisions: list[tuple[float, Decision]] = []

    def reset(self, state: ClusterState) -> None:
        self.inner.reset(state)

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        for d in self.inner.decide(state):
            self.decisions.append((state.time, d))
            yield d


def _replay(jobs: list, gpus: int = 2, max_per_pass: int = 4) -> tuple[Engine, Log]:  # type: ignore[type-arg]
    """FIFO without its own re-splitting, behind the rule, on one MIG node of whole-GPU layouts."""
    fifo = make_policy("fifo")
    fifo.mig_reconfigure = False  # type: ignore[attr-defined]
    log = Log(RuledScheduler(fifo, build_rules({"mig_resplit": {"max_per_pass": max_per_pass}})))
    eng = Engine([pool("mig", gpus=gpus, sharing=Sharing.MIG, layout=WHOLE)], jobs, None,
                 SimConfig(mig_reconfig_s=60.0))
    eng.run(log)
    return eng, log


def _resplits(log: Log) -> list[tuple[float, Reconfigure]]:
    return [(t, d) for t, d in log.decisions if isinstance(d, Reconfigure)]


def test_a_blocked_fractional_job_gets_one_idle_gpu_re_split_and_its_siblings_share_it() -> None:
    # GPU 0 runs a whole-GPU job; three 1g jobs wait with no 1g instance anywhere: one re-split of the
    # idle GPU to all-1g serves all three (seven instances), even though the rule is asked again at
    # every decision point while the re-split is in flight.
    jobs = [job("whole", 0, 1000, 1), *(job(f"f{i}", 1, 100, 1, gpu_milli=100) for i in range(3))]
    eng, log = _replay(jobs)
    got = _resplits(log)
    assert len(got) == 1
    t, d = got[0]
    assert t == pytest.approx(1.0) and d.layout.count("1g.10gb") == 7
    assert d.gpu_index == 1  # the idle GPU, never the one in use
    assert all(eng.runs[f"f{i}"].first_start == pytest.approx(61.0) for i in range(3))
    assert eng.runs["whole"].first_start == pytest.approx(0.0)


def test_more_blocked_jobs_than_one_layout_serves_re_split_more_gpus() -> None:
    # Nine 1g jobs: one all-1g GPU serves seven, so a second GPU is re-split in the same pass.
    jobs = [job(f"f{i}", 0, 100, 1, gpu_milli=100) for i in range(9)]
    eng, log = _replay(jobs, gpus=2)
    got = _resplits(log)
    assert [t for t, _ in got] == [0.0, 0.0]
    assert {d.gpu_index for _, d in got} == {0, 1}
    assert all(r.first_start == pytest.approx(60.0) for r in eng.runs.values())


def test_max_per_pass_bounds_the_re_splits_of_one_decision_point() -> None:
    jobs = [job(f"f{i}", 0, 100, 1, gpu_milli=100) for i in range(9)]
    _, log = _replay(jobs, gpus=2, max_per_pass=1)
    got = _resplits(log)
    assert got[0][0] == 0.0 and len([t for t, _ in got if t == 0.0]) == 1
    assert len(got) == 2  # the second GPU once the first re-split finished and two jobs still waited


def test_no_re_split_when_the_jobs_can_start_or_the_fleet_has_no_mig() -> None:
    # whole-GPU jobs fit the 7g instances as they are
    _, log = _replay([job("a", 0, 100, 1), job("b", 0, 100, 1)])
    assert _resplits(log) == []
    rule = MigResplit()
    eng = Engine([pool("plain", gpus=2)], [job("f", 0, 100, 1, gpu_milli=100)], None, SimConfig())
    eng.advance()
    assert list(rule.decide(eng.state)) == []


def test_bad_parameters_name_the_rule() -> None:
    with pytest.raises(ValueError, match="mig_resplit: max_per_pass"):
        build_rules({"mig_resplit": {"max_per_pass": 0}})


def test_the_rule_owns_re_splits_the_policy_is_masked_and_the_complement_leaves_them() -> None:
    params = {"mig_resplit": {}}
    assert owned_actions(params) == {"reconfigure"}
    assert owned_actions({"preempt_long": {}}) == frozenset()
    trained = TrainedActions.unrestricted("t").without(owned_actions(params))
    assert not trained.allows("reconfigure", PoolKind.ONPREM) and trained.allows("place", PoolKind.ONPREM)

    from rlsched.envs.gpu_pool import GpuPoolEnv
    from rlsched.scenario import Scenario

    scenario = Scenario("mig", [pool("mig", gpus=2, sharing=Sharing.MIG, layout=WHOLE)],
                        [job(f"f{i}", 0, 100, 1, gpu_milli=100) for i in range(3)], FakeMarket())
    ruled, bare = GpuPoolEnv(scenario, rules=params), GpuPoolEnv(scenario)
    ruled.reset(seed=0)
    bare.reset(seed=0)
    c = ruled.codec
    tail = slice(c.reconfigure_offset, c.reconfigure_offset + c.max_pools * c.layouts)
    assert bare.action_masks()[tail].any()  # without the rule the agent may re-split
    assert not ruled.action_masks()[tail].any()
    # behind the rule the re-split already happened before the agent's first look
    assert any(g.busy_until > 0 for n in ruled.engine.state.nodes.values() for g in n.gpus)

    comp = Complement(TrainedActions.conservative("t"), max_pools=4, ruled=frozenset({"reconfigure"}))
    comp.reset(ruled.engine.state)
    assert comp.reconfigure_pools == frozenset()
    plain = Complement(TrainedActions.conservative("t"), max_pools=4)
    plain.reset(ruled.engine.state)
    assert plain.reconfigure_pools == {next(iter(ruled.engine.state.pools))}
    assert isinstance(np.asarray(ruled.action_masks()), np.ndarray)
