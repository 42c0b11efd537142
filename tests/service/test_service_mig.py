"""MIG reconfiguration by the live service: applied when safe, refused when not, a backend error audited."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlsched.cluster.decisions import Decision, Reconfigure
from rlsched.cluster.model import ClusterState
from rlsched.runtime.audit import AuditEvent, AuditRecord
from rlsched.runtime.job_request import JobRequest
from rlsched.runtime.sim_backend import read_fleet
from rlsched.service.config import ServiceMode
from rlsched.service.service import SchedulerService
from tests.service import PY, kill_jobs, make_config, service, sleeper, until

NODE = "gpu-h100-01"
TARGET = ("7g.80gb",)


def reconfigure_first(svc: SchedulerService, position: int, layout: tuple[str, ...] = TARGET) -> None:
    """Make the served (primary) policy ask to re-split GPU ``position`` of the MIG node, then decide as before."""
    guard = svc.policy.guard
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
    """Outcome records (applied, refused, failed); an applied re-split also has an intent record first."""
    return [r for r in svc.audit() if r.event is AuditEvent.MIG_RECONFIGURATION and r.extra.get("phase") != "intent"]


def mig_intents(svc: SchedulerService) -> list[AuditRecord]:
    return [r for r in svc.audit() if r.event is AuditEvent.MIG_RECONFIGURATION and r.extra.get("phase") == "intent"]


def gpu_uuid(svc: SchedulerService, position: int) -> str:
    return next(g.uuid for n in svc.backend.inventory() if n.hostname == NODE for g in n.gpus
                if g.index == position)


def test_reconfigure_of_an_idle_gpu_is_applied_and_audited(tmp_path: Path) -> None:
    with service(tmp_path, grace_s=0.3) as svc:
        uuid = gpu_uuid(svc, 1)
        old_devices = {d["uuid"] for d in fleet_gpu(tmp_path, uuid)["mig_devices"]}
        reconfigure_first(svc, 1)
        trigger = svc.submit(JobRequest(sleeper(), gpus=1))  # a pass needs something to schedule
        until(svc, lambda: len(mig_records(svc)) == 1 and svc.job_status(trigger.id)["state"] == "running")
        gpu = fleet_gpu(tmp_path, uuid)
        assert [d["profile"] for d in gpu["mig_devices"]] == ["7g.80gb"]
        (rec,) = mig_records(svc)
        assert rec.gpus == (uuid,) and rec.extra["applied"] is True
        (intent,) = mig_intents(svc)  # committed with the pass, before the backend was called
        assert intent.id is not None and rec.id is not None and intent.id < rec.id
        assert intent.extra["intent"] == rec.extra["intent"] and rec.extra["phase"] == "done"
        assert rec.extra["old_layout"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
        assert rec.extra["new_layout"] == {"7g.80gb": 1}
        assert rec.policy
        decisions = [d for d in svc.store.decisions() if d["kind"] == "reconfigure"]
        assert decisions and decisions[-1]["applied"]
        job = svc.submit(JobRequest(sleeper(), mig="7g.80gb"))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        (dev,) = svc.job_status(job.id)["devices"]
        new_devices = {d["uuid"] for d in fleet_gpu(tmp_path, uuid)["mig_devices"]}
        assert dev in new_devices and dev not in old_devices
        for _ in range(3):
            svc.tick()
        assert len(mig_records(svc)) == 1  # done once: the layout is now the policy's


def test_reconfigure_of_a_busy_gpu_is_refused_and_the_job_is_unaffected(tmp_path: Path) -> None:
    with service(tmp_path, grace_s=0.3) as svc:
        job = svc.submit(JobRequest(sleeper(), mig="3g.40gb"))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        (dev,) = svc.job_status(job.id)["devices"]
        ref = svc.scheduling.current_view().devices[dev]
        before = fleet_gpu(tmp_path, ref.gpu_uuid)["mig_devices"]
        reconfigure_first(svc, ref.position)
        other = svc.submit(JobRequest(sleeper(), gpus=1))
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
    with service(tmp_path, grace_s=0.3, mode=ServiceMode.FALLBACK_ONLY) as svc:
        job = svc.submit(JobRequest(sleeper(), mig="3g.40gb"))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        (dev,) = svc.job_status(job.id)["devices"]
        ref = svc.scheduling.current_view().devices[dev]
        orig = svc.policy.sched.decide

        def decide(state: ClusterState) -> Iterator[Decision]:
            yield Reconfigure(NODE, ref.position, TARGET)
            yield from orig(state)

        svc.policy.sched.decide = decide  # type: ignore[method-assign]
        other = svc.submit(JobRequest(sleeper(), gpus=1))
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
        trigger = svc.submit(JobRequest(sleeper(), gpus=1))
        until(svc, lambda: any(not r.extra["applied"] for r in mig_records(svc))
              and svc.job_status(trigger.id)["state"] == "running")
        failed = next(r for r in mig_records(svc) if not r.extra["applied"])
        assert failed.reason.startswith("failed: BackendError") and "fail_set_layout" in failed.extra["error"]
        assert failed.extra["old_layout"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
        # The loop goes on: the next pass retries (the fault was one-shot) and MIG work runs.
        until(svc, lambda: any(r.extra["applied"] for r in mig_records(svc)))
        job = svc.submit(JobRequest(sleeper(), mig="7g.80gb"))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        assert not any(r.reason.startswith("loop-error") for r in svc.audit())


_CRASH = """
import sys, time
from pathlib import Path
from rlsched.cluster.decisions import Reconfigure
from rlsched.service.config import ServiceConfig
from rlsched.runtime.job_request import JobRequest
from rlsched.service.service import SchedulerService
cfg = ServiceConfig([Path(sys.argv[1])], Path(sys.argv[2]), backend=sys.argv[3], tick_s=0.02)
mode = sys.argv[4]
svc = SchedulerService(cfg)
primary = svc.policy.guard.primary
orig = primary.decide
def decide(state):
    node = state.nodes.get("gpu-h100-01")
    if node is not None and sorted(node.gpus[1].layout()) != ["7g.80gb"]:
        yield Reconfigure("gpu-h100-01", 1, ("7g.80gb",))
    yield from orig(state)
primary.decide = decide
real = svc.backend.set_mig_layout
def stalls(host, uuid, layout):
    if mode == "after":
        real(host, uuid, layout)
    print("in set_mig_layout", flush=True)
    time.sleep(60)
svc.backend.set_mig_layout = stalls
svc.submit(JobRequest([sys.executable, "-c", "import time; time.sleep(60)"], gpus=1))
svc.start()
time.sleep(60)
"""


@pytest.mark.parametrize("mode", ["before", "after"])
def test_kill_9_during_a_re_split_is_closed_from_the_real_layout_on_restart(tmp_path: Path, mode: str) -> None:
    """SIGKILL while the backend re-splits: the intent is committed, the outcome is not; recover() writes it."""
    cfg = make_config(tmp_path)
    proc = subprocess.Popen([PY, "-c", _CRASH, str(cfg.spec_paths[0]), str(cfg.state_dir), str(cfg.backend), mode],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "in set_mig_layout"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    svc = SchedulerService(cfg)
    try:
        (intent,) = mig_intents(svc)
        assert mig_records(svc) == []  # the kill came between the two records
        svc.recover()
        assert svc.recovered["mig_intents"] == 1
        (done,) = mig_records(svc)
        assert done.extra["intent"] == intent.extra["intent"] and done.extra["recovered"] is True
        assert done.extra["applied"] is (mode == "after")
        profiles = sorted(d["profile"] for d in fleet_gpu(tmp_path, intent.gpus[0])["mig_devices"])
        assert profiles == (["7g.80gb"] if mode == "after" else ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
        assert done.extra["found_layout"] == (intent.extra["new_layout"] if mode == "after"
                                              else intent.extra["old_layout"])
        svc.recover()  # safe twice: nothing left to close
        assert len(mig_records(svc)) == 1
    finally:
        kill_jobs(svc)
        svc.store.close()


def test_a_whole_gpu_on_a_mig_only_pool_is_refused_at_submit(tmp_path: Path) -> None:
    from rlsched.service.admission import AdmissionError

    with service(tmp_path) as svc:
        with pytest.raises(AdmissionError, match=r"no pool can ever run it: a whole GPU was asked for, but pool mig "
                                                 r"is split into MIG instances \(1g.10gb, 2g.20gb, 3g.40gb\) and has "
                                                 r"no 7g.80gb instance"):
            svc.submit(JobRequest(sleeper(), gpus=1, pool="mig"))
        # the same request anywhere goes to the whole-GPU pool; a MIG instance of the pool is accepted
        anywhere = svc.submit(JobRequest(sleeper(1), gpus=1))
        sliced = svc.submit(JobRequest(sleeper(1), mig="3g.40gb", pool="mig"))
        assert {svc.job_status(j.id)["state"] for j in (anywhere, sliced)} == {"queued"}
        assert svc.store.counts()["queued"] == 2
