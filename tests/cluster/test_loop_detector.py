"""The decision-loop detector, and the simulator handing a looping decision point to weighted-priority."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlsched.cluster.decisions import Decision, Place, Reconfigure, Scale, WakeAt
from rlsched.cluster.feasibility import candidates
from rlsched.cluster.loop_detector import LoopBreaker, LoopConfig, LoopDetector, fitting_job
from rlsched.cluster.model import ClusterState, PoolKind
from rlsched.policies import make_policy
from rlsched.scenario import load_scenario
from rlsched.sim import Engine, SimConfig
from tests.sim.helpers import FakeMarket, job, pool


class Alternating:
    """Scales the spot pool +1, -1, +1, ... without end: the shipped on-prem model's livelock."""

    name = "alternating"

    def __init__(self) -> None:
        self.decided = 0

    def reset(self, state: ClusterState) -> None:
        self.decided = 0

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        i = 0
        while True:
            self.decided += 1
            yield Scale("spot", 1 if i % 2 == 0 else -1)
            i += 1


class Dawdling:
    """Asks to be woken later, again and again, and never places anything."""

    name = "dawdling"

    def reset(self, state: ClusterState) -> None:
        return None

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        for i in range(10_000):
            yield WakeAt(state.time + 1.0 + i)


def _engine(n_jobs: int = 6) -> Engine:
    pools = [pool("onprem", nodes=1, gpus=4), pool("spot", kind=PoolKind.SPOT, nodes=2, gpus=4, delay=100.0)]
    jobs = [job(f"j{i}", 10.0 * i, 600.0, preemptible=True) for i in range(n_jobs)]
    return Engine(pools, jobs, FakeMarket(price=1.0))


def test_scale_alternation_is_handed_to_weighted_priority_and_counted() -> None:
    e = _engine()
    sched = Alternating()
    report = e.run(sched)
    # without the hand-over nothing would ever be placed: the run ends with every job done
    assert report.jobs_completed == 6 and report.refused_decisions == 0
    assert report.loop_handovers > 0 and e.loop_breaker is not None
    assert e.loop_breaker.handovers == {"scale alternation": report.loop_handovers}
    assert "pool spot scaled up and down 3 times" in e.loop_breaker.last_reason
    # each decision point stopped at the third scale (+1, -1, then +1 refused): never more
    assert sched.decided == 3 * report.loop_handovers
    assert report.result()["loop_handovers"] == report.loop_handovers


def test_decisions_without_placement_while_a_job_fits_are_handed_over() -> None:
    e = _engine(2)
    report = e.run(Dawdling())
    assert report.jobs_completed == 2
    assert e.loop_breaker is not None and e.loop_breaker.handovers.get("no progress", 0) >= 1
    assert "64 decisions without a placement while job j" in e.loop_breaker.last_reason


def test_detector_needs_a_job_that_fits_and_a_placement_resets_it() -> None:
    # one on-prem node of 4 GPUs, five 1-GPU jobs at t=0
    e = Engine([pool("onprem", nodes=1, gpus=4)], [job(f"j{i}", 0.0, 600.0) for i in range(5)], FakeMarket())
    e.reset()
    e.advance()
    st = e.state
    det = LoopDetector(LoopConfig(max_idle_decisions=4, max_reversals=2))
    det.start()
    assert fitting_job(st) == "j0"
    wake = WakeAt(st.time + 5)
    assert [det.check(st, wake) for _ in range(3)] == [None, None, None]
    assert det.check(st, wake) == "4 decisions without a placement while job j0 fits"
    det.start()
    for _ in range(3):
        det.check(st, wake)
    assert det.check(st, Place("j0", candidates(st, st.queue["j0"].job)[0])) is None  # progress resets the count
    assert [det.check(st, wake) for _ in range(3)] == [None, None, None]
    # one reversal is allowed (buy, then cancel); the second is a loop, counted per pool
    det.start()
    assert [det.check(st, Scale("spot", d)) for d in (1, -1)] == [None, None]
    assert det.check(st, Scale("other", -1)) is None
    assert det.check(st, Scale("spot", 1)) is not None
    # a full node: j4 fits nowhere, so decisions without placements are no loop
    for i in range(4):
        assert e.apply(Place(f"j{i}", candidates(st, st.queue[f"j{i}"].job)[0])) is None
    assert fitting_job(st) is None and "j4" in st.queue
    det = LoopDetector(LoopConfig(max_idle_decisions=2))
    det.start()
    assert [det.check(st, wake) for _ in range(6)] == [None] * 6
    with pytest.raises(ValueError):
        LoopConfig(max_idle_decisions=0)


def test_heuristics_are_replayed_as_written_and_would_not_trip_the_detector() -> None:
    sc = load_scenario(None)
    jobs = sorted(sc.jobs, key=lambda j: j.submit_time)[:400]
    # the heuristics are baselines (and the fallback): the engine does not watch them unless told to
    e = Engine(sc.pools, jobs, sc.market, sc.sim)
    e.run(make_policy("fifo"))
    assert e.loop_breaker is None
    for name in ("weighted-priority", "tiresias", "spot-fallback", "fgd"):
        breaker = LoopBreaker()
        report = Engine(sc.pools, jobs, sc.market, sc.sim).run(make_policy(name), loop_breaker=breaker)
        assert report.loop_handovers == 0 and breaker.handovers == {}, name


class Churning:
    """Re-splits the idle MIG GPU at every decision point, alternating two layouts, and places nothing."""

    name = "churning"
    layouts = (("1g.10gb",) * 7, ("3g.40gb", "3g.40gb"))  # the GPU starts in the second

    def __init__(self) -> None:
        self.splits = 0

    def reset(self, state: ClusterState) -> None:
        self.splits = 0

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        from rlsched.cluster.feasibility import reconfigure_check

        node = next(iter(state.nodes.values()))
        layout = self.layouts[self.splits % 2]
        if reconfigure_check(state, node.id, 0, layout) is None:
            self.splits += 1
            yield Reconfigure(node.id, 0, layout)


def test_mig_churn_across_decision_points_is_handed_over() -> None:
    # one on-prem MIG GPU and one 3g job: every re-split keeps the GPU busy for a minute and its end is
    # the next decision point, so without the detector the GPU re-splits for ever and the job never runs
    from rlsched.cluster.model import Sharing

    pools = [pool("mig", nodes=1, gpus=1, sharing=Sharing.MIG, layout=("3g.40gb", "3g.40gb"))]
    e = Engine(pools, [job("j", 0.0, 600.0, gpu_milli=400)], FakeMarket(), SimConfig(horizon_s=86400.0))
    sched = Churning()
    report = e.run(sched)
    assert report.jobs_completed == 1
    assert e.loop_breaker is not None and e.loop_breaker.handovers == {"MIG churn": 1}
    assert "re-split 3 times with nothing placed on it" in e.loop_breaker.last_reason
    assert sched.splits == 3  # two applied, the third refused and handed over


def test_the_default_fallback_is_weighted_priority_once_the_heuristics_are_imported() -> None:
    """The loop detector sits below the heuristics: importing them installs its default fallback."""
    import rlsched.policies  # noqa: F401  (installs the default)
    from rlsched.policies.heuristics import WeightedPriority

    assert type(LoopBreaker().fallback) is WeightedPriority
