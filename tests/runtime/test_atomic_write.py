"""Fleet writes are atomic (kill -9 never leaves a torn file) and locked (no lost updates).

These run real subprocesses and really kill them: the property is about the
filesystem, so nothing here is mocked.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlsched.runtime.sim_backend import build_fleet, read_fleet, write_json_atomic

WRITER = r"""
import copy, os, sys, time
# A slow disk: fsync takes a while, so kills regularly land between the write of the
# temporary file and the rename (the window a non-atomic writer would tear).
_fsync = os.fsync
os.fsync = lambda fd: (time.sleep(0.01), _fsync(fd))[1]
from rlsched.runtime.sim_backend import SimulatedBackend, read_fleet, write_json_atomic
path = sys.argv[1]
be = SimulatedBackend(path)
targets = [(n.hostname, g.uuid) for n in be.inventory() for g in n.gpus]
variants = [read_fleet(path), copy.deepcopy(read_fleet(path))]
for n in variants[1]["nodes"]:
    n["cordoned"] = True
print("ready", flush=True)
i = 0
while True:  # a tight write loop, with a real backend mutation every tenth turn
    if i % 10 == 0:
        host, uuid = targets[(i // 10) % len(targets)]
        be.set_mig_layout(host, uuid, {"1g.10gb": 7} if i % 20 else {"3g.40gb": 2})
        variants = [read_fleet(path), variants[1]]
    else:
        write_json_atomic(path, variants[i % 2])
    i += 1
"""

APPENDER = r"""
import sys
from rlsched.runtime.sim_backend import SimulatedBackend
be = SimulatedBackend(sys.argv[1])
for _ in range(int(sys.argv[2])):
    be.inject_fault("gpu-h100-01", "fail_cordon")
"""


def test_kill_9_mid_write_never_leaves_a_torn_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    # Big enough (~1 MB) that a kill regularly lands inside a write.
    write_json_atomic(path, build_fleet("48x8xH100-80GB:all-1g"))  # ~0.5 MB
    rng = random.Random(7)
    interrupted = kills = 0
    # Kill until three kills have landed mid-write (at most 60): on a loaded machine the writer
    # starts slower and fewer of a fixed number of kills land inside a write.
    while interrupted < 3 and kills < 60:
        kills += 1
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.01, 0.25))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        proc.stdout.close()
        data = read_fleet(path)  # parses and validates, or raises
        assert len(data["nodes"]) == 48
        # A temp file left behind means this kill landed inside a write.
        leftovers = list(tmp_path.glob(".fleet.json.*.tmp"))
        interrupted += bool(leftovers)
        for f in leftovers:
            f.unlink()
    assert interrupted >= 3, f"only {interrupted} of {kills} kills landed mid-write; the test proved little"


def test_concurrent_writers_lose_no_update(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    write_json_atomic(path, build_fleet("2x2xH100-80GB"))
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(path), "25"]) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    assert read_fleet(path)["faults"]["gpu-h100-01"] == ["fail_cordon"] * 75


def test_stale_temp_files_are_swept_on_the_next_mutation(tmp_path: Path) -> None:
    from rlsched.runtime.sim_backend import SimulatedBackend

    path = tmp_path / "fleet.json"
    write_json_atomic(path, build_fleet("1x1xH100-80GB"))
    stale, fresh = tmp_path / ".fleet.json.dead.tmp", tmp_path / ".fleet.json.live.tmp"
    stale.write_text("{")
    fresh.write_text("{")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    SimulatedBackend(path).cordon("gpu-h100-01", True)
    assert not stale.exists() and fresh.exists()  # a young one may belong to a live writer
