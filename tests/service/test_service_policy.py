"""Serving the declared policy: a broken model falls back; modes; many concurrent submissions."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.job_request import JobRequest
from rlsched.service.config import ServiceMode
from tests.service import PY, device_overlaps, service, until, write_spec


def test_corrupted_model_serves_the_heuristic_and_says_why(tmp_path: Path) -> None:
    model = tmp_path / "broken-model"
    model.mkdir()
    (model / "codec.json").write_text("{ not json")
    write_spec(tmp_path, scheduler="rl", model="broken-model")
    with service(tmp_path) as svc:
        info = svc.info()
        assert info["scheduler"] == "rl" and info["mode"] == "policy" and not info["primary_available"]
        job = svc.submit(JobRequest([PY, "-c", "pass"], gpus=1))
        until(svc, lambda: svc.job_status(job.id)["state"] == "done")
        fb = [r for r in svc.audit() if r.event is AuditEvent.FALLBACK]
        assert fb and fb[0].reason == "model-missing" and "codec.json" in fb[0].extra["detail"]
        alloc = next(r for r in svc.audit(job=job.id) if r.event is AuditEvent.ALLOCATION)
        assert alloc.policy == "fifo"
        assert svc.info()["fallbacks_by_reason"].get("model-missing", 0) >= 1


def test_missing_model_folder_never_raises(tmp_path: Path) -> None:
    write_spec(tmp_path, scheduler="rl", model="no-such-model")
    with service(tmp_path) as svc:
        job = svc.submit(JobRequest([PY, "-c", "pass"], gpus=1))
        until(svc, lambda: svc.job_status(job.id)["state"] == "done")
        fb = [r for r in svc.audit() if r.event is AuditEvent.FALLBACK]
        assert fb and fb[0].reason == "model-missing" and "not found" in fb[0].extra["detail"]


def test_fallback_only_and_shadow_modes(tmp_path: Path) -> None:
    with service(tmp_path, mode=ServiceMode.FALLBACK_ONLY) as svc:
        assert svc.info()["mode"] == "fallback-only"
        job = svc.submit(JobRequest([PY, "-c", "pass"], gpus=1))
        until(svc, lambda: svc.job_status(job.id)["state"] == "done")
        assert next(r for r in svc.audit(job=job.id) if r.event is AuditEvent.ALLOCATION).policy == "fifo"
    other = tmp_path / "shadow"
    other.mkdir()
    with service(other, mode=ServiceMode.SHADOW) as svc:
        assert svc.info()["mode"] == "shadow"
        job = svc.submit(JobRequest([PY, "-c", "pass"], gpus=1))
        until(svc, lambda: svc.job_status(job.id)["state"] == "done")
        assert any(r.event is AuditEvent.SHADOW for r in svc.audit())
        assert next(r for r in svc.audit(job=job.id) if r.event is AuditEvent.ALLOCATION).policy == "fifo"


def test_concurrent_submissions_never_share_a_device(tmp_path: Path) -> None:
    rng = random.Random(7)
    errors: list[BaseException] = []
    overlaps: list[str] = []
    with service(tmp_path, tick_s=0.01) as svc:
        svc.start()
        ids: list[str] = []
        lock = threading.Lock()

        def submitter(seed: int) -> None:
            r = random.Random(seed)
            try:
                for _ in range(5):
                    if r.random() < 0.5:
                        req = JobRequest([PY, "-c", "import time; time.sleep(0.1)"], gpus=r.choice([1, 2]))
                    else:
                        req = JobRequest([PY, "-c", "import time; time.sleep(0.1)"],
                                            mig=r.choice(["1g.10gb", "2g.20gb", "3g.40gb"]))
                    rec = svc.submit(req)
                    with lock:
                        ids.append(rec.id)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=submitter, args=(rng.random(),)) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120  # a generous ceiling: the loop ends as soon as all are done
        while True:
            overlaps += device_overlaps(svc)
            states = [svc.job_status(i)["state"] for i in list(ids)]
            if len(ids) == 20 and all(s == "done" for s in states):
                break
            assert time.monotonic() < deadline, f"not done: {states}"
            time.sleep(0.01)
        for t in threads:
            t.join()
        assert errors == [] and overlaps == []
        assert svc.store.check_invariants() == []
        assert all(svc.job_status(i)["attempts"] == 1 for i in ids)  # each launched exactly once
        assert svc.info()["loop_running"]


def test_a_served_model_runs_its_guard_and_long_job_preemption_but_not_node_consolidation(tmp_path: Path) -> None:
    """The live service does not scale pools, so consolidation - whose moves pay only when the node they
    empty is released - is left out of a served model's rules; the deadline guard stays."""
    import shutil

    import pytest

    pytest.importorskip("torch")
    from rlsched.policies.rules.consolidate import Consolidator
    from rlsched.policies.rules.deadline_guard import DeadlineGuard
    from rlsched.policies.rules.preempt_long import LongJobPreemption

    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "models" / "spot", tmp_path / "spot-model")
    assert (tmp_path / "spot-model" / "consolidate.json").exists()
    # long-job preemption needs no scale-down: a model carrying it is served with it
    (tmp_path / "spot-model" / "preempt_long.json").write_text('{"factor": 10}')
    write_spec(tmp_path, scheduler="rl", model="spot-model")
    with service(tmp_path) as svc:
        job = svc.submit(JobRequest([PY, "-c", "pass"], gpus=1))
        until(svc, lambda: svc.job_status(job.id)["state"] == "done")
        primary = svc.policy.guard.primary if svc.policy.guard is not None else None
        assert primary is not None, svc.info()
        rules = primary.rules  # type: ignore[attr-defined]
        assert any(isinstance(r, DeadlineGuard) for r in rules)
        assert any(isinstance(r, LongJobPreemption) for r in rules)
        assert not any(isinstance(r, Consolidator) for r in rules)
