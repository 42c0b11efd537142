"""Checkpoint arithmetic shared by the engine, Uniform Progress and the observation codec."""

from __future__ import annotations

import pytest

from rlsched.cluster.checkpoint import checkpoint_age, exposure, interval_of, kept_after_reclaim, progress_now
from rlsched.cluster.job import Job
from rlsched.cluster.model import JobRun, Placement


def _run(**kw: object) -> JobRun:
    return JobRun(job=Job("j", 0.0, 3000.0, num_gpus=2, **kw))  # type: ignore[arg-type]


def test_kept_work_is_the_newest_checkpoint_and_never_shrinks() -> None:
    assert kept_after_reclaim(1000.0, 300.0, 0.0) == 900.0
    assert kept_after_reclaim(900.0, 300.0, 0.0) == 900.0
    assert kept_after_reclaim(880.0, 300.0, 900.0) == 900.0  # reclaimed while repaying the restart overhead
    assert kept_after_reclaim(1000.0, 0.0, 0.0) == 0.0  # no checkpoints: everything is lost
    assert kept_after_reclaim(-60.0, 300.0, 0.0) == 0.0


def test_interval_the_job_names_wins_over_the_default() -> None:
    assert interval_of(_run(), 1800.0) == 1800.0
    assert interval_of(_run(checkpoint_interval=400.0), 1800.0) == 400.0


def test_exposure_counts_only_running_work_since_the_last_checkpoint() -> None:
    run = _run()
    assert exposure(run, 500.0, 300.0) == 0.0  # queued: nothing at risk
    run.placement = Placement("p", (("n", 0), ("n", 1)))
    run.started_at, run.work_done, run.rate = 100.0, 0.0, 0.5
    assert progress_now(run, 900.0) == pytest.approx(400.0)
    assert exposure(run, 900.0, 300.0) == pytest.approx(100.0)


def test_checkpoint_age() -> None:
    run = _run()
    assert checkpoint_age(run, 1000.0) == 0.0
    run.checkpoint_at = 900.0
    assert checkpoint_age(run, 1000.0) == pytest.approx(100.0)
