"""rlsched.posix: atomic writes, directory fsync, flock and pid checks, against the real kernel.

Locks are contended by real subprocesses (a lock held in this process would not
show what another process sees), and pid checks use real processes and a real zombie.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlsched.posix import (
    atomic_write,
    exclusive_lock,
    fsync_dir,
    pid_exists,
    pid_running,
    process_state,
    try_lock,
    unlock,
)

HOLDER = r"""
import sys, time
from rlsched.posix import exclusive_lock
with exclusive_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()  # hold until told to release (or killed)
print("released", flush=True)
"""


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    yield
    os.umask(old)


# --------------------------------------------------------------------------- atomic_write


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic_write(path, b"old")
    atomic_write(path, "new \u00e9")  # str is written as UTF-8
    assert path.read_bytes() == "new \u00e9".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]  # no temporary file left


@pytest.mark.usefixtures("umask_077")
def test_atomic_write_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    atomic_write(tmp_path / "public", "x", mode=0o644)
    assert _mode(tmp_path / "public") == 0o644
    atomic_write(tmp_path / "private", "x", mode=0o600)
    assert _mode(tmp_path / "private") == 0o600


def test_atomic_write_without_mode_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "f", "x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "f") == 0o640


def test_atomic_write_replaces_a_file_of_another_mode(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("old")
    path.chmod(0o666)
    atomic_write(path, "new", mode=0o600)
    assert _mode(path) == 0o600 and path.read_text() == "new"


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f"
    atomic_write(path, "old")

    def boom(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_atomic_write_into_a_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "nope" / "f", "x")


@pytest.mark.parametrize(("hidden", "prefix"), [(True, ".f.json."), (False, "f.json.")])
def test_temporary_file_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hidden: bool, prefix: str) -> None:
    seen: list[str] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    atomic_write(tmp_path / "f.json", "x", hidden_temp=hidden)
    assert len(seen) == 1 and seen[0].startswith(prefix + f"{os.getpid()}.") and seen[0].endswith(".tmp")


def test_atomic_write_fsyncs_the_file_before_the_rename_and_the_directory_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic_write(tmp_path / "f", "x")
    assert events == ["fsync file", "rename", "fsync dir"]
    events.clear()
    atomic_write(tmp_path / "g", "y", durable=False)  # atomic against a process crash only
    assert events == ["rename"] and (tmp_path / "g").read_text() == "y"


def test_fsync_dir_swallows_what_it_cannot_do(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    fsync_dir(tmp_path / "missing")  # no error: there is nothing a caller could do


# --------------------------------------------------------------------------- flock


def _start_holder(lock: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _try(lock: Path, *, shared: bool = False) -> bool:
    fd = os.open(lock, os.O_RDONLY)
    try:
        got = try_lock(fd, shared=shared)
        if got:
            unlock(fd)
        return got
    finally:
        os.close(fd)


def test_a_lock_held_by_another_process_excludes_and_is_released_at_the_end_of_its_block(tmp_path: Path) -> None:
    lock = tmp_path / "f.lock"
    proc = _start_holder(lock)
    try:
        assert not _try(lock)
        assert not _try(lock, shared=True)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        assert _try(lock) and _try(lock, shared=True)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_exclusive_lock_waits_for_the_holder_and_kill_9_releases_it(tmp_path: Path) -> None:
    lock = tmp_path / "f.lock"
    proc = _start_holder(lock)
    killed_at = 0.0

    def kill_soon() -> None:
        nonlocal killed_at
        time.sleep(0.3)
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)

    t = threading.Thread(target=kill_soon)
    t.start()
    try:
        with exclusive_lock(lock):  # blocks until the kernel drops the dead holder's lock
            got_at = time.monotonic()
    finally:
        t.join()
        proc.wait(timeout=10)
    assert killed_at and got_at >= killed_at


def test_shared_locks_coexist_and_exclude_an_exclusive_one(tmp_path: Path) -> None:
    lock = tmp_path / "f.lock"
    lock.touch()
    a, b = os.open(lock, os.O_RDONLY), os.open(lock, os.O_RDONLY)
    try:
        assert try_lock(a, shared=True)
        assert try_lock(b, shared=True)
        assert not _try(lock)  # a third open of the file, as another process would be
        unlock(a)
        unlock(b)
        assert _try(lock)
    finally:
        os.close(a)
        os.close(b)


# --------------------------------------------------------------------------- processes


def test_pid_checks_on_this_process_and_nonsense_pids() -> None:
    assert pid_exists(os.getpid()) and pid_running(os.getpid())
    assert process_state(os.getpid()) in ("R", "S")
    for pid in (0, -1):
        assert not pid_exists(pid) and not pid_running(pid)


def test_a_zombie_exists_but_does_not_run_and_a_reaped_child_is_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while process_state(proc.pid) != "Z":  # exited, not reaped yet
        assert time.monotonic() < deadline, "child did not become a zombie"
        time.sleep(0.01)
    assert pid_exists(proc.pid)
    assert not pid_running(proc.pid)
    proc.wait()
    assert not pid_exists(proc.pid) and not pid_running(proc.pid)
    assert process_state(proc.pid) is None


def test_a_process_of_another_user_exists() -> None:
    """Signal 0 to another user's process fails with EPERM, which still means it exists (init here)."""
    if os.stat("/proc/1").st_uid == os.getuid() and os.getuid() != 0:
        pytest.skip("init belongs to this user")
    pid = os.fork()
    if pid == 0:  # the child checks, as an unprivileged user when the tests run as root (root may signal anything)
        code = 3
        try:
            if os.getuid() == 0:
                os.setuid(65534)
            try:
                os.kill(1, 0)
                code = 2  # no EPERM: this test would prove nothing
            except PermissionError:
                code = 0 if pid_exists(1) and pid_running(1) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
