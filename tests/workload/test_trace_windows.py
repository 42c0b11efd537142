"""Windows, offered load and load rescaling: properties that must hold for any trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.cluster.job import Job
from rlsched.workload import Trace, offered_load, read_philly, scale_to_load, split_windows, take, window

_job = st.builds(
    lambda i, s, d, g, m: Job(f"j{i}", s, d, g, m),
    st.integers(0, 10**9),
    st.integers(0, 10**6).map(float),
    st.floats(1, 1e5, allow_nan=False),
    st.integers(0, 8),
    st.sampled_from([1000, 500, 143]),
)


def _trace(jobs: list[Job]) -> Trace:
    return Trace([Job(f"j{i}", j.submit_time, j.duration, j.num_gpus, j.gpu_milli) for i, j in enumerate(jobs)])


@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(_job, min_size=2, max_size=40), st.floats(0.05, 5.0), st.integers(1, 512))
def test_scale_to_load_hits_target_and_keeps_jobs(jobs: list[Job], target: float, capacity: int) -> None:
    tr = _trace(jobs)
    if tr.gpu_seconds() == 0 or tr.last_submit == tr.start:
        with pytest.raises(ValueError):
            scale_to_load(tr, capacity, target)
        return
    scaled = scale_to_load(tr, capacity, target)
    assert offered_load(scaled, capacity) == pytest.approx(target, rel=1e-6)
    assert [j.job_id for j in scaled.jobs] == [j.job_id for j in tr.jobs]  # arrival order kept
    assert [(j.duration, j.shape) for j in scaled.jobs] == [(j.duration, j.shape) for j in tr.jobs]
    assert scaled.start == pytest.approx(tr.start)


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(_job, min_size=1, max_size=40), st.floats(1, 5e5))
def test_split_windows_partition_jobs(jobs: list[Job], length: float) -> None:
    tr = _trace(jobs)
    parts = split_windows(tr, length)
    assert sum(len(w) for w in parts) == len(tr)
    for w in parts:
        assert all(0 <= j.submit_time < length for j in w.jobs)
    ids = [j.job_id for w in parts for j in w.jobs]
    assert sorted(ids) == sorted(j.job_id for j in tr.jobs)


def test_window_rebases_and_keeps_durations() -> None:
    tr = Trace([Job("a", 5.0, 100.0, deadline=300.0), Job("b", 15.0, 1.0), Job("c", 25.0, 1.0)], censored=0)
    w = window(tr, 10.0, 30.0)
    assert [(j.job_id, j.submit_time, j.duration) for j in w.jobs] == [("b", 5.0, 1.0), ("c", 15.0, 1.0)]
    head = window(tr, 2.0, 10.0).jobs[0]
    assert (head.submit_time, head.deadline) == (3.0, 298.0)  # deadline keeps its slack
    with pytest.raises(ValueError):
        window(tr, 3.0, 3.0)


def test_overlapping_windows() -> None:
    tr = Trace([Job(str(i), float(i), 1.0) for i in range(10)])
    parts = split_windows(tr, 4.0, stride_s=2.0)
    assert [len(w) for w in parts] == [4, 4, 4, 4, 2]


def test_offered_load_definition() -> None:
    jobs = [Job("a", 0.0, 100.0, 2), Job("b", 100.0, 100.0, 1, 500), Job("c", 50.0, 100.0, 0)]
    assert offered_load(jobs, 10) == pytest.approx((200 + 50) / (10 * 100))
    assert offered_load([], 10) == 0.0
    assert offered_load([Job("a", 0.0, 10.0, 1)], 1) == 1.0  # no arrival span: falls back to the makespan
    with pytest.raises(ValueError):
        offered_load(jobs, 0)


def test_take_and_real_trace_load(data_dir: Path) -> None:
    tr = read_philly(data_dir / "philly_slice.csv")
    assert [j.job_id for j in take(tr, 5).jobs] == [j.job_id for j in tr.jobs[:5]]
    assert len(take(tr, 10**6)) == len(tr)
    scaled = scale_to_load(tr, 64, 0.8)
    assert offered_load(scaled, 64) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        take(tr, -1)


def test_split_windows_partition_at_float_boundaries() -> None:
    """Jobs submitted exactly on (float-rounded) window boundaries land in exactly one window."""
    length = 0.1
    jobs = [Job(str(i), 0.3 + i * length, 1.0) for i in range(200)]  # 0.3 + k*0.1 is rarely exact
    jobs.append(Job("origin", 0.3, 1.0))
    tr = _trace(jobs)
    parts = split_windows(tr, length)
    ids = [j.job_id for w in parts for j in w.jobs]
    assert sorted(ids) == sorted(j.job_id for j in tr.jobs)
    assert all(0.0 <= j.submit_time < length for w in parts for j in w.jobs)
