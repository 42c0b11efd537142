"""GPU health: unhealthy GPUs get no work and their jobs are requeued; errors never stop the loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.backend import BackendError
from rlsched.runtime.job_request import JobRequest
from tests.service import service, set_healthy, sleeper, until


class Wrapped:
    """A backend wrapper adding health events or failures to the simulated backend."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = "wrapped"
        self.events: list[tuple[str, str]] = []
        self.fail = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def inventory(self) -> list[Any]:
        if self.fail:
            raise BackendError("NVML: GPU is lost")
        return list(self.inner.inventory())

    def health_events(self) -> list[tuple[str, str]]:
        return list(self.events)


def test_unhealthy_gpu_requeues_its_job_and_gets_no_new_work(tmp_path: Path) -> None:
    with service(tmp_path, grace_s=0.3) as svc:
        job = svc.submit(JobRequest(sleeper(), gpus=1))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        (bad,) = svc.job_status(job.id)["devices"]
        set_healthy(tmp_path / "fleet.json", bad, False)
        until(svc, lambda: svc.job_status(job.id)["attempts"] == 2 and svc.job_status(job.id)["state"] == "running")
        st = svc.job_status(job.id)
        assert st["devices"] != [bad]
        pre = [r for r in svc.audit(job=job.id) if r.event is AuditEvent.PREEMPTION]
        assert pre and "unhealthy" in pre[0].reason and pre[0].gpus == (bad,)
        assert any(r.extra.get("stage") == "requeued" for r in pre)
        # Fill every healthy GPU: the next job waits rather than using the unhealthy one.
        filler = svc.submit(JobRequest(sleeper(), gpus=2))
        until(svc, lambda: svc.job_status(filler.id)["state"] == "running")
        waiting = svc.submit(JobRequest(sleeper(), gpus=1))
        for _ in range(3):
            svc.tick()
        st = svc.job_status(waiting.id)
        assert st["state"] == "queued" and st["reason"].startswith("GPU unhealthy")
        assert svc.info()["unhealthy_gpus"] == {bad: "reported unhealthy by the backend"}
        set_healthy(tmp_path / "fleet.json", bad, True)
        until(svc, lambda: svc.job_status(waiting.id)["state"] == "running")
        assert svc.job_status(waiting.id)["devices"] == [bad]


def test_health_event_closes_a_mig_gpu(tmp_path: Path) -> None:
    with service(tmp_path, grace_s=0.3) as svc:
        svc.inventory.backend = Wrapped(svc.inventory.backend)  # type: ignore[assignment]
        job = svc.submit(JobRequest(sleeper(), mig="3g.40gb"))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        (dev,) = svc.job_status(job.id)["devices"]
        gpu = svc.scheduling.current_view().devices[dev].gpu_uuid
        svc.inventory.backend.events.append((gpu, "Xid 79: GPU has fallen off the bus"))  # type: ignore[attr-defined]
        until(svc, lambda: svc.job_status(job.id)["attempts"] == 2 and svc.job_status(job.id)["state"] == "running")
        (dev2,) = svc.job_status(job.id)["devices"]
        assert svc.scheduling.current_view().devices[dev2].gpu_uuid != gpu
        assert "Xid 79" in svc.info()["unhealthy_gpus"][gpu]


def test_backend_and_policy_errors_do_not_stop_the_loop(tmp_path: Path) -> None:
    with service(tmp_path) as svc:
        svc.inventory.backend = Wrapped(svc.inventory.backend)  # type: ignore[assignment]
        svc.tick()
        svc.inventory.backend.fail = True  # type: ignore[attr-defined]
        job = svc.submit(JobRequest(sleeper(), gpus=1))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")  # the last inventory is kept
        svc.inventory.backend.fail = False  # type: ignore[attr-defined]

        def boom(state: Any) -> Any:
            raise RuntimeError("policy bug")

        guard = svc.policy.guard
        assert guard is not None
        guard.fallback.decide = boom  # type: ignore[method-assign]
        guard.primary.decide = boom  # type: ignore[union-attr, method-assign]
        other = svc.submit(JobRequest(sleeper(), gpus=1))
        svc.tick()
        svc.tick()
        assert svc.job_status(other.id)["state"] == "queued"
        text = generate_latest(svc.registry).decode()
        assert 'rlsched_loop_errors_total{stage="inventory"}' in text
        assert 'rlsched_loop_errors_total{stage="schedule"}' in text
        assert 'rlsched_fallbacks_total{reason="inference-error"}' in text
        assert any(r.reason == "loop-error:schedule" for r in svc.audit())
