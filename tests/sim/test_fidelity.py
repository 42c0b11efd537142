"""Fidelity: rlsched's mean JCT on small constructed workloads equals the answer computed by hand.

Each case states its schedule in the comment above it; the numbers are the ones in
BENCHMARKS.md ("Fidelity: hand-computed reference workloads"). They pin the engine's
event order, the policies' rules (FIFO without backfill, SJF on true durations,
Tiresias' discretised LAS with preemption and restart overhead) and the gang placement
modes, so that a change to any of them shows up as a changed number here first.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlsched.cluster.job import Job
from rlsched.cluster.model import GangMode, PoolSpec
from rlsched.cluster.scheduler import Scheduler
from rlsched.policies import make_policy
from rlsched.sim.engine import Engine, SimConfig
from sim.helpers import job, pool


def _jct(pools: list[PoolSpec], jobs: list[Job], policy: Scheduler,
         restart_overhead_s: float = 60.0) -> dict[str, float]:
    engine = Engine(pools, jobs, config=SimConfig(restart_overhead_s=restart_overhead_s))
    report = engine.run(policy)
    jct = {jid: r.finish_time - r.job.submit_time for jid, r in engine.runs.items()
           if r.finish_time is not None}
    assert len(jct) == len(jobs)
    assert report.mean_jct_s == pytest.approx(sum(jct.values()) / len(jct))
    return jct


# One GPU; A (t=0, 10 s), B (t=1, 5 s), C (t=2, 1 s).
THREE = [job("A", 0, 10), job("B", 1, 5), job("C", 2, 1)]


def test_fifo_by_hand() -> None:
    # A 0-10, B 10-15, C 15-16: JCT 10, 14, 14; mean 38/3.
    jct = _jct([pool("p")], THREE, make_policy("fifo"))
    assert jct == {"A": 10.0, "B": 14.0, "C": 14.0}
    assert sum(jct.values()) / 3 == pytest.approx(12.6667, abs=1e-4)


def test_sjf_by_hand() -> None:
    # A alone at 0 runs 0-10 (no preemption); then C (1 s) 10-11, B 11-16: JCT 10, 15, 9; mean 34/3.
    jct = _jct([pool("p")], THREE, make_policy("sjf", oracle=True))
    assert jct == {"A": 10.0, "B": 15.0, "C": 9.0}
    assert sum(jct.values()) / 3 == pytest.approx(11.3333, abs=1e-4)


# One GPU, Tiresias with one threshold at 30 GPU-s; A (t=0, 100 s) is preemptible,
# B (t=10, 10 s) and C (t=20, 10 s) are new.
LAS = [job("A", 0, 100, preemptible=True), job("B", 10, 10), job("C", 20, 10)]


def test_las_by_hand() -> None:
    # A runs from 0; B and C wait in A's queue (no preemption within a queue). At 30 A has 30 GPU-s,
    # is demoted and preempted: B 30-40, C 40-50, then A resumes with 70 s left plus the 60 s
    # restart overhead, 50-180. JCT 180, 30, 30; mean 80. FIFO: 100, 100, 100.
    tiresias = make_policy("tiresias", thresholds=(30.0,))
    assert _jct([pool("p")], LAS, tiresias) == {"A": 180.0, "B": 30.0, "C": 30.0}
    assert _jct([pool("p")], LAS, make_policy("tiresias", thresholds=(30.0,)), restart_overhead_s=0.0) == {
        "A": 120.0, "B": 30.0, "C": 30.0}
    assert _jct([pool("p")], LAS, make_policy("fifo")) == {"A": 100.0, "B": 100.0, "C": 100.0}
    # Nothing is preempted when A does not declare itself preemptible: B 100-110, C 110-120.
    fixed = [replace(LAS[0], preemptible=False), *LAS[1:]]
    assert _jct([pool("p")], fixed, make_policy("tiresias", thresholds=(30.0,))) == {
        "A": 100.0, "B": 100.0, "C": 100.0}


# Three nodes of 4 GPUs; a (t=0, 100 s, 3 GPUs) on node 0, b (t=0, 100 s, 3 GPUs) on node 1,
# then a 6-GPU gang g (t=1, 50 s). 1 + 1 + 4 GPUs are free.
GANG = [job("a", 0, 100, n=3), job("b", 0, 100, n=3), job("g", 1, 50, n=6)]


@pytest.mark.parametrize(("mode", "expected"), [
    # whole-nodes: g needs one free node plus 2 GPUs on another: it waits until a and b finish
    # at 100 (node 0 whole, 2 GPUs of node 1), 100-150. JCT 100, 100, 149; mean 349/3.
    (GangMode.WHOLE_NODES, {"a": 100.0, "b": 100.0, "g": 149.0}),
    # packed: any 6 free GPUs: g runs 1-51 on 1 + 1 + 4 GPUs. JCT 100, 100, 50; mean 250/3.
    (GangMode.PACKED, {"a": 100.0, "b": 100.0, "g": 50.0}),
])
def test_gang_placement_by_hand(mode: GangMode, expected: dict[str, float]) -> None:
    pools = [replace(pool("p", nodes=3, gpus=4), gang=mode)]
    assert _jct(pools, GANG, make_policy("fifo")) == expected
