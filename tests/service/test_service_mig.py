"""MIG reconfiguration by the live service: applied when safe, refused when not, a backend error audited."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlsched.cluster.decisions import Decision, Reconfigure
from rlsched.cluster.model import ClusterState
from rlsched.runtime.audit import AuditEvent, AuditRecord
from rlsched.runtime.sim_backend import read_fleet
from rlsched.service.service import SchedulerService, SubmitRequest
from tests.service import service, sleeper, until

NODE = "gpu-h100-01"
TARGET = ("7g.80gb",)


def reconfigure_first(svc: SchedulerService, position: int, layout: tuple[str, ...] = TARGET) -> None:
    """Make the served (primary) policy ask to re-split GPU ``position`` of the MIG node, then decide as before."""
    guard = svc._guard
    assert guard is not None and guard.primary is not None
    primary = guard.primary
    orig = primary.decide

    def decide(state: ClusterState) -> Iterator[Decision]:
        node = state.nodes.get(NODE)
        if node is not None and sorted(node.gpus[position].layout()) != sorted(layout):
            yield Reconfigure(NODE, position, layout)
        yield from orig(state)

    primary.decide = decide  # type: ignore[method-assign]


def fleet_gpu(tmp_path: Path, uuid: str) -> dict[str, Any]:
    data = read_fleet(tmp_path / "fleet.json")
    return next(g for n in data["nodes"] for g in n["gpus"] if g["uuid"] == uuid)


def mig_records(svc: SchedulerService) -> list[AuditRecord]:
    return [r for r in svc.audit() if r.event is AuditEvent.MIG_RECONFIGURATION]


def gpu_uuid(svc: SchedulerService, position: int) -> str:
    return next(g.uuid for n in svc.backend.inventory() if n.hostname == NODE for g in n.gpus
                if g.index == position)


def test_reconfigure_of_an_idle_gpu_is_applied_and_audited(tmp_path: Path) -> None:
    with service(tmp_path, grace_s=0.3) as svc:
        uuid = gpu_uuid(svc, 1)
        old_devices = {d["uuid"] for d in fleet_gpu(tmp_path, uuid)["mig_devices"]}
        reconfigure_first(svc, 1)
        trigger = svc.submit(SubmitRequest(sleeper(), gpus=1))  # a pass needs something to schedule
        until(svc, lambda: len(mig_records(svc)) == 1 and svc.job_status(trigger.id)["state"] == "running")
        gpu = fleet_gpu(tmp_path, uuid)
        assert [d["profile"] for d in gpu["mig_devices"]] == ["7g.80gb"]
        (rec,) = mig_records(svc)
        assert rec.gpus == (uuid,) and rec.extra["applied"] is True
        assert rec.extra["old_layout"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
        assert rec.extra["new_layout"] == {"7g.80gb": 1}
        assert rec.policy
        decisions = [d for d in svc.store.decisions() if d["kind"] == "reconfigure"]
        assert decisions and decisions[-1]["applied"]
        job = svc.submit(SubmitRequest(sleeper(), mig="7g.80gb"))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        (dev,) = svc.job_status(job.id)["devices"]
        new_devices = {d["uuid"] for d in fleet_gpu(tmp_path, uuid)["mig_devices"]}
        assert dev in new_devices and dev not in old_devices
        for _ in range(3):
            svc.tick()
        assert len(mig_records(svc)) == 1  # done once: the layout is now the policy's


def test_reconfigure_of_a_busy_gpu_is_refused_and_the_job_is_unaffected(tmp_path: Path) -> None:
    with service(tmp_path, grace_s=0.3) as svc:
        job = svc.submit(SubmitRequest(sleeper(), mig="3g.40gb"))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        (dev,) = svc.job_status(job.id)["devices"]
        ref = svc._current_view().devices[dev]
        before = fleet_gpu(tmp_path, ref.gpu_uuid)["mig_devices"]
        reconfigure_first(svc, ref.position)
        other = svc.submit(SubmitRequest(sleeper(), gpus=1))
        until(svc, lambda: svc.job_status(other.id)["state"] == "running")
        for _ in range(3):
            svc.tick()
        assert fleet_gpu(tmp_path, ref.gpu_uuid)["mig_devices"] == before
        assert not [r for r in mig_records(svc) if r.extra.get("applied")]
        refused = [r for r in svc.audit() if r.event is AuditEvent.FALLBACK and r.reason == "illegal-action"]
        assert refused and "in use" in refused[0].extra.get("detail", str(refused[0].extra))
        st = svc.job_status(job.id)
        assert st["state"] == "running" and st["devices"] == [dev] and st["attempts"] == 1


def test_reconfigure_the_service_itself_refuses_is_audited(tmp_path: Path) -> None:
    """Without the guard (fallback-only), the service's own feasibility check refuses and audits it."""
    with service(tmp_path, grace_s=0.3, fallback_only=True) as svc:
        job = svc.submit(SubmitRequest(sleeper(), mig="3g.40gb"))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        (dev,) = svc.job_status(job.id)["devices"]
        ref = svc._current_view().devices[dev]
        orig = svc._sched.decide

        def decide(state: ClusterState) -> Iterator[Decision]:
            yield Reconfigure(NODE, ref.position, TARGET)
            yield from orig(state)

        svc._sched.decide = decide  # type: ignore[method-assign]
        other = svc.submit(SubmitRequest(sleeper(), gpus=1))
        until(svc, lambda: svc.job_status(other.id)["state"] == "running")
        (rec,) = mig_records(svc)
        assert rec.extra["applied"] is False and rec.reason.startswith("refused: illegal")
        assert rec.gpus == (ref.gpu_uuid,)
        assert svc.job_status(job.id)["devices"] == [dev]


def test_backend_error_is_audited_and_the_loop_continues(tmp_path: Path) -> None:
    with service(tmp_path, grace_s=0.3) as svc:
        uuid = gpu_uuid(svc, 1)
        svc.backend.inject_fault(uuid, "fail_set_layout")  # type: ignore[attr-defined]
        reconfigure_first(svc, 1)
        trigger = svc.submit(SubmitRequest(sleeper(), gpus=1))
        until(svc, lambda: any(not r.extra["applied"] for r in mig_records(svc))
              and svc.job_status(trigger.id)["state"] == "running")
        failed = next(r for r in mig_records(svc) if not r.extra["applied"])
        assert failed.reason.startswith("failed: BackendError") and "fail_set_layout" in failed.extra["error"]
        assert failed.extra["old_layout"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
        # The loop goes on: the next pass retries (the fault was one-shot) and MIG work runs.
        until(svc, lambda: any(r.extra["applied"] for r in mig_records(svc)))
        job = svc.submit(SubmitRequest(sleeper(), mig="7g.80gb"))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        assert not any(r.reason.startswith("loop-error") for r in svc.audit())
