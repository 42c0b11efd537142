"""POSIX primitives for crash-safe files and cross-process coordination.

The state file, the simulated fleet file, a job's exit file and the service's
``server.json`` are all read by other processes while they may be rewritten, and
the writer may be killed (``kill -9``, power loss) at any instant. The helpers here
are the one place that gets this right:

* :func:`atomic_write` replaces a file so that a reader, or a reader after a crash,
  sees the old content or the new content, never a torn mix.
* :func:`fsync_dir` makes a rename (or a new link) in a directory survive a crash.
* :func:`exclusive_lock`, :func:`try_lock` and :func:`unlock` wrap ``flock``: the
  kernel drops a flock when the last descriptor of its open file goes away, so a
  holder that dies, ``kill -9`` included, never leaves a lock behind.
* :func:`pid_exists`, :func:`process_state` and :func:`pid_running` tell whether a
  process is there, and whether it still runs or is only an unreaped zombie.

Standard library only, and nothing heavy: the job wrapper
(``python -m rlsched.runtime.executor --wrap``) imports this module and starts with
every job.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX: see exclusive_lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["atomic_write", "exclusive_lock", "fsync_dir", "pid_exists", "pid_running", "process_state", "try_lock",
           "unlock"]


# --------------------------------------------------------------------------- crash-safe files


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush directory ``path`` itself to disk, so that renames and links made in it survive a crash.

    ``fsync`` on a file makes its content durable, not the directory entry that names
    it: until the directory is flushed, a crash may bring back the old name. Some
    filesystems cannot open or fsync a directory; that is not an error here (there is
    nothing more a caller could do), so every ``OSError`` is swallowed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes | str, *, mode: int | None = None,
                 hidden_temp: bool = True, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers, and a crash, see the old or the new content, never a mix.

    The data goes to a new temporary file in the same directory (the same
    filesystem, so the rename is atomic), is fsynced (so the new content is on disk
    before any name points at it), renamed over ``path`` and the directory is
    fsynced (so the rename itself survives a crash). If anything fails the temporary
    file is removed and the error propagates with ``path`` untouched; a writer
    killed mid-write leaves only the temporary file, which its owner may sweep.

    Args:
        path: the file to replace (created if absent).
        data: the new content; ``str`` is written as UTF-8.
        mode: permission bits of the new file, set exactly whatever the umask (0o600 keeps a
            file private); None leaves them to the umask, as ``open()`` would (0o666 less the umask).
        hidden_temp: name the temporary file ``.<name>.<pid>.<random>.tmp`` (skipped by ``ls``);
            False names it ``<name>.<pid>.<random>.tmp``, for directories whose sweeps key files
            by the start of their name.
        durable: fsync the file and the directory. False keeps the write atomic against a crash of
            the process (the kernel has both the data and the rename) but not of the machine: for
            files that only mean something while the machine stays up.

    Raises:
        OSError: the temporary file could not be created, written or renamed.
    """
    target = Path(path)
    stem = f".{target.name}" if hidden_temp else target.name
    tmp = target.with_name(f"{stem}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)  # os.open's mode was filtered by the umask
            f.write(payload)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(target.parent)


# --------------------------------------------------------------------------- flock


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if absent) for the ``with`` block, waiting for it.

    For read-modify-write cycles on a file that other processes rewrite: without the
    lock, two writers read the same old content and the second rename loses the first
    one's update. The lock belongs to this open of ``path``, is released at the end
    of the block, and is dropped by the kernel if the process dies inside it. On a
    platform without ``fcntl`` the block runs unlocked (atomic writes still protect
    readers; only concurrent writers may lose updates).
    """
    if fcntl is None:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def try_lock(fd: int, *, shared: bool = False) -> bool:
    """Take a ``flock`` on ``fd`` without waiting: True if taken, False when another open of the file holds one.

    An exclusive lock (the default) excludes every other lock; ``shared`` locks exclude
    only exclusive ones, so taking a shared lock is how a reader asks "is anyone holding
    this?" without blocking a holder. Locks belong to the open file description, so a
    second ``open`` of the same file in this process conflicts like another process would.
    """
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlock(fd: int) -> None:
    """Release the ``flock`` held on ``fd`` (closing the last descriptor of its open file does too)."""
    fcntl.flock(fd, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- processes


def pid_exists(pid: int) -> bool:
    """True if a process with this pid exists on this host, a zombie (exited, not yet reaped) included.

    Signal 0 checks existence and permission without signalling: a process of another
    user answers ``EPERM``, which still means it exists. Use :func:`pid_running` when a
    zombie must count as gone (waiting for a process to exit).
    """
    if pid <= 0:  # 0 and negatives address process groups, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` from ``/proc/<pid>/stat`` (``R``, ``S``, ``Z`` ...), or None if there is none.

    The command name (field 2) may contain spaces and parentheses, so the state is the
    first field after the LAST ``)``.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    return fields[0].decode() if fields else None


def pid_running(pid: int) -> bool:
    """:func:`pid_exists`, except that a zombie (``Z``) or a dying process (``X``) counts as gone.

    A process that exited but whose parent has not reaped it yet still has its pid, so
    signal 0 alone would keep a caller waiting for its exit forever. Where ``/proc``
    cannot be read the answer is :func:`pid_exists`'s.
    """
    return pid_exists(pid) and process_state(pid) not in ("Z", "X")
