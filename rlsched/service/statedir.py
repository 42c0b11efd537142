"""The service's state dir: private modes whatever the umask, and one service per dir.

Job command lines and outputs are private to the user running the service, so the
state dir is 0700 and every file the service writes there (``jobs.db`` with its
``-wal``/``-shm`` files, job logs and exit files, ``token``, ``server.json``,
``service.log``) is 0600, set explicitly rather than left to the umask.

Two services on one state dir would each believe they own every GPU (the store
is shared, the in-memory allocations are not), so :class:`ServiceLock` takes an
exclusive ``fcntl`` lock on ``<state_dir>/service.lock`` before the service opens
anything else and holds it for its lifetime; the kernel releases it when the
process dies, ``kill -9`` included, so a stale lock never needs breaking. A second
start fails with the holder's pid.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from rlsched.errors import RlschedError
from rlsched.posix import try_lock, unlock
from rlsched.runtime.executor import PRIVATE_DIR_MODE as DIR_MODE
from rlsched.runtime.executor import PRIVATE_FILE_MODE as FILE_MODE
from rlsched.runtime.executor import open_private, private_dir, private_file

#: Name of the lock file inside the state dir.
LOCK_FILE = "service.lock"
__all__ = ["DIR_MODE", "FILE_MODE", "LOCK_FILE", "ServiceLock", "StateDirBusyError", "holder_pid", "open_private",
           "secure_dir", "secure_file"]


class StateDirBusyError(RlschedError):
    """Another service holds the state dir's lock."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


#: The helpers live with the executor (stdlib only, and the runtime must not import the service).
secure_dir = private_dir
secure_file = private_file


class ServiceLock:
    """Exclusive lock on a state dir for one service's lifetime (see the module doc).

    Args:
        state_dir: the dir to lock (created 0700 if absent).

    Raises:
        StateDirBusyError: from :meth:`acquire` when another process holds the lock.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> ServiceLock:
        """Take the lock at once or fail naming the holder; idempotent for this object."""
        if self._fd is not None:
            return self
        secure_dir(self.state_dir)
        fd = open_private(self.path, os.O_RDWR)
        if not try_lock(fd):
            # The holder writes its pid right after taking the lock: give it a moment to do so.
            deadline = time.monotonic() + 2.0
            raw = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            while not raw.isdigit() and time.monotonic() < deadline:
                time.sleep(0.01)
                raw = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            pid = int(raw) if raw.isdigit() else None
            holder = f"pid {pid}" if pid is not None else "a process that has not written its pid yet"
            raise StateDirBusyError(f"state dir {self.state_dir} is in use by another rlsched service ({holder}); "
                                    f"stop it first (`rlsched stop --state-dir {self.state_dir}`)", pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock up (the file stays; its content is cleared)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            unlock(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> ServiceLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder_pid(state_dir: Path) -> int | None:
    """The pid holding ``state_dir``'s service lock, or None when nobody holds it."""
    path = Path(state_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not try_lock(fd, shared=True):
            raw = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            return int(raw) if raw.isdigit() else None
        unlock(fd)
        return None
    finally:
        os.close(fd)
