"""Helpers for the scheduler-service tests: a simulated fleet, a small spec, a service, cleanup."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlsched.runtime.sim_backend import build_fleet, read_fleet, write_json_atomic
from rlsched.service.config import ServiceConfig
from rlsched.service.service import SchedulerService

#: One A100 node (4 whole GPUs) and one H100 node (2 GPUs split 2x1g.10gb + 2g.20gb + 3g.40gb).
FLEET = "1x4xA100-80GB,1x2xH100-80GB:balanced"

SPEC = """
mig_layout "balanced" {
  devices = { "1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1 }
}

pool "onprem" {
  gpu_model     = "A100-80GB"
  nodes         = ["gpu-a100-01"]
  gpus_per_node = 4
  mig           = "disabled"
}

pool "mig" {
  gpu_model     = "H100-80GB"
  nodes         = ["gpu-h100-01"]
  gpus_per_node = 2
  mig_layout    = mig_layout.balanced
}

quota "team_a" {
  pool      = pool.onprem
  principal = "team-a"
  max_gpus  = 2
}

quota "interns" {
  pool       = pool.mig
  principal  = "group:interns"
  max_slices = { "1g.10gb" = 1, "3g.40gb" = 0 }
}

policy "default" {
  scheduler = "%(scheduler)s"
  %(model)s
  fallback  = "fifo"
}
"""

PY = sys.executable


def write_spec(dirpath: Path, scheduler: str = "weighted_priority", model: str | None = None,
               name: str = "pool.hcl") -> Path:
    path = dirpath / name
    path.write_text(SPEC % {"scheduler": scheduler, "model": f'model = "{model}"' if model else ""})
    return path


def write_fleet(dirpath: Path, spec: str = FLEET) -> Path:
    path = dirpath / "fleet.json"
    write_json_atomic(path, build_fleet(spec))
    return path


def make_config(tmp_path: Path, **kw: Any) -> ServiceConfig:
    fleet = write_fleet(tmp_path) if not (tmp_path / "fleet.json").exists() else tmp_path / "fleet.json"
    spec = tmp_path / "pool.hcl"
    if not spec.exists():
        write_spec(tmp_path)
    kw.setdefault("grace_s", 0.5)
    kw.setdefault("tick_s", 0.02)
    return ServiceConfig([spec], tmp_path / "state", backend=f"sim:{fleet}", **kw)


def set_healthy(fleet: Path, gpu_uuid: str, healthy: bool) -> None:
    data = read_fleet(fleet)
    for n in data["nodes"]:
        for g in n["gpus"]:
            if g["uuid"] == gpu_uuid:
                g["healthy"] = healthy
    write_json_atomic(fleet, data)


def sleeper(seconds: float = 60.0) -> list[str]:
    return [PY, "-c", f"import time; time.sleep({seconds})"]


def env_writer(out: Path) -> list[str]:
    """A job that writes its CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES to ``out``."""
    code = ("import os, sys; open(sys.argv[1], 'w').write(os.environ['CUDA_VISIBLE_DEVICES'] + '|' + "
            "os.environ['NVIDIA_VISIBLE_DEVICES'])")
    return [PY, "-c", code, str(out)]


def until(svc: SchedulerService | None, cond: Callable[[], bool], timeout: float = 120.0,
          interval: float = 0.02) -> None:
    """Tick ``svc`` (if given) until ``cond()`` holds; fail after ``timeout`` seconds.

    The ceiling is generous on purpose: it returns as soon as the condition holds, so a slow, loaded machine
    costs time, never a failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        if svc is not None:
            svc.tick()
        if cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)


def kill_jobs(svc: SchedulerService) -> None:
    """SIGKILL the process groups of every job this service's store shows holding GPUs (test cleanup)."""
    from rlsched.runtime.executor import proc_start_time

    with contextlib.suppress(Exception):
        for rec in svc.store.holding():
            if rec.pid and proc_start_time(rec.pid) == rec.pid_start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(rec.pid, signal.SIGKILL)


@contextlib.contextmanager
def service(tmp_path: Path, **kw: Any) -> Iterator[SchedulerService]:
    svc = SchedulerService(make_config(tmp_path, **kw))
    try:
        yield svc
    finally:
        svc.stop()
        kill_jobs(svc)
        svc.store.close()


def device_overlaps(svc: SchedulerService) -> list[str]:
    """Devices held by two jobs at once (running or preempted) - must always be empty."""
    seen: dict[str, str] = {}
    bad = []
    for rec in svc.store.holding():
        assert rec.allocation is not None
        for dev in rec.allocation.devices:
            if dev in seen:
                bad.append(f"{dev}: {seen[dev]} and {rec.id}")
            seen[dev] = rec.id
    return bad
