"""rlsched state: what apply last did and saw, written atomically, guarded by a lock.

The state file is JSON::

    {"format_version": 1, "rlsched_version": "0.1.0", "serial": 12, "lineage": "<uuid4>",
     "resources": [{"type": "gpu", "name": "gpu-h100-04/0", "key": "GPU-...",
                    "attributes": {...declared...}, "observed": {...}, "depends_on": ["node.gpu-h100-04"]}],
     "outputs": {}, "journal": [{"seq": 1, "time": "...", "apply_id": "...", "step": "cordon", ...}]}

Why these choices (see ``shared/docs/HCL.md`` 1.3):

* ``lineage`` is minted once and never changes, ``serial`` is bumped on every write:
  a saved plan records both and apply refuses a mismatch, so a plan cannot be
  applied twice or onto another state.
* GPUs are keyed by UUID, not index, because indices change after a reset.
* ``attributes`` holds only declared attributes (what drift is computed from);
  ``observed`` holds identity and rlsched's own bookkeeping (index, model, MIG
  UUIDs, whether rlsched cordoned a node), never telemetry.
* Writes are atomic (temp file, fsync, rename, fsync of the directory) and keep the
  previous file as ``<path>.backup``: a process killed at any instant leaves either
  the old or the new state, never a torn one.
* The lock is ``fcntl.flock`` on ``<path>.lock`` whose content names the holder. The
  kernel drops a flock when its process dies, so a ``kill -9`` never leaves the state
  locked; leftover holder info is reported as a takeover warning.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsched.plan.errors import StateError, StateLockedError
from rlsched.posix import atomic_write, pid_exists, try_lock, unlock

FORMAT_VERSION = 1
#: Journal entries kept in the state file (older ones are dropped; the journal is an audit trail, not a log store).
JOURNAL_LIMIT = 2000
DEFAULT_STATE_NAME = "rlsched.state.json"

#: Resource types in dependency order (what apply creates first).
RESOURCE_TYPES = ("pool", "quota", "policy", "node", "gpu")


def _rlsched_version() -> str:
    try:
        from importlib.metadata import version

        return version("rlsched")
    except Exception:  # not installed (running from a source tree)
        return "0+unknown"


def utcnow() -> str:
    """ISO 8601 UTC timestamp with second precision (what the lock and journal record)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def new_lineage() -> str:
    """A fresh lineage; minted even for empty state so that plans against "no state" can be told apart."""
    return str(uuid.uuid4())


@dataclass(frozen=True, slots=True)
class ResourceRecord:
    """One object rlsched manages.

    Attributes:
        type: ``pool``, ``quota``, ``policy``, ``node`` or ``gpu``.
        name: display name (``train``, ``gpu-h100-04``, ``gpu-h100-04/0``).
        key: identity; the name for everything but GPUs, whose key is the UUID.
        attributes: declared attributes as applied (JSON values).
        observed: identity and bookkeeping as last seen (JSON values; never telemetry).
        depends_on: addresses this object needs (``pool.train``...).
    """

    type: str
    name: str
    key: str
    attributes: dict[str, Any] = field(default_factory=dict)
    observed: dict[str, Any] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        return f"{self.type}.{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "name": self.name, "key": self.key, "attributes": self.attributes,
                "observed": self.observed, "depends_on": list(self.depends_on)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ResourceRecord:
        return cls(type=str(d["type"]), name=str(d["name"]), key=str(d.get("key", d["name"])),
                   attributes=dict(d.get("attributes") or {}), observed=dict(d.get("observed") or {}),
                   depends_on=tuple(d.get("depends_on") or ()))


@dataclass
class State:
    """The state document. Mutable on purpose: apply edits it step by step and persists after each step.

    Resources are indexed by ``(type, key)``; ``serial`` is bumped by :meth:`StateStore.write`.
    """

    lineage: str
    serial: int = 0
    resources: dict[tuple[str, str], ResourceRecord] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    journal: list[dict[str, Any]] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    rlsched_version: str = field(default_factory=_rlsched_version)

    @classmethod
    def empty(cls, lineage: str | None = None) -> State:
        return cls(lineage=lineage or new_lineage())

    def get(self, type_: str, key: str) -> ResourceRecord | None:
        return self.resources.get((type_, key))

    def of_type(self, type_: str) -> list[ResourceRecord]:
        return sorted((r for (t, _), r in self.resources.items() if t == type_), key=lambda r: r.name)

    def put(self, rec: ResourceRecord) -> None:
        self.resources[(rec.type, rec.key)] = rec

    def remove(self, type_: str, key: str) -> None:
        self.resources.pop((type_, key), None)

    def find(self, address: str) -> ResourceRecord | None:
        """Look a resource up by address (``gpu.gpu-h100-04/0``) or by ``type.key`` (``gpu.GPU-...``)."""
        type_, _, rest = address.partition(".")
        for r in self.of_type(type_):
            if rest in (r.name, r.key):
                return r
        return None

    def log(self, entry: dict[str, Any]) -> None:
        """Append a journal entry (numbered, timestamped); the caller persists."""
        seq = (self.journal[-1]["seq"] + 1) if self.journal else 1
        self.journal.append({"seq": seq, "time": utcnow(), **entry})
        if len(self.journal) > JOURNAL_LIMIT:
            del self.journal[: len(self.journal) - JOURNAL_LIMIT]

    def to_json(self) -> dict[str, Any]:
        order = {t: i for i, t in enumerate(RESOURCE_TYPES)}
        recs = sorted(self.resources.values(), key=lambda r: (order.get(r.type, 99), r.name, r.key))
        return {"format_version": self.format_version, "rlsched_version": self.rlsched_version,
                "serial": self.serial, "lineage": self.lineage, "resources": [r.to_json() for r in recs],
                "outputs": self.outputs, "journal": self.journal}

    @classmethod
    def from_json(cls, d: Any, *, source: str = "state") -> State:
        if not isinstance(d, dict):
            raise StateError(f"{source}: not a state file (expected a JSON object)")
        missing = [k for k in ("format_version", "serial", "lineage", "resources") if k not in d]
        if missing:
            raise StateError(f"{source}: not a state file (missing {', '.join(missing)})")
        if not isinstance(d["format_version"], int) or d["format_version"] > FORMAT_VERSION:
            raise StateError(f"{source}: state format_version {d['format_version']!r} is newer than this rlsched "
                             f"supports ({FORMAT_VERSION}); upgrade rlsched")
        try:
            recs = [ResourceRecord.from_json(r) for r in d["resources"]]
        except (KeyError, TypeError) as exc:
            raise StateError(f"{source}: malformed resource ({exc})") from None
        return cls(lineage=str(d["lineage"]), serial=int(d["serial"]),
                   resources={(r.type, r.key): r for r in recs}, outputs=dict(d.get("outputs") or {}),
                   journal=list(d.get("journal") or []), format_version=int(d["format_version"]),
                   rlsched_version=str(d.get("rlsched_version", "")))


class StateStore:
    """Reads and writes one state file (``rlsched.state.json`` beside the spec by default)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def backup_path(self) -> Path:
        return self.path.with_name(self.path.name + ".backup")

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def read(self) -> State | None:
        """The current state, or None when there is none yet."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"{self.path}: cannot read state ({exc.strerror})") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateError(f"{self.path}:{exc.lineno}:{exc.colno}: state is not valid JSON ({exc.msg}); "
                             f"the previous state is in {self.backup_path}") from None
        return State.from_json(doc, source=str(self.path))

    def write(self, state: State) -> None:
        """Bump the serial and persist atomically, keeping the previous file as ``.backup``."""
        state.serial += 1
        data = (json.dumps(state.to_json(), indent=2, sort_keys=False) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            old = self.path.read_bytes()
        except FileNotFoundError:
            old = None
        if old is not None:
            atomic_write(self.backup_path, old)
        atomic_write(self.path, data)


# --- locking ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LockInfo:
    """Who holds the state lock (the content of ``<state>.lock``)."""

    id: str
    pid: int
    host: str
    op: str
    started: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "pid": self.pid, "host": self.host, "op": self.op, "started": self.started}

    @classmethod
    def parse(cls, text: str) -> LockInfo | None:
        try:
            d = json.loads(text)
            return cls(id=str(d["id"]), pid=int(d["pid"]), host=str(d["host"]), op=str(d["op"]),
                       started=str(d["started"]))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        return f"{self.op} (pid {self.pid} on {self.host}, since {self.started}; lock ID {self.id})"


#: How long a dead holder's info must persist under a busy flock before the lock is broken.
_GRACE_S = 0.5


def read_lock_info(lock_path: Path) -> LockInfo | None:
    try:
        return LockInfo.parse(lock_path.read_text())
    except OSError:
        return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_ino, own.st_dev) == (st.st_ino, st.st_dev)


class StateLock:
    """Exclusive lock on a state file, held from :meth:`acquire` to :meth:`release` (or a ``with`` block).

    Args:
        store: the state whose ``.lock`` file is used.
        op: what the holder does (``plan``, ``apply``), shown to whoever waits.
        timeout: seconds to wait for a busy lock before failing with the holder named (0 = fail at once).
        warn: receives takeover warnings (a holder that died without releasing).
        poll: seconds between attempts while waiting.
    """

    def __init__(self, store: StateStore, op: str, *, timeout: float = 0.0,
                 warn: Callable[[str], None] | None = None, poll: float = 0.1) -> None:
        self.store = store
        self.op = op
        self.timeout = timeout
        self.warn = warn or (lambda _msg: None)
        self.poll = poll
        self.info: LockInfo | None = None
        self._fd: int | None = None

    def acquire(self) -> LockInfo:
        path = self.store.lock_path
        path.parent.mkdir(parents=True, exist_ok=True)
        now = time.monotonic
        deadline = now() + max(0.0, self.timeout)
        host = socket.gethostname()
        dead_since: dict[str, float] = {}
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if not try_lock(fd):
                os.close(fd)
                holder = read_lock_info(path)
                dead = holder is not None and holder.host == host and not pid_exists(holder.pid)
                if holder is not None and dead and dead_since.setdefault(holder.id, now()) + _GRACE_S <= now():
                    # The flock is held by someone else than the recorded holder (an inherited
                    # descriptor in an orphaned child): the holder is gone, so break the lock by
                    # replacing the file; the orphan keeps a lock on an inode nobody uses any more.
                    # The grace period covers a new holder that has the flock but has not yet
                    # replaced the dead holder's info with its own.
                    self.warn(f"Warning: state lock held by {holder.describe()}, which is no longer running; "
                              "taking the lock over")
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    continue
                if now() >= deadline and not (dead and now() < deadline + 2 * _GRACE_S):
                    raise StateLockedError(holder, str(self.store.path)) from None
                time.sleep(self.poll)
                continue
            if not _same_file(fd, path):  # unlinked (force-unlock, takeover) between open and flock
                os.close(fd)
                continue
            previous = LockInfo.parse(os.pread(fd, 65536, 0).decode(errors="replace"))
            if previous is not None:
                alive = previous.host == host and pid_exists(previous.pid)
                self.warn(f"Warning: the previous state lock holder, {previous.describe()}, "
                          f"{'released its lock without clearing it' if alive else 'exited without releasing it'}; "
                          "taking the lock over")
            info = LockInfo(id=str(uuid.uuid4()), pid=os.getpid(), host=host, op=self.op, started=utcnow())
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info.to_json()) + "\n").encode(), 0)
            os.fsync(fd)
            self._fd, self.info = fd, info
            return info

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if _same_file(fd, self.store.lock_path):
                os.ftruncate(fd, 0)
            unlock(fd)
        finally:
            os.close(fd)
            self.info = None

    def __enter__(self) -> StateLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def locked(store: StateStore, op: str, *, timeout: float = 0.0,
           warn: Callable[[str], None] | None = None) -> Iterator[StateLock]:
    """``with locked(store, "apply", timeout=30) as lock: ...``."""
    lock = StateLock(store, op, timeout=timeout, warn=warn)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


def force_unlock(store: StateStore, lock_id: str) -> LockInfo:
    """Remove the lock ``lock_id`` whatever its holder is doing (Terraform's ``force-unlock``).

    The holder, if still running, keeps a flock on the removed file and so does not
    block anyone; it is the user's call that it is really gone or harmless.

    Raises:
        StateError: no lock is held, or it has another ID (the message names the holder).
    """
    path = store.lock_path
    holder = read_lock_info(path)
    if holder is None:
        raise StateError(f"no lock held on {store.path}")
    if holder.id != lock_id:
        raise StateError(f"lock ID {lock_id!r} does not match the lock on {store.path}, held by {holder.describe()}")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return holder
