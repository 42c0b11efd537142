"""The live service's duration estimator learns from its own finished jobs, and keeps it across restarts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlsched.runtime.job_request import JobRequest
from rlsched.runtime.store import JobRecord, JobState
from rlsched.service.durations import run_time
from rlsched.service.service import SchedulerService
from rlsched.service.view import job_of
from tests.service import PY, kill_jobs, make_config, service, sleeper, until

#: a job that runs a known time (over the estimator's one-second floor) and succeeds
RUN_S = 1.2
PRIOR_S = 3600.0


def _runs(seconds: float, rc: int = 0) -> list[str]:
    return [PY, "-c", f"import sys, time; time.sleep({seconds}); sys.exit({rc})"]


def _done(svc: SchedulerService, ids: list[str]) -> bool:
    return all(svc.job_status(j)["state"] == "done" for j in ids)


def _geomean_of_runs(recs: list[JobRecord]) -> float:
    """What the estimator holds after learning these run times first (each key's mean starts at the first
    observation, then moves by max(alpha, 1/n): exactly the mean of two)."""
    logs = [math.log(max(run_time(r) or 0.0, 1.0)) for r in recs]
    assert len(logs) == 2
    return math.exp(sum(logs) / 2)


def test_finished_jobs_teach_the_estimator_every_view_carries(tmp_path: Path) -> None:
    with service(tmp_path) as svc:
        est = svc.durations.estimator
        fresh = job_of(svc.submit(JobRequest(sleeper(), gpus=1, user="carol", priority=-5)))
        assert est.estimate(fresh) == PRIOR_S and est.log_error == 0.0
        ids = [svc.submit(JobRequest(_runs(RUN_S), gpus=1, user="alice")).id for _ in range(2)]
        until(svc, lambda: _done(svc, ids) and svc.durations.learnt == 2)
        recs = [svc.store.get(j) for j in ids]
        assert all(r is not None for r in recs)
        runs = [run_time(r) for r in recs if r is not None]
        assert all(t is not None and RUN_S <= t < 60.0 for t in runs)
        want = _geomean_of_runs([r for r in recs if r is not None])
        # A new job of alice (another GPU class: her per-user mean), and of a user never seen (everyone's).
        alice = job_of(svc.submit(JobRequest(sleeper(), gpus=4, user="alice")))
        bob = job_of(svc.submit(JobRequest(sleeper(), gpus=1, user="bob")))
        for job in (alice, bob, fresh):
            assert est.estimate(job) == pytest.approx(want, rel=1e-9)
            assert RUN_S <= est.estimate(job) < 60.0
        assert est.log_error > 0.0  # the first finish was scored against the one-hour prior
        # What policies read: every view the scheduling pass builds carries this same estimator.
        svc.tick()
        assert svc.scheduling.current_view().state.estimator is est
        assert svc.scheduling.build_view().state.estimator is est


def test_failed_and_cancelled_jobs_teach_nothing(tmp_path: Path) -> None:
    with service(tmp_path) as svc:
        failed = svc.submit(JobRequest(_runs(0.2, rc=1), gpus=1, user="alice"))
        cancelled = svc.submit(JobRequest(sleeper(), gpus=1, user="alice"))
        until(svc, lambda: svc.job_status(cancelled.id)["pid"] is not None)
        svc.cancel(cancelled.id)
        until(svc, lambda: svc.job_status(failed.id)["state"] == "failed"
              and svc.job_status(cancelled.id)["state"] == "cancelled")
        svc.tick()
        est = svc.durations.estimator
        assert svc.durations.learnt == 0 and est.version == 0 and est.log_error == 0.0
        assert est.estimate(job_of(failed)) == PRIOR_S


def test_a_restarted_service_keeps_what_it_learnt(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    first = SchedulerService(cfg)
    try:
        ids = [first.submit(JobRequest(_runs(RUN_S), gpus=1, user="alice")).id for _ in range(2)]
        until(first, lambda: _done(first, ids) and first.durations.learnt == 2)
        learnt = first.durations.estimator.estimate(job_of(first.store.get(ids[0])))  # type: ignore[arg-type]
        # One more job is running when the service stops; it ends while no service runs.
        late = first.submit(JobRequest(_runs(0.3), gpus=1, user="dave"))
        until(first, lambda: first.job_status(late.id)["pid"] is not None)
    finally:
        first.stop()
        first.store.close()
    until(None, lambda: any(cfg.log_dir.glob(f"{late.id}.*.exit.json")))
    second = SchedulerService(cfg)
    try:
        # Warmed up from the store's history before anything else happened.
        assert second.durations.learnt == 2
        est = second.durations.estimator
        assert est.estimate(job_of(second.store.get(ids[0]))) == pytest.approx(learnt, rel=1e-9)  # type: ignore[arg-type]
        assert est.log_error > 0.0
        # Recovery records the exit that happened while it was down: learnt from exactly once, however
        # often recovery runs and the loop ticks.
        # The exit file can land a moment before the wrapper process is gone (seen on a loaded machine:
        # recovery then still finds it alive), so recover until it is recorded; once is what counts.

        def recovered() -> bool:
            second.recover()
            return second.store.get(late.id).state is JobState.DONE  # type: ignore[union-attr]

        until(None, recovered)
        assert second.durations.learnt == 3
        second.recover()
        for _ in range(5):
            second.tick()
        assert second.durations.learnt == 3
        assert second.scheduling.current_view().state.estimator is est
    finally:
        second.stop()
        kill_jobs(second)
        second.store.close()
    third = SchedulerService(cfg)
    try:
        assert third.durations.learnt == 3
    finally:
        third.store.close()
