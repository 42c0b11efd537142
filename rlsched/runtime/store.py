"""The scheduler service's durable state: jobs, decisions and the audit trail in SQLite.

Why SQLite: the service is one process per cluster head, its write rate is a few
state changes per job, and it must survive ``kill -9`` and power loss without an
external database. SQLite in WAL mode gives exactly that, and lets the CLI (or a
second service replica in hot standby) read while the scheduler writes.

Durability choices:

* ``journal_mode=WAL``: readers never block the writer and vice versa.
* ``synchronous=FULL`` by default: WAL with ``NORMAL`` is already safe against a
  *process* crash, but may lose the last committed transactions on power loss.
  The audit trail and "this job was submitted" acknowledgements are promises made
  to users, so the default pays one fsync per commit (cheap at scheduler rates).
  ``synchronous="NORMAL"`` may be passed where that trade-off is acceptable.
* Every state change is ONE ``BEGIN IMMEDIATE`` transaction that also appends its
  audit record, so the trail and the job table can never disagree, and a
  ``kill -9`` at any instant leaves either the whole change or none of it.
  ``IMMEDIATE`` takes the write lock up front, so concurrent writers queue on the
  busy timeout instead of failing with a deadlock-style ``SQLITE_BUSY`` on upgrade.
* Transitions are compare-and-set (``UPDATE ... WHERE state = ?``): two scheduler
  loops racing to start the same job cannot both succeed.
* Private: the database and its ``-wal``/``-shm`` files are 0600 whatever the
  umask (job command lines are their owner's alone).
* The schema itself enforces two invariants: a running or preempted job has an
  allocation (CHECK constraint), and the audit table is append-only (triggers
  abort any UPDATE or DELETE).

The schema version lives in ``PRAGMA user_version``; a database written by a newer
rlsched is refused rather than misread.

Job life::

    queued --mark_running--> running --mark_finished--> done | failed | cancelled
      ^  \\--cancel--> cancelled   |  \\--preempt--> preempted (process stopping, GPUs still held)
      |                           |                    |
      +-------- requeue ----------+--------------------+
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from rlsched.errors import RlschedError
from rlsched.runtime.audit import AuditEvent, AuditRecord, dumps
from rlsched.runtime.executor import open_private, private_file
from rlsched.runtime.job_request import JobRequest

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from 3.11; annotations only

SCHEMA_VERSION = 4
BUSY_TIMEOUT_MS = 30_000


class StoreError(RlschedError):
    """The job store refused an operation (the message says which job and why)."""


class UnknownJobError(StoreError):
    """No job with this id."""


class InvalidTransitionError(StoreError):
    """The job is not in a state that allows this change (e.g. finishing a queued job)."""


class IdempotencyConflictError(StoreError):
    """An idempotency key was reused for a different request."""


class JobState(str, Enum):
    """Where a job is in its life; values are what the database stores."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: stop requested (SIGTERM sent); the process may still run and still holds its GPUs.
    PREEMPTED = "preempted"

    @property
    def terminal(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)

    @property
    def holds_gpus(self) -> bool:
        return self in (JobState.RUNNING, JobState.PREEMPTED)


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where a job runs: its node and the exact GPU or MIG UUIDs it may see.

    ``devices`` is what the executor puts in ``CUDA_VISIBLE_DEVICES``. ``pool``,
    ``gpu_indices`` and ``slice_start`` let the service rebuild the
    :class:`~rlsched.cluster.model.Placement` after a restart.
    """

    node: str
    devices: tuple[str, ...]
    pool: str = ""
    gpu_indices: tuple[int, ...] = ()
    slice_start: int | None = None

    def to_json(self) -> str:
        return dumps({"node": self.node, "devices": list(self.devices), "pool": self.pool,
                      "gpu_indices": list(self.gpu_indices), "slice_start": self.slice_start})

    @classmethod
    def from_json(cls, text: str) -> Allocation:
        d = json.loads(text)
        return cls(node=d["node"], devices=tuple(d["devices"]), pool=d.get("pool", ""),
                   gpu_indices=tuple(d.get("gpu_indices", ())), slice_start=d.get("slice_start"))


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One row of the jobs table, decoded."""

    id: str
    seq: int
    argv: tuple[str, ...]
    num_gpus: int
    gpu_milli: int
    mig_profile: str | None
    gpu_models: tuple[str, ...]
    priority: int
    user: str
    preemptible: bool
    deadline: float | None
    state: JobState
    attempts: int
    exit_code: int | None
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    allocation: Allocation | None
    pid: int | None
    pid_start: int | None
    log_path: str | None
    cancel_requested: bool
    reason: str
    idempotency_key: str | None
    #: further request fields the job table has no column for (host CPUs, memory, pool, estimated
    #: duration...), as given to :meth:`Store.submit` (schema version 2; empty for older rows).
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_job(self, submit_time: float | None = None, duration: float = 0.0) -> Any:
        """The :class:`~rlsched.cluster.job.Job` policies see for this record.

        ``duration`` is unknown for a live job (0 = unknown; estimators learn it).
        """
        from rlsched.cluster.job import Job

        return Job(self.id, self.submitted_at if submit_time is None else submit_time, duration,
                   num_gpus=self.num_gpus, gpu_milli=self.gpu_milli, gpu_models=frozenset(self.gpu_models),
                   priority=self.priority, user=self.user, preemptible=self.preemptible,
                   deadline=self.deadline)


_SCHEMA = """
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    idempotency_key TEXT UNIQUE,
    argv TEXT NOT NULL,
    num_gpus INTEGER NOT NULL CHECK (num_gpus >= 0),
    gpu_milli INTEGER NOT NULL CHECK (gpu_milli BETWEEN 1 AND 1000),
    mig_profile TEXT,
    gpu_models TEXT NOT NULL DEFAULT '[]',
    priority INTEGER NOT NULL DEFAULT 0,
    user TEXT NOT NULL DEFAULT '',
    preemptible INTEGER NOT NULL DEFAULT 0,
    deadline REAL,
    state TEXT NOT NULL CHECK (state IN ('queued','running','done','failed','cancelled','preempted')),
    attempts INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER,
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    allocation TEXT,
    pid INTEGER,
    pid_start INTEGER,
    log_path TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    reason TEXT NOT NULL DEFAULT '',
    CHECK (state NOT IN ('running','preempted') OR allocation IS NOT NULL)
);
CREATE INDEX jobs_by_state ON jobs(state, seq);

CREATE TABLE decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    policy TEXT NOT NULL DEFAULT '',
    model_version TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL,
    job TEXT,
    payload TEXT NOT NULL,
    applied INTEGER NOT NULL,
    reason TEXT NOT NULL DEFAULT ''
);

CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    event TEXT NOT NULL,
    job TEXT,
    gpus TEXT NOT NULL DEFAULT '[]',
    policy TEXT NOT NULL DEFAULT '',
    model_version TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '',
    extra TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_by_job ON audit(job, id);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END;
"""

_MIGRATIONS: dict[int, str] = {
    # version reached -> SQL that takes the previous version there
    1: _SCHEMA,
    2: "ALTER TABLE jobs ADD COLUMN options TEXT NOT NULL DEFAULT '{}';",
    # recovery reads one kind of record (open MIG re-split intents) at every start: by index, not
    # by scanning an append-only table that only grows
    3: "CREATE INDEX audit_by_event ON audit(event, id);",
    # daily GPU-hour quotas read the jobs finished in the last 24 h at every policy pass: by index,
    # not by reading every job that ever finished
    4: "CREATE INDEX jobs_by_finish ON jobs(state, finished_at);",
}


def _milli_of_profile(profile: str) -> int:
    """gpu_milli that makes feasibility's ``profile_for`` choose a ``Ng.*`` MIG profile."""
    head = profile.split("g.", 1)[0]
    if not head.isdigit() or not 1 <= int(head) <= 7:
        raise StoreError(f"MIG profile {profile!r} is not of the form <1-7>g.<mem>gb")
    g = int(head)
    return 1000 if g == 7 else math.ceil(g * 1000 / 7)


@dataclass(frozen=True, slots=True)
class PrunedJob:
    """A finished job :meth:`Store.prune_finished` deleted (its files are the caller's to remove)."""

    id: str
    state: JobState
    log_path: str | None


class SubmitOptions(TypedDict, total=False):
    """The keyword options of :meth:`Store.submit`: :class:`JobRequest`'s fields (``mig_profile`` is its ``mig``)."""

    gpus: int
    gpu_milli: int
    mig_profile: str | None
    gpu_models: Sequence[str]
    priority: int
    user: str
    preemptible: bool
    deadline: float | None
    idempotency_key: str | None


class Store:
    """The job store: one SQLite file, safe for many threads and processes.

    Each thread (and each process after a fork) gets its own connection, opened
    lazily; all writes go through :meth:`_tx`.

    Args:
        path: database file (created with its schema if absent).
        synchronous: ``"FULL"`` (default, durable across power loss) or ``"NORMAL"``.
        clock: wall-clock source for timestamps (injectable for tests).
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "FULL",
                 clock: Callable[[], float] = time.time) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise StoreError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous!r}")
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        self.clock = clock
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []
        self._make_private()
        self._migrate()

    def _make_private(self) -> None:
        """Create the database file 0600 before SQLite does (it would follow the umask) and tighten an existing
        one and its ``-wal``/``-shm`` files: job command lines are private. SQLite gives the WAL and shared-memory
        files it creates later the database file's mode."""
        if self.path.parent.exists():
            os.close(open_private(self.path, os.O_RDWR))
        for suffix in ("-wal", "-shm", "-journal"):
            private_file(self.path.with_name(self.path.name + suffix))

    # ------------------------------------------------------------------ connections
    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        # isolation_level=None: no implicit transactions; every write is an explicit BEGIN IMMEDIATE.
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.close()
            raise StoreError(f"{self.path}: cannot enable WAL journaling (got {mode}); is it on a network filesystem?")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        self._local.conn = conn
        self._local.pid = os.getpid()
        with self._lock:
            self._conns.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection this object opened (in this process)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(sqlite3.ProgrammingError):  # closed from another thread already
                c.close()
        self._local = threading.local()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it commits, or none of it (also on kill -9).

        Inside :meth:`batch` (same thread) it is a savepoint of the batch's transaction
        instead: a change that raises is undone alone, the others commit together.
        """
        conn = self._conn()
        depth = getattr(self._local, "depth", 0)
        if depth:
            name = f"sp{depth}"
            conn.execute(f"SAVEPOINT {name}")
            self._local.depth = depth + 1
            try:
                yield conn
            except BaseException:
                conn.execute(f"ROLLBACK TO {name}")
                conn.execute(f"RELEASE {name}")
                raise
            finally:
                self._local.depth = depth
            conn.execute(f"RELEASE {name}")
            return
        conn.execute("BEGIN IMMEDIATE")
        self._local.depth = 1
        try:
            yield conn
        except BaseException:
            self._local.depth = 0
            conn.execute("ROLLBACK")
            raise
        self._local.depth = 0
        conn.execute("COMMIT")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group this thread's writes into ONE transaction (one fsync): group commit.

        Every write method called inside keeps its own all-or-nothing behaviour (a
        savepoint; one that raises leaves the others standing), but nothing is
        durable, and so nothing may be acted upon or acknowledged, until the block
        exits without an exception (then all of it commits; a kill -9 before that
        loses all of it). An exception escaping the block rolls everything back.
        Nested ``batch`` blocks join the outer one.
        """
        with self._tx():
            yield

    def _migrate(self) -> None:
        with self._tx() as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version} is newer than this rlsched supports "
                    f"({SCHEMA_VERSION}); upgrade rlsched"
                )
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for stmt in _split_sql(_MIGRATIONS[v]):
                    conn.execute(stmt)
                conn.execute(f"PRAGMA user_version={v}")

    @property
    def schema_version(self) -> int:
        return int(self._conn().execute("PRAGMA user_version").fetchone()[0])

    # ------------------------------------------------------------------ audit
    def _audit(self, conn: sqlite3.Connection, rec: AuditRecord) -> int:
        cur = conn.execute(
            "INSERT INTO audit (time, event, job, gpus, policy, model_version, reason, extra) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (rec.time, rec.event.value, rec.job, dumps(list(rec.gpus)), rec.policy, rec.model_version,
             rec.reason, dumps(dict(rec.extra))),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def append_audit(self, event: AuditEvent | str, job: str | None = None, gpus: Sequence[str] = (),
                     policy: str = "", model_version: str = "", reason: str = "",
                     extra: dict[str, Any] | None = None) -> int:
        """Append one audit record in its own transaction; returns its id."""
        rec = AuditRecord(event=AuditEvent(event), job=job, gpus=tuple(gpus), policy=policy,
                          model_version=model_version, reason=reason, extra=extra or {}, time=self.clock())
        return self.append_record(rec).id or 0

    def append_record(self, rec: AuditRecord) -> AuditRecord:
        """Persist a record built elsewhere (the fallback guard's sink); returns it with its id."""
        with self._tx() as conn:
            rid = self._audit(conn, rec)
        return AuditRecord(event=rec.event, job=rec.job, gpus=rec.gpus, policy=rec.policy,
                           model_version=rec.model_version, reason=rec.reason, extra=rec.extra,
                           time=rec.time, id=rid)

    def audit_sink(self) -> Callable[[AuditRecord], None]:
        """An :data:`~rlsched.runtime.audit.AuditSink` writing to this store (give it to the fallback guard)."""

        def sink(rec: AuditRecord) -> None:
            self.append_record(rec)

        return sink

    def audit(self, since: int | None = None, *, job: str | None = None, limit: int | None = None,
              event: AuditEvent | None = None) -> list[AuditRecord]:
        """Audit records in id order; ``since`` is an id cursor (exclusive), not a time.

        Ids are strictly increasing and never reused, so a reader polling with the
        last id it saw gets every record exactly once; wall times may tie or step back.
        """
        sql = "SELECT * FROM audit WHERE id > ?"
        args: list[Any] = [since if since is not None else 0]
        if job is not None:
            sql += " AND job = ?"
            args.append(job)
        if event is not None:
            sql += " AND event = ?"
            args.append(AuditEvent(event).value)
        sql += " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        rows = self._conn().execute(sql, args).fetchall()
        return [AuditRecord(event=AuditEvent(r["event"]), job=r["job"], gpus=tuple(json.loads(r["gpus"])),
                            policy=r["policy"], model_version=r["model_version"], reason=r["reason"],
                            extra=json.loads(r["extra"]), time=r["time"], id=r["id"]) for r in rows]

    # ------------------------------------------------------------------ decisions
    def append_decision(self, kind: str, payload: dict[str, Any], *, applied: bool, job: str | None = None,
                        policy: str = "", model_version: str = "", reason: str = "") -> int:
        """Record one scheduler decision (applied or refused) for later analysis; returns its id."""
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO decisions (time, policy, model_version, kind, job, payload, applied, reason) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (self.clock(), policy, model_version, kind, job, dumps(payload), int(applied), reason),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def decisions(self, since: int | None = None) -> list[dict[str, Any]]:
        """Recorded decisions in id order (``since``: id cursor, exclusive)."""
        rows = self._conn().execute("SELECT * FROM decisions WHERE id > ? ORDER BY id", (since or 0,)).fetchall()
        return [{**dict(r), "payload": json.loads(r["payload"]), "applied": bool(r["applied"])} for r in rows]

    def last_audit_id(self) -> int:
        """The newest audit record's id (0 when there is none): where a reader of only new records starts."""
        row = self._conn().execute("SELECT MAX(id) FROM audit").fetchone()
        return int(row[0] or 0)

    def recent_decisions(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` recorded decisions, oldest first (a bounded read for dashboards)."""
        rows = self._conn().execute("SELECT * FROM decisions ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [{**dict(r), "payload": json.loads(r["payload"]), "applied": bool(r["applied"])} for r in reversed(rows)]

    # ------------------------------------------------------------------ jobs: reads
    def get(self, job_id: str) -> JobRecord | None:
        """One job, or None if unknown."""
        row = self._conn().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _record(row) if row is not None else None

    def jobs(self, states: Sequence[JobState | str] | None = None, *, finished_since: float | None = None,
             limit: int | None = None, before: int | None = None) -> list[JobRecord]:
        """Jobs in submission order, optionally only in ``states`` and finished at or after ``finished_since``.

        ``limit``: only the last ``limit`` matching jobs (read newest first by ``seq``, so the cost is bounded by
        the limit, not by the table); ``before``: only jobs with ``seq < before`` (a cursor to page back with:
        the ``seq`` of the first job of the previous page).
        """
        where: list[str] = []
        args: list[Any] = []
        if states is not None:
            vals = [JobState(s).value for s in states]
            where.append(f"state IN ({','.join('?' * len(vals))})")
            args += vals
        if finished_since is not None:
            where.append("finished_at >= ?")
            args.append(finished_since)
        if before is not None:
            where.append("seq < ?")
            args.append(min(int(before), 2**63 - 1))
        sql = "SELECT * FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        if limit is None:
            return [_record(r) for r in self._conn().execute(sql + " ORDER BY seq", args).fetchall()]
        n = max(0, int(limit))
        if states is None:
            rows = self._conn().execute(sql + " ORDER BY seq DESC LIMIT ?", [*args, n]).fetchall()
        else:
            # One index range per state, newest first (state IN (...) would read every matching row to sort
            # them): at most ``limit`` rows per state, merged.
            rows = []
            rest = where[1:]
            for state in dict.fromkeys(JobState(x).value for x in states):
                q = ("SELECT * FROM jobs INDEXED BY jobs_by_state WHERE state = ?"
                     + "".join(f" AND {w}" for w in rest) + " ORDER BY seq DESC LIMIT ?")
                rows += self._conn().execute(q, [state, *args[len(states):], n]).fetchall()
            rows = sorted(rows, key=lambda r: r["seq"], reverse=True)[:n]
        return [_record(r) for r in reversed(rows)]

    def queued(self) -> list[JobRecord]:
        """Queued jobs in submission order (policies impose their own order)."""
        return self.jobs([JobState.QUEUED])

    def running(self) -> list[JobRecord]:
        """Jobs in state ``running`` (see :meth:`holding` for everything with GPUs)."""
        return self.jobs([JobState.RUNNING])

    def holding(self) -> list[JobRecord]:
        """Running and preempted jobs: a process may exist and GPUs are held."""
        return self.jobs([JobState.RUNNING, JobState.PREEMPTED])

    def counts(self) -> dict[str, int]:
        """Jobs per state (every state present, zero included)."""
        out = {s.value: 0 for s in JobState}
        for r in self._conn().execute("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state"):
            out[r["state"]] = r["n"]
        return out

    # ------------------------------------------------------------------ retention
    def prune_finished(self, *, finished_before: float | None = None, keep: int | None = None,
                       limit: int = 500) -> list[PrunedJob]:
        """Delete up to ``limit`` finished jobs (done, failed, cancelled): those finished before
        ``finished_before``, and the oldest beyond the newest ``keep``; returns what was deleted.

        The candidates are found by index reads bounded by ``limit`` (outside any write transaction) and
        deleted in ONE short transaction that re-checks they are finished, so a caller sweeping a long history
        in batches never holds the write lock for long. Queued, running and preempted jobs are never
        touched; the audit trail is append-only and keeps their records.
        """
        terminal = [st.value for st in JobState if st.terminal]
        marks = ",".join("?" * len(terminal))
        conn = self._conn()
        seqs: set[int] = set()
        n = max(0, int(limit))
        if n and finished_before is not None:
            for st in terminal:
                seqs.update(r[0] for r in conn.execute(
                    "SELECT seq FROM jobs INDEXED BY jobs_by_finish WHERE state = ? AND finished_at < ? LIMIT ?",
                    (st, finished_before, n)))
        if n and keep is not None:
            total = conn.execute(f"SELECT COUNT(*) FROM jobs WHERE state IN ({marks})", terminal).fetchone()[0]
            excess = total - max(0, int(keep))
            if excess > 0:
                seqs.update(r[0] for r in conn.execute(
                    f"SELECT seq FROM jobs NOT INDEXED WHERE state IN ({marks}) ORDER BY seq LIMIT ?",
                    [*terminal, min(excess, n)]))
        chosen = sorted(seqs)[:n]
        if not chosen:
            return []
        where = f"seq IN ({','.join('?' * len(chosen))}) AND state IN ({marks})"
        with self._tx() as conn:
            rows = conn.execute(f"SELECT id, state, log_path FROM jobs WHERE {where}", [*chosen, *terminal]).fetchall()
            conn.execute(f"DELETE FROM jobs WHERE {where}", [*chosen, *terminal])
        return [PrunedJob(r["id"], JobState(r["state"]), r["log_path"]) for r in rows]

    def prune_decisions(self, before: float, limit: int = 500) -> int:
        """Delete up to ``limit`` of the oldest decision records made before ``before``; returns how many."""
        with self._tx() as conn:
            cur = conn.execute("DELETE FROM decisions WHERE id IN (SELECT id FROM decisions WHERE time < ? "
                               "ORDER BY id LIMIT ?)", (before, max(0, int(limit))))
        return int(cur.rowcount or 0)

    # ------------------------------------------------------------------ jobs: writes
    def submit(self, argv: Sequence[str], **request: Unpack[SubmitOptions]) -> str:
        """Queue a job and return its id (see :meth:`submit_record`; the default user is ``""``)."""
        req = JobRequest(argv, gpus=request.get("gpus"), mig=request.get("mig_profile"),
                         gpu_milli=request.get("gpu_milli", 1000), gpu_models=request.get("gpu_models", ()),
                         priority=request.get("priority", 0), user=request.get("user", ""),
                         preemptible=request.get("preemptible", False), deadline=request.get("deadline"),
                         idempotency_key=request.get("idempotency_key"))
        return self.submit_record(req)[0].id

    def submit_record(self, req: JobRequest) -> tuple[JobRecord, bool]:
        """Queue a job; returns its record and whether it is new (False: an idempotent retry).

        A request is either ``gpus`` whole GPUs (None: one), a fraction ``gpu_milli``
        of one GPU, or a MIG profile (``mig="3g.40gb"``, stored with the equivalent
        ``gpu_milli`` so feasibility picks that compute size).

        With ``idempotency_key``, a retried submission (client timed out, network
        dropped the answer) returns the first submission's id instead of queueing
        the job twice; the same key with a different request raises
        :class:`IdempotencyConflictError`.

        The request's option fields (``cpus``, ``memory_gib``, ``pool``...: what the
        scheduler service needs beyond the columns) are kept as the job's ``options``;
        they are part of the request an idempotency key is compared against.
        """
        argv = req.argv
        argv_t = [] if isinstance(argv, (str, bytes)) else list(argv)
        if not argv_t or not all(isinstance(a, str) for a in argv_t):
            raise StoreError("argv must be a non-empty list of strings (no shell command line)")
        gpus = 1 if req.gpus is None else req.gpus
        gpu_milli, mig_profile, gpu_models = req.gpu_milli, req.mig, req.gpu_models
        priority, user, preemptible, deadline = req.priority, req.user, req.preemptible, req.deadline
        idempotency_key = req.idempotency_key
        if mig_profile is not None:
            gpus, gpu_milli = 1, _milli_of_profile(mig_profile)
        if gpus < 0:
            raise StoreError(f"gpus must be >= 0, not {gpus}")
        if not 1 <= gpu_milli <= 1000 or (gpu_milli < 1000 and gpus != 1):
            raise StoreError("a fractional request (gpu_milli < 1000) asks for exactly one GPU")
        request = {"argv": argv_t, "gpus": gpus, "gpu_milli": gpu_milli, "mig_profile": mig_profile,
                   "gpu_models": sorted(gpu_models), "priority": priority, "user": user,
                   "preemptible": bool(preemptible), "deadline": deadline}
        options = req.options()
        opts = json.loads(dumps(options)) if options else {}
        if opts:
            request["options"] = opts
        now = self.clock()
        with self._tx() as conn:
            if idempotency_key is not None:
                row = conn.execute("SELECT * FROM jobs WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
                if row is not None:
                    if _request_of(_record(row)) != request:
                        raise IdempotencyConflictError(
                            f"idempotency key {idempotency_key!r} was used for job {row['id']} with a different request"
                        )
                    return _record(row), False
            job_id = f"j-{uuid.uuid4().hex[:16]}"
            cur = conn.execute(
                "INSERT INTO jobs (id, idempotency_key, argv, num_gpus, gpu_milli, mig_profile, gpu_models, priority, "
                "user, preemptible, deadline, state, submitted_at, options) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, idempotency_key, dumps(argv_t), gpus, gpu_milli, mig_profile, dumps(sorted(gpu_models)),
                 priority, user, int(bool(preemptible)), deadline, JobState.QUEUED.value, now, dumps(opts)),
            )
            self._audit(conn, AuditRecord(AuditEvent.SUBMISSION, job=job_id, time=now,
                                          extra={k: v for k, v in request.items() if k != "argv"}))
        assert cur.lastrowid is not None
        rec = JobRecord(id=job_id, seq=cur.lastrowid, argv=tuple(argv_t), num_gpus=gpus, gpu_milli=gpu_milli,
                        mig_profile=mig_profile, gpu_models=tuple(sorted(gpu_models)), priority=priority, user=user,
                        preemptible=bool(preemptible), deadline=deadline, state=JobState.QUEUED, attempts=0,
                        exit_code=None, submitted_at=now, started_at=None, finished_at=None, allocation=None,
                        pid=None, pid_start=None, log_path=None, cancel_requested=False, reason="",
                        idempotency_key=idempotency_key, options=opts)
        return rec, True

    def _transition(self, conn: sqlite3.Connection, job_id: str, allowed: Sequence[JobState], what: str) -> JobRecord:
        row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJobError(f"no job {job_id!r}")
        rec = _record(row)
        if rec.state not in allowed:
            raise InvalidTransitionError(
                f"cannot {what} job {job_id}: it is {rec.state.value} (needs {'|'.join(s.value for s in allowed)})"
            )
        return rec

    def mark_running(self, job_id: str, allocation: Allocation, pid: int | None, pid_start: int | None,
                     log_path: str | None = None, *, policy: str = "", model_version: str = "") -> JobRecord:
        """queued -> running with its allocation and process identity (pid + start time for re-adoption)."""
        if not allocation.node:
            raise StoreError("an allocation names at least its node")
        now = self.clock()
        with self._tx() as conn:
            rec = self._transition(conn, job_id, [JobState.QUEUED], "start")
            conn.execute(
                "UPDATE jobs SET state = ?, allocation = ?, pid = ?, pid_start = ?, log_path = ?, started_at = ?, "
                "attempts = attempts + 1, exit_code = NULL, finished_at = NULL, reason = '' "
                "WHERE id = ? AND state = ?",
                (JobState.RUNNING.value, allocation.to_json(), pid, pid_start, log_path, now, job_id,
                 JobState.QUEUED.value),
            )
            self._audit(conn, AuditRecord(AuditEvent.ALLOCATION, job=job_id, gpus=allocation.devices, policy=policy,
                                          model_version=model_version, time=now,
                                          extra={"node": allocation.node, "pid": pid, "attempt": rec.attempts + 1}))
        return self._must_get(job_id)

    def set_process(self, job_id: str, pid: int, pid_start: int, log_path: str | None = None) -> None:
        """Record the process of a running job (when it was marked running before the launch)."""
        with self._tx() as conn:
            self._transition(conn, job_id, [JobState.RUNNING, JobState.PREEMPTED], "attach a process to")
            conn.execute("UPDATE jobs SET pid = ?, pid_start = ?, log_path = COALESCE(?, log_path) WHERE id = ?",
                         (pid, pid_start, log_path, job_id))

    def preempt(self, job_id: str, reason: str = "priority", *, policy: str = "", model_version: str = "") -> JobRecord:
        """running -> preempted: a stop was requested; GPUs stay held until :meth:`requeue`/:meth:`mark_finished`."""
        now = self.clock()
        with self._tx() as conn:
            rec = self._transition(conn, job_id, [JobState.RUNNING], "preempt")
            conn.execute("UPDATE jobs SET state = ?, reason = ? WHERE id = ? AND state = ?",
                         (JobState.PREEMPTED.value, reason, job_id, JobState.RUNNING.value))
            self._audit(conn, AuditRecord(AuditEvent.PREEMPTION, job=job_id, gpus=_devices(rec), policy=policy,
                                          model_version=model_version, reason=reason, time=now,
                                          extra={"stage": "stopping"}))
        return self._must_get(job_id)

    def mark_finished(self, job_id: str, exit_code: int, reason: str = "") -> JobRecord:
        """running|preempted -> done (exit 0), failed (non-zero) or cancelled (if a cancel was requested)."""
        now = self.clock()
        with self._tx() as conn:
            rec = self._transition(conn, job_id, [JobState.RUNNING, JobState.PREEMPTED], "finish")
            if rec.cancel_requested:
                state = JobState.CANCELLED
            else:
                state = JobState.DONE if exit_code == 0 else JobState.FAILED
            conn.execute("UPDATE jobs SET state = ?, exit_code = ?, finished_at = ?, reason = ? WHERE id = ?",
                         (state.value, exit_code, now, reason, job_id))
            self._audit(conn, AuditRecord(AuditEvent.COMPLETION, job=job_id, gpus=_devices(rec), reason=reason,
                                          time=now, extra={"exit_code": exit_code, "state": state.value}))
        return self._must_get(job_id)

    def requeue(self, job_id: str, reason: str) -> JobRecord:
        """running|preempted -> queued (allocation and process cleared); cancelled instead if a cancel is pending.

        Used after a preemption completes, a node is lost, or a restarted service
        finds a job's process gone without an exit status.
        """
        now = self.clock()
        with self._tx() as conn:
            rec = self._transition(conn, job_id, [JobState.RUNNING, JobState.PREEMPTED], "requeue")
            state = JobState.CANCELLED if rec.cancel_requested else JobState.QUEUED
            if state is JobState.QUEUED:
                conn.execute("UPDATE jobs SET state = ?, allocation = NULL, pid = NULL, pid_start = NULL, "
                             "reason = ? WHERE id = ?", (state.value, reason, job_id))
            else:
                conn.execute("UPDATE jobs SET state = ?, finished_at = ?, reason = ? WHERE id = ?",
                             (state.value, now, reason, job_id))
            event = AuditEvent.PREEMPTION if state is JobState.QUEUED else AuditEvent.CANCEL
            self._audit(conn, AuditRecord(event, job=job_id, gpus=_devices(rec), reason=reason, time=now,
                                          extra={"stage": "requeued" if state is JobState.QUEUED else "stopped"}))
        return self._must_get(job_id)

    def cancel(self, job_id: str, reason: str = "user") -> JobState:
        """Cancel a job; returns its state afterwards.

        A queued job is cancelled at once. A running or preempted job only gets
        ``cancel_requested`` (its process must be stopped first, and its GPUs stay
        held until then); its final :meth:`mark_finished`/:meth:`requeue` makes it
        ``cancelled``. Cancelling a finished job changes nothing (idempotent).
        """
        now = self.clock()
        with self._tx() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise UnknownJobError(f"no job {job_id!r}")
            rec = _record(row)
            if rec.state.terminal:
                return rec.state
            if rec.state is JobState.QUEUED:
                conn.execute("UPDATE jobs SET state = ?, finished_at = ?, reason = ? WHERE id = ? AND state = ?",
                             (JobState.CANCELLED.value, now, reason, job_id, JobState.QUEUED.value))
                self._audit(conn, AuditRecord(AuditEvent.CANCEL, job=job_id, reason=reason, time=now))
                return JobState.CANCELLED
            if not rec.cancel_requested:
                conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
                self._audit(conn, AuditRecord(AuditEvent.CANCEL, job=job_id, gpus=_devices(rec), reason=reason,
                                              time=now, extra={"stage": "requested"}))
            return rec.state

    def _must_get(self, job_id: str) -> JobRecord:
        rec = self.get(job_id)
        if rec is None:  # pragma: no cover - rows are never deleted
            raise UnknownJobError(f"no job {job_id!r}")
        return rec

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> list[str]:
        """Violations of the store's invariants (empty when consistent); for tests and ``doctor``.

        Checks SQLite's own integrity, that every running/preempted job has an
        allocation, that queued jobs hold none, and that audit ids are strictly
        increasing with every job's submission audited.
        """
        conn = self._conn()
        problems: list[str] = []
        ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if ok != "ok":
            problems.append(f"integrity_check: {ok}")
        for r in conn.execute("SELECT id, state FROM jobs WHERE state IN ('running','preempted') "
                              "AND (allocation IS NULL OR allocation = '')"):
            problems.append(f"job {r['id']} is {r['state']} without an allocation")
        for r in conn.execute("SELECT id FROM jobs WHERE state = 'queued' AND allocation IS NOT NULL"):
            problems.append(f"job {r['id']} is queued but holds an allocation")
        # AUTOINCREMENT: the high-water mark only grows, so an id is never handed out twice.
        top = conn.execute("SELECT MAX(id) FROM audit").fetchone()[0]
        seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'audit'").fetchone()
        if top is not None and (seq is None or seq[0] < top):
            problems.append("audit id sequence is behind the largest id (ids could be reused)")
        for r in conn.execute("SELECT j.id FROM jobs j WHERE NOT EXISTS "
                              "(SELECT 1 FROM audit a WHERE a.job = j.id AND a.event = 'submission')"):
            problems.append(f"job {r['id']} has no submission audit record")
        return problems


def _split_sql(script: str) -> list[str]:
    """Statements of a migration script (triggers contain ';' inside BEGIN..END)."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


def _devices(rec: JobRecord) -> tuple[str, ...]:
    return rec.allocation.devices if rec.allocation is not None else ()


def _request_of(rec: JobRecord) -> dict[str, Any]:
    out = {"argv": list(rec.argv), "gpus": rec.num_gpus, "gpu_milli": rec.gpu_milli, "mig_profile": rec.mig_profile,
           "gpu_models": sorted(rec.gpu_models), "priority": rec.priority, "user": rec.user,
           "preemptible": rec.preemptible, "deadline": rec.deadline}
    if rec.options:
        out["options"] = dict(rec.options)
    return out


def _record(row: sqlite3.Row) -> JobRecord:
    alloc = row["allocation"]
    return JobRecord(
        id=row["id"], seq=row["seq"], argv=tuple(json.loads(row["argv"])), num_gpus=row["num_gpus"],
        gpu_milli=row["gpu_milli"], mig_profile=row["mig_profile"], gpu_models=tuple(json.loads(row["gpu_models"])),
        priority=row["priority"], user=row["user"], preemptible=bool(row["preemptible"]), deadline=row["deadline"],
        state=JobState(row["state"]), attempts=row["attempts"], exit_code=row["exit_code"],
        submitted_at=row["submitted_at"], started_at=row["started_at"], finished_at=row["finished_at"],
        allocation=Allocation.from_json(alloc) if alloc else None, pid=row["pid"], pid_start=row["pid_start"],
        log_path=row["log_path"], cancel_requested=bool(row["cancel_requested"]), reason=row["reason"],
        idempotency_key=row["idempotency_key"],
        options=json.loads(row["options"] or "{}"),
    )
