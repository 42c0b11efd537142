"""The observation window: the oldest half of the queue plus its shortest-estimated jobs."""

from __future__ import annotations

from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, JobRun
from rlsched.cluster.shorthand import parse_cluster
from rlsched.envs.codec import ObservationCodec


def _state(jobs: list[Job]) -> ClusterState:
    st = ClusterState(parse_cluster("1x8xV100-16GB"))
    for j in jobs:
        st.enqueue(JobRun(j))
    return st


def _learn(st: ClusterState, user: str, duration: float, n: int = 5) -> None:
    for i in range(n):
        st.estimator.observe(Job(f"{user}-done-{i}", 0.0, duration, user=user), duration)


def test_short_jobs_deep_in_a_long_queue_enter_the_window() -> None:
    # 500 long jobs, then 10 short ones far beyond any fixed scan depth
    jobs = [Job(f"long{i:03d}", float(i), 36_000.0, user="long") for i in range(500)]
    jobs += [Job(f"short{i}", 1_000.0 + i, 60.0, user="short") for i in range(10)]
    st = _state(jobs)
    _learn(st, "long", 36_000.0)
    _learn(st, "short", 60.0)
    ids = [r.job.job_id for r in ObservationCodec(window=16).window_runs(st)]
    assert ids[:8] == [f"long{i:03d}" for i in range(8)]  # the head: oldest first
    assert ids[8:] == [f"short{i}" for i in range(8)]  # the 8 oldest of the shortest, in submission order


def test_ties_prefer_older_jobs_and_the_head_is_never_repeated() -> None:
    jobs = [Job(f"a{i:02d}", float(i), 600.0, user="a") for i in range(30)]
    st = _state(jobs)
    _learn(st, "a", 600.0)
    ids = [r.job.job_id for r in ObservationCodec(window=16).window_runs(st)]
    assert ids == [f"a{i:02d}" for i in range(16)]


def test_window_follows_dequeues_and_estimate_changes() -> None:
    jobs = [Job(f"x{i:02d}", float(i), 600.0, user="x") for i in range(20)]
    jobs += [Job(f"y{i:02d}", 100.0 + i, 600.0, user="y") for i in range(20)]
    st = _state(jobs)
    _learn(st, "x", 600.0)
    _learn(st, "y", 6_000.0)
    codec = ObservationCodec(window=4)
    assert [r.job.job_id for r in codec.window_runs(st)] == ["x00", "x01", "x02", "x03"]
    for i in range(20):
        st.dequeue(f"x{i:02d}")
    assert [r.job.job_id for r in codec.window_runs(st)] == ["y00", "y01", "y02", "y03"]
    assert {k[0] for k in st.queue_by_estimate_key} == {"y"}  # the per-key index follows the queue
    st.enqueue(JobRun(Job("z", 500.0, 60.0, user="z")))
    _learn(st, "z", 60.0)
    assert [r.job.job_id for r in codec.window_runs(st)] == ["y00", "y01", "y02", "z"]
