"""The live service serves a model inside what it learned, and its guard hands a decision loop to the heuristic."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlsched.cluster.decisions import Decision, WakeAt
from rlsched.cluster.model import ClusterState
from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.job_request import JobRequest
from tests.service import PY, service, until, write_spec

ROOT = Path(__file__).resolve().parents[2]


class Dawdling:
    """A primary that asks to be woken later, over and over, and never places the job that fits."""

    name = "dawdling"

    def reset(self, state: ClusterState) -> None:
        return None

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        for i in range(10_000):
            yield WakeAt(state.time + 60.0 + i)


def test_the_default_model_is_served_inside_its_record_and_a_loop_falls_back_audited(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    shutil.copytree(ROOT / "models" / "scorer", tmp_path / "default-model")
    write_spec(tmp_path, scheduler="rl", model="default-model")
    with service(tmp_path) as svc:
        first = svc.submit(JobRequest([PY, "-c", "pass"], gpus=1))
        until(svc, lambda: svc.job_status(first.id)["state"] == "done")
        guard = svc.policy.guard
        assert guard is not None and guard.primary is not None, svc.info()
        primary = guard.primary
        # the record travelled with the folder: the network may only place (on-prem) and wait; what it
        # lacks on this fleet (re-splitting the MIG pool) is the complement's, which the service keeps off
        assert primary.model.trained_actions.describe().startswith("place: onprem; reconfigure: -")  # type: ignore[attr-defined]
        complement = primary.complement  # type: ignore[attr-defined]
        assert complement is not None and not complement.heuristic.mig_reconfigure
        # every pool here is on-prem: the model places in both, so with re-splits off nothing is left to it
        assert complement.reconfigure_pools == {"mig"} and not complement.active
        alloc = next(r for r in svc.audit(job=first.id) if r.event is AuditEvent.ALLOCATION)
        assert alloc.policy.startswith("rl:")  # the model itself placed it
        assert guard.fallbacks_by_reason.get("decision-loop", 0) == 0

        guard.primary = Dawdling()  # now the primary loops without placing anything
        job = svc.submit(JobRequest([PY, "-c", "pass"], gpus=1))
        until(svc, lambda: svc.job_status(job.id)["state"] == "done")
        alloc = next(r for r in svc.audit(job=job.id) if r.event is AuditEvent.ALLOCATION)
        assert alloc.policy == "fifo"  # the fallback heuristic placed it
        loops = [r for r in svc.audit() if r.event is AuditEvent.FALLBACK and r.reason == "decision-loop"]
        assert loops and "64 decisions without a placement while job" in loops[0].extra["detail"]
        assert svc.info()["fallbacks_by_reason"].get("decision-loop", 0) >= 1
