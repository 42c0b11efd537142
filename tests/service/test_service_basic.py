"""Submit, run, finish, cancel, pending reasons, admission and quotas, metrics, reload."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.job_request import JobRequest
from rlsched.runtime.store import JobState, UnknownJobError
from rlsched.service.admission import AdmissionError
from rlsched.service.config import ServiceConfig, ServiceMode, default_state_dir
from rlsched.spec.model import SpecError
from tests.service import PY, device_overlaps, env_writer, service, sleeper, until, write_spec


def test_default_state_dir_is_beside_the_spec(tmp_path: Path) -> None:
    assert default_state_dir(tmp_path / "conf" / "pool.hcl") == tmp_path / "conf" / ".rlsched-service" / "pool"


def test_config_rejects_nonsense(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ServiceConfig([tmp_path / "p.hcl"], tmp_path, tick_s=0)
    with pytest.raises(ValueError):
        ServiceConfig([tmp_path / "p.hcl"], tmp_path, mode="both")  # type: ignore[arg-type]
    assert ServiceConfig([tmp_path / "p.hcl"], tmp_path, mode="shadow").mode is ServiceMode.SHADOW  # type: ignore[arg-type]
    cfg = ServiceConfig([tmp_path / "p.hcl"], tmp_path, variables={"n": 2, "s": "x", "b": True, "l": [1, 2]})
    assert cfg.var_args() == ["n=2", "s=x", "b=true", "l=[1, 2]"]


def test_serve_argv_gives_the_mode_as_its_flag(tmp_path: Path) -> None:
    from rlsched.service.daemon import serve_argv

    flags = {"--shadow", "--fallback-only"}
    for mode, want in ((ServiceMode.POLICY, set()), (ServiceMode.SHADOW, {"--shadow"}),
                       (ServiceMode.FALLBACK_ONLY, {"--fallback-only"})):
        argv = serve_argv(ServiceConfig([tmp_path / "p.hcl"], tmp_path, mode=mode), "127.0.0.1:0")
        assert flags.intersection(argv) == want


def test_submit_runs_with_exactly_the_allocated_gpu_uuids(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    with service(tmp_path) as svc:
        rec = svc.submit(JobRequest(env_writer(out), gpus=2, user="alice"))
        assert rec.state is JobState.QUEUED
        until(svc, lambda: svc.job_status(rec.id)["state"] == "done")
        st = svc.job_status(rec.id)
        devices = st["allocation"]["devices"]
        assert len(devices) == 2 and all(d.startswith("GPU-") for d in devices)
        assert st["allocation"]["pool"] == "onprem" and st["allocation"]["node"] == "gpu-a100-01"
        assert out.read_text() == ",".join(devices) + "|" + ",".join(devices)
        assert st["exit_code"] == 0 and st["started_at"] and st["finished_at"]
        assert svc.log_path(rec.id).exists()
        events = [r.event for r in svc.audit(job=rec.id)]
        assert events == [AuditEvent.SUBMISSION, AuditEvent.ALLOCATION, AuditEvent.COMPLETION]
        alloc = svc.audit(job=rec.id)[1]
        assert alloc.policy == "weighted-priority" and set(alloc.gpus) == set(devices)
        assert [d["kind"] for d in svc.store.decisions()] == ["place"]
        assert svc.store.check_invariants() == []


def test_mig_job_gets_its_mig_instance_uuid(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    with service(tmp_path) as svc:
        rec = svc.submit(JobRequest(env_writer(out), mig="3g.40gb"))
        until(svc, lambda: svc.job_status(rec.id)["state"] == "done")
        st = svc.job_status(rec.id)
        (dev,) = st["devices"]
        assert dev.startswith("MIG-") and st["allocation"]["pool"] == "mig"
        assert st["allocation"]["slice_start"] is not None
        assert out.read_text() == f"{dev}|{dev}"
        inst = {ref.uuid: ref for ref in svc.scheduling.current_view().devices.values()}
        assert inst[dev].profile == "3g.40gb"


def test_failed_job_keeps_its_exit_code(tmp_path: Path) -> None:
    with service(tmp_path) as svc:
        rec = svc.submit(JobRequest([PY, "-c", "import sys; sys.exit(7)"], gpus=1))
        until(svc, lambda: svc.job_status(rec.id)["state"] == "failed")
        assert svc.job_status(rec.id)["exit_code"] == 7
        missing = svc.submit(JobRequest(["/nonexistent/program"], gpus=1))
        until(svc, lambda: svc.job_status(missing.id)["state"] == "failed")
        assert svc.job_status(missing.id)["exit_code"] == 127


def test_cancel_queued_and_running_jobs(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    stubborn = [PY, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"open({str(ready)!r}, 'w').close(); time.sleep(60)"]
    with service(tmp_path, grace_s=0.3) as svc:
        running = svc.submit(JobRequest(stubborn, gpus=4))
        queued = svc.submit(JobRequest(sleeper(), gpus=4))
        until(svc, lambda: ready.exists())
        assert svc.job_status(queued.id)["state"] == "queued"
        assert svc.cancel(queued.id) is JobState.CANCELLED
        assert svc.cancel(running.id) is JobState.RUNNING  # stopping: SIGTERM sent, GPUs still held
        assert svc.job_status(running.id)["reason"] == "stopping (cancel requested)"
        t0 = time.monotonic()
        until(svc, lambda: svc.job_status(running.id)["state"] == "cancelled")
        assert time.monotonic() - t0 >= 0.25  # it ignored SIGTERM: SIGKILL came after the grace period
        st = svc.job_status(running.id)
        assert st["exit_code"] == -9
        assert svc.cancel(running.id) is JobState.CANCELLED  # idempotent
        with pytest.raises(UnknownJobError):
            svc.cancel("j-nope")
        with pytest.raises(UnknownJobError):
            svc.job_status("j-nope")
        assert svc.store.check_invariants() == []


def test_pending_reason_and_position(tmp_path: Path) -> None:
    with service(tmp_path) as svc:
        big = svc.submit(JobRequest(sleeper(), gpus=4))
        until(svc, lambda: svc.job_status(big.id)["state"] == "running")
        low = svc.submit(JobRequest(sleeper(), gpus=2, priority=1))
        high = svc.submit(JobRequest(sleeper(), gpus=1, priority=5))
        svc.tick()
        st = svc.job_status(low.id)
        assert st["state"] == "queued"
        assert st["reason"] == "waiting for 2 free A100-80GB GPUs in pool onprem (0 free)"
        assert st["position"] == 2 and svc.job_status(high.id)["position"] == 1
        listed = {j["id"]: j for j in svc.jobs(["queued"])}
        assert set(listed) == {low.id, high.id} and listed[low.id]["position"] == 2
        assert [j["id"] for j in svc.jobs()] == [big.id, low.id, high.id]
        svc.cancel(big.id)
        until(svc, lambda: svc.job_status(high.id)["state"] == "running"
              and svc.job_status(low.id)["state"] == "running")
        assert device_overlaps(svc) == []


def test_admission_refuses_bad_requests(tmp_path: Path) -> None:
    with service(tmp_path) as svc:
        cases = [
            (JobRequest([], gpus=1), "argv"),
            (JobRequest(sleeper(), gpus=0), "gpus"),
            (JobRequest(sleeper(), gpus=8), "largest node has 4"),
            (JobRequest(sleeper(), gpus=1, mig="1g.10gb"), "not both"),
            (JobRequest(sleeper(), mig="5g.50gb"), "unknown MIG profile"),
            (JobRequest(sleeper(), mig="1g.20gb"), "smallest such profile"),
            (JobRequest(sleeper(), mig="4g.40gb"), "no GPU in the fleet has a 4g.40gb"),
            (JobRequest(sleeper(), gpus=1, pool="nowhere"), "unknown pool"),
            (JobRequest(sleeper(), mig="1g.10gb", pool="onprem"), "does not use MIG"),
            (JobRequest(sleeper(), gpus=1, deadline=1.0), "deadline"),
            (JobRequest(sleeper(), gpu_milli=500), "no gpu_milli"),
            (JobRequest(sleeper(), gpu_models=("H100",)), "no gpu_models"),
        ]
        for req, words in cases:
            with pytest.raises(AdmissionError, match=words) as exc:
                svc.submit(req)
            assert exc.value.kind == "invalid"
        assert svc.store.jobs() == []
        a = svc.submit(JobRequest(sleeper(), gpus=1, idempotency_key="k1"))
        assert svc.submit(JobRequest(sleeper(), gpus=1, idempotency_key="k1")).id == a.id
        with pytest.raises(AdmissionError) as exc:
            svc.submit(JobRequest(sleeper(), gpus=2, idempotency_key="k1"))
        assert exc.value.kind == "conflict"


def test_quota_refusal_and_quota_pending_reason(tmp_path: Path) -> None:
    with service(tmp_path) as svc:
        with pytest.raises(AdmissionError, match="quota team_a allows team-a in pool onprem at most 2 GPUs") as exc:
            svc.submit(JobRequest(sleeper(), gpus=3, user="team-a"))
        assert exc.value.kind == "quota"
        with pytest.raises(AdmissionError, match=r"quota interns allows group:interns in pool mig no 3g\.40gb"):
            svc.submit(JobRequest(sleeper(), mig="3g.40gb", user="group:interns"))
        first = svc.submit(JobRequest(sleeper(), gpus=2, user="team-a"))
        second = svc.submit(JobRequest(sleeper(), gpus=1, user="team-a"))
        other = svc.submit(JobRequest(sleeper(), gpus=1, user="bob"))
        s1 = svc.submit(JobRequest(sleeper(), mig="1g.10gb", user="group:interns"))
        s2 = svc.submit(JobRequest(sleeper(), mig="1g.10gb", user="group:interns"))
        until(svc, lambda: svc.job_status(other.id)["state"] == "running")
        for _ in range(3):
            svc.tick()
        assert svc.job_status(first.id)["state"] == "running"
        assert svc.job_status(s1.id)["state"] == "running"
        st = svc.job_status(second.id)
        assert st["state"] == "queued" and st["reason"] == "quota team_a: 2/2 GPUs in use"
        assert svc.job_status(s2.id)["reason"] == "quota interns: 1/1 1g.10gb instances in use"
        svc.cancel(first.id)
        until(svc, lambda: svc.job_status(second.id)["state"] == "running")


def test_metrics_exposition_has_every_family(tmp_path: Path) -> None:
    class Telemetry:
        def __init__(self, inner: object) -> None:
            self.inner = inner
            self.name = "telemetry-test"

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def telemetry(self) -> list[dict[str, object]]:
            return [{"uuid": "GPU-x", "utilization_gpu": None, "memory_used_mib": 1024, "temperature_c": 55,
                     "power_w": 210.5, "ecc_double_bit": 0, "processes": 1}]

    with service(tmp_path) as svc:
        svc.inventory.backend = Telemetry(svc.inventory.backend)  # type: ignore[assignment]
        rec = svc.submit(JobRequest(sleeper(), mig="2g.20gb"))
        svc.submit(JobRequest(sleeper(), gpus=1))
        until(svc, lambda: svc.job_status(rec.id)["state"] == "running")
        text = generate_latest(svc.registry).decode()
        for family in ("rlsched_queue_length", "rlsched_running_jobs", "rlsched_decisions_total",
                       "rlsched_fallbacks_total", "rlsched_refused_actions_total",
                       "rlsched_decision_latency_seconds_bucket", "rlsched_allocated_gpus",
                       "rlsched_allocated_mig_slices", "rlsched_submissions_total", "rlsched_loop_errors_total",
                       "rlsched_audit_write_errors_total", "rlsched_gpu_memory_used_mib",
                       "rlsched_gpu_temperature_celsius", "rlsched_gpu_power_watts",
                       "rlsched_gpu_utilization_percent"):
            assert family in text, family
        assert 'rlsched_allocated_mig_slices{pool="mig",profile="2g.20gb"} 1.0' in text
        assert 'rlsched_allocated_gpus{pool="onprem"} 1.0' in text
        assert 'rlsched_running_jobs 2.0' in text
        assert 'rlsched_decisions_total{policy="primary"} 2.0' in text
        assert 'rlsched_submissions_total{outcome="accepted"} 2.0' in text
        assert 'rlsched_gpu_temperature_celsius{gpu="GPU-x"} 55.0' in text
        assert 'rlsched_gpu_utilization_percent{gpu="GPU-x"}' not in text  # None: not reported


def test_info_and_reload_keep_jobs(tmp_path: Path) -> None:
    with service(tmp_path) as svc:
        run = svc.submit(JobRequest(sleeper(), gpus=4))
        until(svc, lambda: svc.job_status(run.id)["state"] == "running")
        wait = svc.submit(JobRequest(sleeper(), gpus=1))
        svc.tick()
        info = svc.info()
        assert info["policy"] == "default" and info["scheduler"] == "weighted-priority"
        assert info["mode"] == "policy" and info["breaker"] == "closed"
        assert info["queue_length"] == 1 and info["running"] == 1
        assert info["pools"]["onprem"]["gpus_total"] == 4 and info["pools"]["onprem"]["gpus_free"] == 0
        assert info["pools"]["mig"]["mig_instances"]["1g.10gb"] == {"total": 4, "free": 4, "allocated": 0}
        spec = write_spec(tmp_path, scheduler="best_fit")
        after = svc.reload([spec])
        assert after["scheduler"] == "best-fit"
        switch = [r for r in svc.audit() if r.event is AuditEvent.POLICY_SWITCH and r.reason == "reload"]
        assert switch and switch[-1].extra["previous"].startswith("guarded:weighted-priority")
        assert svc.job_status(run.id)["state"] == "running" and svc.job_status(wait.id)["state"] == "queued"
        (tmp_path / "bad.hcl").write_text('pool "x" { gpu_model = "NoSuchGPU" nodes = ["a"] }\n')
        with pytest.raises(SpecError):
            svc.reload([tmp_path / "bad.hcl"])
        assert svc.info()["scheduler"] == "best-fit"
        svc.cancel(run.id)
        until(svc, lambda: svc.job_status(wait.id)["state"] == "running")
        assert svc.job_status(wait.id)["attempts"] == 1


def test_concurrent_submissions_are_group_committed_and_mirrored(tmp_path: Path) -> None:
    import threading

    with service(tmp_path) as svc:
        ids: list[str] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            for i in range(25):
                rec = svc.submit(JobRequest(["true"], gpus=1, user=f"u{k}", idempotency_key=f"k{k}-{i % 20}"))
                with lock:
                    ids.append(rec.id)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ids) == 200 and len(set(ids)) == 160  # 5 idempotent retries per client
        stored = {r.id for r in svc.store.jobs()}
        assert stored == set(ids)
        assert svc.info()["jobs"] == svc.store.counts()
        until(svc, lambda: svc.store.counts()["done"] == 160, timeout=60)
        assert svc.info()["jobs"] == svc.store.counts() and svc.mirror.queued == {} and svc.mirror.holding == {}
        assert svc.store.check_invariants() == []


def test_reads_of_finished_jobs_do_not_wait_for_the_service_lock(tmp_path: Path) -> None:
    """A listing reads the store without the service lock: with the lock held (as by a long scheduling pass),
    finished jobs are still listed and shown; the queued ones of a page wait only to be explained."""
    import threading

    with service(tmp_path) as svc:
        done = [svc.submit(JobRequest([PY, "-c", "pass"], gpus=1)) for _ in range(3)]
        until(svc, lambda: all(svc.job_status(j.id)["state"] == "done" for j in done), timeout=120)
        queued = svc.submit(JobRequest(sleeper(), gpus=1, pool="onprem", priority=3))
        held = threading.Event()
        release = threading.Event()

        def hold() -> None:
            with svc.lock:
                held.set()
                release.wait(120)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert held.wait(60)
            results: dict[str, object] = {}

            def read() -> None:
                results["page"] = svc.jobs(["done"], limit=2)
                results["one"] = svc.job_status(done[0].id)

            reader = threading.Thread(target=read)
            reader.start()
            reader.join(120)
            assert not reader.is_alive() and "page" in results, "a listing of finished jobs waited for the lock"
            page = results["page"]
            assert isinstance(page, list) and [j["id"] for j in page] == [d.id for d in done[1:]]
            assert isinstance(results["one"], dict) and results["one"]["state"] == "done"
        finally:
            release.set()
            holder.join(60)
        listed = svc.jobs(["queued"], limit=10)
        assert [j["id"] for j in listed] == [queued.id] and listed[0]["position"] == 1 and listed[0]["reason"]
        assert [j["seq"] for j in svc.jobs()] == sorted(j["seq"] for j in svc.jobs())


def test_retention_removes_old_finished_jobs_and_their_files(tmp_path: Path) -> None:
    with service(tmp_path, history_max_jobs=2, history_max_age_s=3600.0, retention_every_s=0.2) as svc:
        svc.start()  # the retention thread sweeps in the background
        done = [svc.submit(JobRequest([PY, "-c", "print('x')"], gpus=1)) for _ in range(5)]
        held = svc.submit(JobRequest(sleeper(), gpus=1))
        logs = svc.executor.log_dir
        # rows go in one transaction, then the mirror's counts, then the files: wait for all three
        until(
            None,
            lambda: {r.id for r in svc.store.jobs()} == {done[3].id, done[4].id, held.id}
            and not any(list(logs.glob(f"{j.id}.*")) for j in done[:3])
            and svc.info()["jobs"]["done"] == 2,
            timeout=120,
        )
        for j in done[:3]:
            assert not (logs / f"{j.id}.log").exists()
            assert not list(logs.glob(f"{j.id}.*"))
        assert (logs / f"{done[4].id}.log").exists()
        assert svc.info()["jobs"]["done"] == 2
        assert svc.job_status(held.id)["state"] in ("queued", "running")
        # by age: everything finished more than an hour before "now" goes
        out = svc.prune_history(now=svc.clock() + 7200.0)
        assert out["jobs"] == 2 and {r.id for r in svc.store.jobs()} == {held.id}
        assert svc.info()["jobs"]["done"] == 0


def test_reload_loads_the_spec_outside_the_scheduling_lock(tmp_path: Path) -> None:
    """However long a spec takes to load, scheduling and submissions do not wait for it (#17 item 9)."""
    import threading

    with service(tmp_path) as svc:
        loading, finish = threading.Event(), threading.Event()
        real_load = svc.policy.load

        def slow_load(paths: list[Path], policy: str | None) -> object:
            loading.set()
            finish.wait(120)  # a load that lasts until the test has looked
            return real_load(paths, policy)

        svc.policy.load = slow_load  # type: ignore[method-assign,assignment]
        spec = write_spec(tmp_path, scheduler="best_fit")
        out: dict[str, object] = {}
        reloader = threading.Thread(target=lambda: out.update(svc.reload([spec])))
        reloader.start()
        try:
            assert loading.wait(60)
            got = svc.lock.acquire(timeout=60)  # the old reload held it for the whole load: this timed out
            assert got, "reload held the scheduling lock while it loaded the spec"
            svc.lock.release()
            job = svc.submit(JobRequest(["true"], gpus=1))  # and a submission goes through meanwhile
            assert svc.job_status(job.id)["state"] in ("queued", "running", "done")
        finally:
            finish.set()
            reloader.join(120)
        assert out["scheduler"] == "best-fit"
