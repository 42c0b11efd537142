"""ClusterState's queue stays in submission order when preempted jobs re-enter it."""

from __future__ import annotations

import random

from rlsched.cluster.catalog import gpu_model
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, JobRun, PoolKind, PoolSpec


def test_re_entering_jobs_land_where_a_stable_sort_puts_them() -> None:
    spec = PoolSpec(name="p", kind=PoolKind.ONPREM, model=gpu_model("V100-16GB"), gpus_per_node=8,
                    min_nodes=1, max_nodes=1)
    state = ClusterState([spec])
    rng = random.Random(7)
    order: list[JobRun] = []
    for k in range(300):  # arrivals in order, then re-entries at random earlier times (many ties)
        run = JobRun(Job(f"j{k}", float(k // 3), 10.0, user=f"u{k % 2}", priority=k % 3))
        if k >= 200:
            run = JobRun(Job(f"j{k}", float(rng.randrange(0, 67)), 10.0, user=f"u{k % 2}", priority=k % 3))
        state.enqueue(run)
        order.append(run)
    expected = sorted(order, key=lambda r: r.job.submit_time)  # stable: ties keep entry order
    assert list(state.queue.values()) == expected
    for prio, level in state.queue_by_priority.items():
        assert list(level.values()) == [r for r in expected if r.job.priority == prio]
    for key, same in state.queue_by_estimate_key.items():
        assert list(same.values()) == [r for r in expected if (r.job.user, r.job.num_gpus, r.job.gpu_milli) == key]
    assert list(state.queue) == [r.job.job_id for r in expected]
