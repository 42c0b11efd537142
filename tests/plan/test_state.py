"""State file atomicity and backup, and the state lock: contention, dead holders, force-unlock."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlsched.plan.errors import StateError, StateLockedError
from rlsched.plan.state import LockInfo, ResourceRecord, State, StateLock, StateStore, force_unlock, locked

HOLDER = textwrap.dedent("""
    import sys, time
    from rlsched.plan.state import StateLock, StateStore
    lock = StateLock(StateStore(sys.argv[1]), sys.argv[2])
    info = lock.acquire()
    print(info.id, flush=True)
    time.sleep(float(sys.argv[3]))
    lock.release()
""")


def spawn_holder(path: Path, op: str = "apply", hold_s: float = 30.0) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), op, str(hold_s)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    lock_id = proc.stdout.readline().strip()
    assert lock_id, "holder did not take the lock"
    return proc, lock_id


def test_write_bumps_serial_and_keeps_backup(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    assert store.read() is None
    st = State.empty()
    st.put(ResourceRecord("pool", "a", "a", {"x": 1}))
    store.write(st)
    assert st.serial == 1 and not store.backup_path.exists()
    st.put(ResourceRecord("pool", "b", "b", {"x": 2}))
    store.write(st)
    assert json.loads(store.backup_path.read_text())["serial"] == 1
    back = store.read()
    assert back is not None and back.serial == 2 and back.lineage == st.lineage
    assert {r.address for r in back.resources.values()} == {"pool.a", "pool.b"}
    doc = json.loads(store.path.read_text())
    assert set(doc) == {"format_version", "rlsched_version", "serial", "lineage", "resources", "outputs", "journal"}
    assert set(doc["resources"][0]) == {"type", "name", "key", "attributes", "observed", "depends_on"}


def test_crash_during_write_leaves_the_old_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path / "s.json")
    st = State.empty()
    store.write(st)
    before = store.path.read_bytes()
    real_replace = os.replace

    def boom(src: str, dst: str) -> None:
        if str(dst) == str(store.path):
            raise OSError("disk gone")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        store.write(st)
    monkeypatch.undo()
    assert store.path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # temp file cleaned up


def test_kill_9_while_writing_never_tears_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    code = textwrap.dedent(f"""
        from rlsched.plan.state import State, StateStore, ResourceRecord
        store = StateStore({str(path)!r}); st = State.empty()
        for i in range(100000):
            st.put(ResourceRecord("pool", f"p{{i % 50}}", f"p{{i % 50}}", {{"i": i, "pad": "x" * 2000}}))
            store.write(st)
            if i == 0:
                print("started", flush=True)
    """)
    for delay in (0.0, 0.05, 0.13, 0.2):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        st = StateStore(path).read()  # parses: old or new content, never a mix
        assert st is not None and st.serial >= 1
        backup = json.loads(path.with_name("s.json.backup").read_text()) if st.serial > 1 else None
        assert backup is None or backup["serial"] in (st.serial - 1, st.serial)


def test_unreadable_state_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_text("{not json")
    with pytest.raises(StateError, match=r"s\.json:1:2: state is not valid JSON"):
        StateStore(p).read()
    p.write_text(json.dumps({"format_version": 99, "serial": 1, "lineage": "x", "resources": []}))
    with pytest.raises(StateError, match="newer than this rlsched supports"):
        StateStore(p).read()


def test_lock_contention_between_two_processes_names_the_holder(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    proc, lock_id = spawn_holder(store.path, "apply", hold_s=1.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(StateLockedError) as ei:
            StateLock(store, "plan", timeout=0.3).acquire()
        assert time.monotonic() - t0 >= 0.3
        msg = str(ei.value)
        assert msg.startswith(f"state locked by apply (pid {proc.pid} on ")
        assert msg.endswith(f"); wait or run rlsched force-unlock {lock_id}")
        assert ei.value.holder is not None and ei.value.holder.id == lock_id
        # waiting long enough gets the lock once the holder releases it
        with locked(store, "plan", timeout=30) as lock:
            assert lock.info is not None and lock.info.pid == os.getpid()
    finally:
        proc.kill()
        proc.wait()
    # a released lock leaves an empty file: no takeover warning next time
    warnings: list[str] = []
    with locked(store, "plan", warn=warnings.append):
        pass
    assert warnings == []


def test_dead_holder_is_taken_over_with_a_warning(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    proc, lock_id = spawn_holder(store.path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    warnings: list[str] = []
    with locked(store, "apply", timeout=0, warn=warnings.append) as lock:
        assert lock.info is not None and lock.info.id != lock_id
    assert len(warnings) == 1 and f"pid {proc.pid}" in warnings[0] and "exited without releasing" in warnings[0]


def test_dead_holder_whose_flock_survives_in_an_orphan_is_broken(tmp_path: Path) -> None:
    """The recorded holder is dead but its descriptor lives on (an orphaned child): take over after a grace."""
    store = StateStore(tmp_path / "s.json")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    info = LockInfo("dead-id", dead.pid, os.uname().nodename, "apply", "2024-01-01T00:00:00Z")
    store.lock_path.write_text(json.dumps(info.to_json()))
    orphan_fd = os.open(store.lock_path, os.O_RDWR)
    fcntl.flock(orphan_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        warnings: list[str] = []
        with locked(store, "apply", timeout=0, warn=warnings.append) as lock:
            assert lock.info is not None and lock.info.pid == os.getpid()
        assert any("no longer running" in w and "dead-id" in w for w in warnings)
    finally:
        os.close(orphan_fd)


def test_live_holder_on_another_host_is_never_taken_over(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    info = LockInfo("remote-id", 1, "some-other-host", "apply", "2024-01-01T00:00:00Z")
    store.lock_path.write_text(json.dumps(info.to_json()))
    fd = os.open(store.lock_path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(StateLockedError, match="pid 1 on some-other-host"):
            StateLock(store, "plan", timeout=0.2).acquire()
    finally:
        os.close(fd)


def test_force_unlock(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    with pytest.raises(StateError, match="no lock held"):
        force_unlock(store, "x")
    proc, lock_id = spawn_holder(store.path)
    try:
        with pytest.raises(StateError, match="does not match"):
            force_unlock(store, "wrong-id")
        holder = force_unlock(store, lock_id)
        assert holder.pid == proc.pid
        with locked(store, "apply", timeout=0) as lock:  # the holder still runs, but no longer blocks
            assert lock.info is not None
    finally:
        proc.kill()
        proc.wait()
