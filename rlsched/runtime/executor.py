"""Launch, watch, stop and re-adopt job processes on the local node.

Why it looks like this:

* **No shell, ever.** A job is an argv list given to :class:`subprocess.Popen`;
  spaces, quotes and ``;`` in arguments reach the program verbatim.
* **GPU isolation by UUID.** ``CUDA_VISIBLE_DEVICES`` and
  ``NVIDIA_VISIBLE_DEVICES`` are set to exactly the allocated GPU or MIG UUIDs;
  UUIDs (not indices) stay correct when other processes enumerate devices
  differently, and they are the only way to address a MIG instance.
* **One process group per job** (``start_new_session=True``): stopping a job
  signals everything it spawned (data loaders, ``torchrun`` workers), and the
  job does not die with the scheduler service (no SIGHUP from its terminal).
* **Private files.** The log dir is 0700 and every log and exit file 0600,
  whatever the umask: a job's command line and output are its owner's alone.
* **Surviving a service restart.** The service stores each job's pid *and* its
  kernel start time (``/proc/<pid>/stat`` field 22). After a restart,
  :meth:`LocalExecutor.adopt` re-attaches only if both match, so a recycled pid
  belonging to an unrelated process is never signalled or mistaken for the job.
  A restarted service is not the job's parent and cannot ``wait()`` for it, so
  every job runs under a tiny wrapper (``python -m rlsched.runtime.executor
  --wrap EXIT_FILE -- argv...``) that waits for the job and writes its exit
  status to ``EXIT_FILE`` atomically (:func:`rlsched.posix.atomic_write`).

Exit codes follow :class:`subprocess.Popen`: ``>= 0`` is the job's exit status,
``-N`` means it was killed by signal ``N``. :data:`EXIT_LOST` means the process
is gone and no status was recorded (the wrapper itself was SIGKILLed, e.g. by
:meth:`LocalExecutor.stop` after the grace period or by the OOM killer).

This module imports only the standard library and :mod:`rlsched.posix` (itself standard library
only): the wrapper starts with every job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rlsched.posix import atomic_write, process_state

#: Exit code reported when a process vanished without an exit status.
EXIT_LOST = -256
#: Exit code reported for a job whose node stopped answering for longer than the service waits
#: (a multi-node executor's verdict; the process may still run there, and is fenced if it comes back).
EXIT_NODE_LOST = -257
#: Exit statuses the wrapper reports when the job cannot be started (shell conventions).
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126

_DEVICE_RE = re.compile(r"^(GPU|MIG)-[A-Za-z0-9/_.\-]+$")
_JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")
_EXIT_NAME_RE = re.compile(r"^(.+)\.\d+\.exit\.json$")
_GPU_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


#: Modes of what the service keeps about jobs (command lines, outputs): the user's alone, whatever the umask.
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and parents) and make it 0700 when this user owns it; returns it.

    ``mkdir``'s mode is filtered by the umask and an existing dir keeps its mode, so
    the mode is set explicitly.
    """
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    with contextlib.suppress(OSError):
        st = p.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o7777 != PRIVATE_DIR_MODE:
            os.chmod(p, PRIVATE_DIR_MODE)
    return p


def private_file(path: str | os.PathLike[str]) -> None:
    """Make an existing file this user owns 0600 (no-op when absent)."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o7777 != PRIVATE_FILE_MODE:
            os.chmod(path, PRIVATE_FILE_MODE)


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open(path, flags | O_CREAT | O_CLOEXEC)`` giving a 0600 file whatever the umask (an existing
    file is tightened too); returns the descriptor."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o7777 != PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


class ExecutorError(Exception):
    """A job could not be launched (bad argv, device list or job id)."""


#: The pid of an *unconfirmed* handle: a job recorded running without a pid, on a node that did not answer,
#: so whether its launch started there is not known yet (the fleet executor hands these out; the service
#: keeps, records and signals none of them).
UNKNOWN_PID = 0


@dataclass(frozen=True, slots=True)
class Launched:
    """A job's process as the service stores it (and the handle for poll/stop).

    Attributes:
        job_id: the job.
        pid: pid of the wrapper, which leads the job's process group.
        start_time: the wrapper's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22).
        log_path: file receiving the job's stdout and stderr (on the service's machine).
        exit_file: where the wrapper writes the job's exit status (on the job's machine).
        node: the node it runs on, for an executor that runs jobs on several ("" for this machine).
    """

    job_id: str
    pid: int
    start_time: int
    log_path: Path
    exit_file: Path
    node: str = ""

    @property
    def unconfirmed(self) -> bool:
        """Whether this handle stands for a process not found yet (pid :data:`UNKNOWN_PID`; no pid at or
        below it names a single process)."""
        return self.pid <= UNKNOWN_PID


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if there is no such process.

    The command name (field 2) may contain spaces and parentheses, so fields are
    counted from the LAST ``)``.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    # rest[0] is field 3 (state); field 22 is rest[19]
    return int(rest[19])


def _age_s(start_ticks: int) -> float:
    """Seconds since a process with ``start_ticks`` (from :func:`proc_start_time`) started."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # pragma: no cover - /proc is always there on Linux
        return float("inf")
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _alive(pid: int, start_time: int) -> bool:
    """The very process (pid AND start time) still exists and is not a zombie."""
    return proc_start_time(pid) == start_time and process_state(pid) not in (None, "Z", "X")


def read_exit_file(path: Path) -> int | None:
    """The exit status the wrapper recorded, or None if there is none (yet)."""
    try:
        return int(json.loads(path.read_text())["exit_code"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


#: The intermediate of a detached launch: starts the wrapper in a session of its own, writes its pid
#: to the descriptor named by ``argv[1]`` and exits at once, so the wrapper's parent becomes init (or
#: the nearest subreaper) instead of the launching process.
_DETACH = ("import os, subprocess, sys\n"
           "p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, start_new_session=True)\n"
           "os.write(int(sys.argv[1]), str(p.pid).encode())\n"
           "os._exit(0)\n")


class LocalExecutor:
    """Runs jobs as local processes, each under the exit-recording wrapper.

    Args:
        log_dir: where per-job logs and exit files go (created if needed).
        python: interpreter that runs the wrapper (default: this one).
        detach: start each wrapper through a short-lived intermediate, so it is no child of this
            process. The node agents need it: Ray kills a worker's direct children when the worker
            exits, and a raylet that dies takes its workers with it, so jobs started as an agent's
            children would die with their agent - the jobs must outlive it, to be re-adopted or
            fenced when the node returns. Detached jobs are watched through ``/proc`` and their exit
            files, as adopted ones are.
    """

    def __init__(self, log_dir: str | os.PathLike[str], python: str = sys.executable, *,
                 detach: bool = False) -> None:
        self.log_dir = private_dir(log_dir)
        self.python = python
        self.detach = detach
        #: our own children, so we can reap them (non-children are polled through /proc).
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def on(self, node: str) -> LocalExecutor:
        """The executor of ``node``'s jobs: this one (every job of a one-machine service runs here)."""
        return self

    def strays(self) -> list[tuple[str, str, int]]:
        """Processes on nodes that reappeared (none: this machine never disappears from itself)."""
        return []

    def fence(self, node: str, job_id: str, pid: int) -> None:
        """Kill a stray (never needed on one machine; see :meth:`strays`)."""

    # ------------------------------------------------------------------ launch
    def launch(self, job_id: str, argv: Sequence[str], visible_devices: Sequence[str],
               env_extra: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None) -> Launched:
        """Start ``argv`` (a list, never a shell string) with exactly ``visible_devices`` visible.

        Raises:
            ExecutorError: bad job id, argv, device UUID, or an env override of the GPU variables.
        """
        if not _JOB_ID_RE.match(job_id):
            raise ExecutorError(f"job id {job_id!r} is not a safe file name")
        if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
            raise ExecutorError("argv must be a non-empty list of strings (no shell command line)")
        for dev in visible_devices:
            if not _DEVICE_RE.match(dev):
                raise ExecutorError(f"{dev!r} is not a GPU-/MIG- UUID")
        extra = dict(env_extra or {})
        clash = sorted(set(extra) & set(_GPU_ENV))
        if clash:
            raise ExecutorError(f"env_extra may not set {', '.join(clash)}: the allocation decides them")
        env = dict(os.environ)
        env.update(extra)
        devices = ",".join(visible_devices)
        for k in _GPU_ENV:
            env[k] = devices
        nonce = time.time_ns()
        log_path = self.log_dir / f"{job_id}.log"
        exit_file = self.log_dir / f"{job_id}.{nonce}.exit.json"
        cmd = [self.python, "-m", "rlsched.runtime.executor", "--wrap", str(exit_file), "--", *argv]
        with os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
            # Each attempt appends, after a header line, so retries keep earlier output.
            log.write(f"=== rlsched: launch {job_id} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} "
                      f"devices={devices or '-'} ===\n".encode())
            log.flush()
            if self.detach:
                pid = self._launch_detached(job_id, cmd, log, env, cwd)
                # a job that already ended has no start time: -1 never matches, so poll reads its exit file
                return Launched(job_id, pid, proc_start_time(pid) or -1, log_path, exit_file)
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=cwd, start_new_session=True, close_fds=True)
        start = proc_start_time(proc.pid)
        if start is None:  # pragma: no cover - only if the process was reaped already, impossible before wait()
            start = -1
        self._children[proc.pid] = proc
        return Launched(job_id, proc.pid, start, log_path, exit_file)

    def _launch_detached(self, job_id: str, cmd: list[str], log: IO[bytes], env: dict[str, str],
                         cwd: str | os.PathLike[str] | None) -> int:
        """Start ``cmd`` through the :data:`_DETACH` intermediate; the wrapper's pid."""
        read_end, write_end = os.pipe()
        try:
            mid = subprocess.Popen([self.python, "-c", _DETACH, str(write_end), *cmd], stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True,
                                   pass_fds=(write_end,))
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            got = pipe.read()
        rc = mid.wait()
        if not got.strip().isdigit():
            raise ExecutorError(f"job {job_id}: the detaching launcher exited with {rc} before starting it")
        return int(got)

    # ------------------------------------------------------------------ watch
    def adopt(self, pid: int, start_time: int, exit_file: str | os.PathLike[str] | None = None,
              job_id: str = "", log_path: str | os.PathLike[str] | None = None,
              devices: Sequence[str] = ()) -> Launched | None:
        """Re-attach to a job process after a restart; None if it is not the same process.

        The pid must exist AND have the recorded start time (pid-reuse guard). The
        exit file is taken from the wrapper's command line when not given, which
        also confirms the process is one of our wrappers; the job id and log path
        follow from the exit file's name when not given.
        """
        if proc_start_time(pid) != start_time:
            return None
        if exit_file is None:
            exit_file = _exit_file_from_cmdline(pid)
            # Between fork and exec a fresh child still shows its parent's command line; give a
            # process younger than a few seconds a moment to exec before calling it foreign.
            deadline = time.monotonic() + 1.0
            while exit_file is None and _age_s(start_time) < 3.0 and time.monotonic() < deadline:
                time.sleep(0.01)
                if proc_start_time(pid) != start_time:
                    return None
                exit_file = _exit_file_from_cmdline(pid)
            if exit_file is None:
                return None  # same pid and start time but not our wrapper: never touch it
        exit_path = Path(exit_file)
        if not job_id:
            m = _EXIT_NAME_RE.match(exit_path.name)
            job_id = m.group(1) if m else ""
        if log_path is None:
            log_path = exit_path.with_name(f"{job_id}.log")
        return Launched(job_id, pid, start_time, Path(log_path), exit_path)

    def find(self, job_id: str, devices: Sequence[str] = ()) -> Launched | None:
        """A live wrapper process of ``job_id`` (for a job marked running whose pid was never stored:
        the service died between committing the placement and recording the launch). One machine runs
        every job in one process, so ``devices`` (and :meth:`adopt`'s) change nothing here."""
        prefix = str(self.log_dir / f"{job_id}.").encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"rlsched.runtime.executor" not in b" ".join(args) or b"--wrap" not in args:
                continue
            i = args.index(b"--wrap")
            if i + 1 < len(args) and args[i + 1].startswith(prefix) and args[i + 1].endswith(b".exit.json"):
                pid = int(entry)
                start = proc_start_time(pid)
                if start is not None:
                    return self.adopt(pid, start, None, job_id)
        return None

    def exit_files(self, job_id: str) -> list[Path]:
        """The exit files of ``job_id``'s attempts not consumed yet, oldest first."""
        files = []
        for p in self.log_dir.glob(f"{job_id}.*.exit.json"):
            nonce = p.name[len(job_id) + 1:-len(".exit.json")]
            if nonce.isdigit():
                files.append((int(nonce), p))
        return [p for _, p in sorted(files)]

    def recorded_exit(self, job_id: str) -> int | None:
        """The exit status of ``job_id``'s latest unconsumed attempt, or None if none was recorded."""
        files = self.exit_files(job_id)
        return read_exit_file(files[-1]) if files else None

    def lost_node(self, job_id: str) -> str | None:
        """None: one machine loses no node of its own."""
        return None

    def consume_exits(self, job_id: str, known: Path | None = None) -> None:
        """Mark a settled job's exit files seen: ``known`` (its process's) if given, else every one found."""
        for p in ([known] if known is not None else self.exit_files(job_id)):
            with contextlib.suppress(OSError):
                p.rename(p.with_name(p.name + ".seen"))

    def poll(self, job: Launched) -> int | None:
        """The job's exit code, or None while it runs (see the module doc for the codes)."""
        child = self._children.get(job.pid)
        if child is not None and proc_start_time(job.pid) in (job.start_time, None):
            rc = child.poll()
            if rc is None:
                return None
            del self._children[job.pid]
            recorded = read_exit_file(job.exit_file)
            return recorded if recorded is not None else rc
        if _alive(job.pid, job.start_time):
            return None
        recorded = read_exit_file(job.exit_file)
        return recorded if recorded is not None else EXIT_LOST

    def wait(self, job: Launched, timeout_s: float | None = None, interval_s: float = 0.02) -> int | None:
        """Poll until the job ends or ``timeout_s`` passes; its exit code or None."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            rc = self.poll(job)
            if rc is not None:
                return rc
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(interval_s)

    def stop(self, job: Launched, grace_s: float = 30.0) -> int:
        """SIGTERM the job's process group, wait ``grace_s``, then SIGKILL it; returns the exit code.

        The group is signalled only while the leader is the very process we launched
        (pid and start time match), so a recycled pid is never hit.
        """
        rc = self.poll(job)
        if rc is not None:
            return rc
        self._signal_group(job, signal.SIGTERM)
        rc = self.wait(job, grace_s)
        if rc is not None:
            return rc
        self._signal_group(job, signal.SIGKILL)
        rc = self.wait(job, 10.0)
        return rc if rc is not None else EXIT_LOST

    def send_signal(self, job: Launched, sig: signal.Signals) -> None:
        """Signal the job's process group without waiting (a scheduler loop must not block on a
        grace period); a no-op once the leader is gone or its pid was recycled."""
        self._signal_group(job, sig)

    def _signal_group(self, job: Launched, sig: signal.Signals) -> None:
        if proc_start_time(job.pid) != job.start_time:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.pid, sig)


def _exit_file_from_cmdline(pid: int) -> str | None:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        i = args.index(b"--wrap")
        if b"rlsched.runtime.executor" not in args[:i]:
            return None
        return args[i + 1].decode()
    except (ValueError, IndexError):
        return None


# ---------------------------------------------------------------------- the wrapper
def _write_exit_file(path: Path, code: int) -> None:
    """Write ``{"exit_code": code}`` atomically and durably (0600): a reader sees all of it or nothing.

    The temporary file keeps the job id at the start of its name, so the service's
    retention sweep removes one left by a wrapper killed mid-write with the job's files.
    """
    atomic_write(path, json.dumps({"exit_code": code, "time": time.time()}), mode=PRIVATE_FILE_MODE,
                 hidden_temp=False)


def wrap(exit_file: Path, argv: list[str]) -> int:
    """Run ``argv``, record its exit status in ``exit_file``, and end the same way it did.

    SIGTERM/SIGINT are ignored by the wrapper itself (with a Python handler, which
    ``exec`` resets, so the job still receives them): the executor signals the whole
    group, and the wrapper must outlive the job to record how it ended.
    """
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(argv)
    except FileNotFoundError as exc:
        print(f"rlsched: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_exit_file(exit_file, EXIT_NOT_FOUND)
        return EXIT_NOT_FOUND
    except (PermissionError, OSError) as exc:
        print(f"rlsched: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_exit_file(exit_file, EXIT_NOT_EXECUTABLE)
        return EXIT_NOT_EXECUTABLE
    rc = child.wait()
    _write_exit_file(exit_file, rc)
    return rc


def main(args: list[str] | None = None) -> None:
    """``python -m rlsched.runtime.executor --wrap EXIT_FILE -- argv...``."""
    a = list(sys.argv[1:] if args is None else args)
    if len(a) < 4 or a[0] != "--wrap" or a[2] != "--":
        print("usage: python -m rlsched.runtime.executor --wrap EXIT_FILE -- PROGRAM [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    rc = wrap(Path(a[1]), a[3:])
    sys.stdout.flush()
    if rc < 0:
        # End the way the job ended, so a parent that waits sees the same status.
        with contextlib.suppress(OSError, ValueError):  # SIGKILL/SIGSTOP have no handler to reset
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
