"""Crash recovery: a service killed with SIGKILL is replaced; nothing is lost or launched twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlsched.runtime.job_request import JobRequest
from rlsched.runtime.store import Allocation, JobState
from rlsched.service.service import SchedulerService
from tests.service import PY, kill_jobs, make_config, sleeper, until

_SERVE = """
import json, sys, time
from pathlib import Path
from rlsched.service.config import ServiceConfig
from rlsched.runtime.job_request import JobRequest
from rlsched.service.service import SchedulerService
cfg = ServiceConfig([Path(sys.argv[1])], Path(sys.argv[2]), backend=sys.argv[3], tick_s=0.02)
svc = SchedulerService(cfg)
py = sys.executable
long = svc.submit(JobRequest([py, "-c", "import time; time.sleep(60)"], gpus=1))
short = svc.submit(JobRequest([py, "-c", "import sys, time; time.sleep(0.8); sys.exit(3)"], mig="1g.10gb"))
svc.start()
while not all(svc.job_status(j.id)["pid"] for j in (long, short)):
    time.sleep(0.01)
print(json.dumps([long.id, short.id]), flush=True)
time.sleep(60)
"""


def _alive(pid: int | None) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[1][:1] not in ("Z", "X")


def test_kill_9_then_restart_adopts_running_jobs_and_records_exits(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(cfg.spec_paths[0]), str(cfg.state_dir),
                             str(cfg.backend)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        long_id, short_id = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    # The short job ends while no service runs; its wrapper records the exit status.
    until(None, lambda: any(cfg.log_dir.glob(f"{short_id}.*.exit.json")), timeout=120)
    svc = SchedulerService(cfg)
    short_pid = svc.store.get(short_id).pid  # type: ignore[union-attr]
    until(None, lambda: not _alive(short_pid), timeout=120)  # its wrapper has exited too
    try:
        before = svc.store.get(long_id)
        assert before is not None and before.state is JobState.RUNNING and before.pid
        svc.recover()
        assert svc.recovered == {"adopted": 1, "finished": 1, "requeued": 0, "mig_intents": 0}
        after = svc.store.get(long_id)
        assert after is not None and after.state is JobState.RUNNING
        assert after.pid == before.pid and after.attempts == 1  # adopted, never relaunched
        short = svc.job_status(short_id)
        assert short["state"] == "failed" and short["exit_code"] == 3
        svc.tick()
        assert svc.store.get(long_id).attempts == 1  # type: ignore[union-attr]
        # The adopted process is not our child, yet a cancel still stops it and records the end.
        svc.config.grace_s = 0.3
        svc.cancel(long_id)
        until(svc, lambda: svc.job_status(long_id)["state"] == "cancelled")
        assert svc.store.check_invariants() == []
    finally:
        kill_jobs(svc)
        svc.store.close()


def test_restart_requeues_vanished_jobs_and_finishes_preemptions(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    svc = SchedulerService(cfg)
    try:
        gone = svc.submit(JobRequest(sleeper(), gpus=1))
        orphan = svc.submit(JobRequest(sleeper(), gpus=1))
        until(svc, lambda: svc.job_status(gone.id)["state"] == "running"
              and svc.job_status(orphan.id)["state"] == "running")
        # "gone": its process and wrapper die without an exit file (SIGKILL of the whole group).
        pid = svc.job_status(gone.id)["pid"]
        os.killpg(pid, signal.SIGKILL)
        until(None, lambda: not Path(f"/proc/{pid}").exists() or
              Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"))
        # A crash between mark_running and the launch: running in the store, no pid, no process.
        never = svc.submit(JobRequest(sleeper(), gpus=1))
        rec = svc.store.get(never.id)
        assert rec is not None
        svc.store.mark_running(never.id, Allocation("gpu-a100-01", (svc.scheduling.current_view().state.nodes[
            "gpu-a100-01"].gpus[3].uuid,), "onprem", (3,)), None, None)
        # "orphan" is preempted (stop requested) when the service dies.
        svc.store.preempt(orphan.id, "test")
        svc2 = SchedulerService(cfg)  # the first object is simply dropped, as after kill -9
        svc2.config.grace_s = 0.2
        svc2.recover()
        assert svc2.job_status(gone.id)["state"] == "queued"
        assert "vanished" in svc2.job_status(gone.id)["last_reason"]
        assert svc2.job_status(never.id)["state"] == "queued"
        assert svc2.recovered["adopted"] == 1  # orphan: alive, being stopped
        until(svc2, lambda: svc2.job_status(orphan.id)["state"] in ("queued", "running")
              and svc2.job_status(orphan.id)["attempts"] == 2)
        until(svc2, lambda: all(svc2.job_status(j.id)["state"] == "running" for j in (gone, never, orphan)))
        assert svc2.store.check_invariants() == []
        kill_jobs(svc2)
    finally:
        kill_jobs(svc)
        svc.store.close()


def test_running_job_without_pid_is_found_by_its_wrapper(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    svc = SchedulerService(cfg)
    try:
        job = svc.submit(JobRequest([PY, "-c", "import time; time.sleep(60)"], gpus=1))
        until(svc, lambda: svc.job_status(job.id)["state"] == "running")
        pid = svc.job_status(job.id)["pid"]
        # Forget the pid, as if the service died right after launching, before storing it.
        conn = svc.store._conn()
        conn.execute("UPDATE jobs SET pid = NULL, pid_start = NULL WHERE id = ?", (job.id,))
        svc2 = SchedulerService(cfg)
        svc2.recover()
        rec = svc2.store.get(job.id)
        assert rec is not None and rec.state is JobState.RUNNING and rec.pid == pid and rec.attempts == 1
        time.sleep(0.05)
    finally:
        kill_jobs(svc)
        svc.store.close()
