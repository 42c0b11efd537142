"""The scheduler service's own job history as a canonical trace (``rlsched trace export``, ``GET /v1/trace``).

The service records every job in its SQLite store (:mod:`rlsched.runtime.store`): the request, the state,
the last attempt's start and finish, and an append-only audit trail with one ``allocation`` record per
attempt and a ``preemption`` record (stage ``requeued``) where an attempt was cut short. This module reads
them through a *read-only* SQLite connection (``mode=ro``), so an export never takes the write lock and
works while the service runs (WAL: readers never block the writer).

What a row says, and why:

* ``submit_time``: seconds since the first exported submission (FORMAT.md: same clock as ``deadline``);
  ``submitted_at_unix`` keeps the wall time.
* ``duration``: the run time of the job's **last attempt** (its start to its finish): the closest the
  history comes to "run time when it gets what it asked for, uninterrupted". Earlier attempts are kept
  apart: ``attempts``, ``restarts`` (attempts - 1) and ``run_s_total`` (every attempt's run time summed),
  so a replay can tell work lost to preemption from work the job needed.
* A job that is still running is exported with its run time so far and ``duration_censored = 1``; a job
  that never started (queued, or cancelled while queued) has no duration and is left out (counted in
  :attr:`HistoryExport.not_started`).
* ``outcome``: ``done``, ``failed``, ``cancelled`` or ``running``; ``exit_code`` and ``wait_s`` (submission to
  the first start) come with it. ``mig_profile`` names the MIG profile a job asked for (``gpu_milli`` holds the
  equivalent fraction the simulator reads).
* Command lines (``argv``) and working directories (``cwd``) are private to their owner and only written when
  asked for (``with_commands``); the store keeps no environments.

Extra columns are rlsched extensions; FORMAT.md readers ignore unknown columns, and
:func:`rlsched.workload.read_canonical` reads the file back as a trace.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlsched.cluster.job import Job
from rlsched.errors import RlschedError
from rlsched.posix import atomic_write

#: Columns of an exported history, in order (``argv`` and ``cwd`` only with commands).
COLUMNS = ("job_id", "submit_time", "duration", "num_gpus", "gpu_milli", "gpu_model", "priority", "user",
           "preemptible", "deadline", "duration_censored", "outcome", "exit_code", "attempts", "restarts",
           "run_s_total", "wait_s", "mig_profile", "submitted_at_unix")
COMMAND_COLUMNS = ("argv", "cwd")


class HistoryError(RlschedError):
    """The service's history cannot be read (no store in the state dir, unreadable database...)."""


@dataclass(frozen=True, slots=True)
class HistoryJob:
    """One job of the service's history, with what really happened to it.

    Attributes:
        job_id: the service's job id.
        submitted_at: submission, Unix seconds.
        first_start: the first attempt's start, Unix seconds.
        last_start: the last attempt's start.
        finished_at: the finish (None while running).
        num_gpus, gpu_milli, mig_profile, gpu_models, priority, user, preemptible: the request.
        deadline: the wanted completion, Unix seconds (None: none).
        outcome: ``done``, ``failed``, ``cancelled`` or ``running``.
        exit_code: the process's exit status (None while running or when unknown).
        attempts: how many times it was started.
        run_s_total: every attempt's run time, summed (seconds).
        argv, cwd: the command line and working directory (only read when commands are asked for).
    """

    job_id: str
    submitted_at: float
    first_start: float
    last_start: float
    finished_at: float | None
    num_gpus: int
    gpu_milli: int
    mig_profile: str | None
    gpu_models: tuple[str, ...]
    priority: int
    user: str
    preemptible: bool
    deadline: float | None
    outcome: str
    exit_code: int | None
    attempts: int
    run_s_total: float
    argv: tuple[str, ...] = ()
    cwd: str = ""

    @property
    def censored(self) -> bool:
        """Still running: its duration is a lower bound."""
        return self.finished_at is None

    def duration(self, now: float) -> float:
        """The last attempt's run time (so far, while it runs); never below a millisecond."""
        end = self.finished_at if self.finished_at is not None else now
        return max(end - self.last_start, 0.001)

    @property
    def wait_s(self) -> float:
        """Submission to the first start."""
        return max(self.first_start - self.submitted_at, 0.0)

    @property
    def jct_s(self) -> float | None:
        """Submission to finish (None while running)."""
        return None if self.finished_at is None else self.finished_at - self.submitted_at

    def missed_deadline(self) -> bool:
        """Finished after its deadline (a running job past it counts too)."""
        if self.deadline is None:
            return False
        return self.finished_at is None or self.finished_at > self.deadline


@dataclass
class HistoryExport:
    """The exported history: jobs in submission order, and what was left out.

    Attributes:
        jobs: the jobs that started at least once.
        t0: the first exported submission (Unix seconds): ``submit_time`` 0 of the trace.
        now: when the history was read.
        not_started: jobs of the window that never started (no duration to export), by state.
    """

    jobs: list[HistoryJob]
    t0: float
    now: float
    not_started: dict[str, int] = field(default_factory=dict)

    def to_jobs(self, *, include_running: bool = True) -> list[Job]:
        """The history as simulator jobs (submit times from ``t0``; censored durations marked)."""
        out = []
        for h in self.jobs:
            if h.censored and not include_running:
                continue
            out.append(Job(h.job_id, h.submitted_at - self.t0, h.duration(self.now), num_gpus=h.num_gpus,
                           gpu_milli=h.gpu_milli, gpu_models=frozenset(h.gpu_models), priority=h.priority,
                           user=h.user, preemptible=h.preemptible,
                           deadline=None if h.deadline is None else h.deadline - self.t0,
                           duration_censored=h.censored))
        return out


def db_path_of(state_dir: Path) -> Path:
    """The service's store in ``state_dir`` (``jobs.db``, as :attr:`ServiceConfig.db_path
    <rlsched.service.config.ServiceConfig.db_path>` names it), which must exist."""
    path = Path(state_dir) / "jobs.db"
    if not path.exists():
        raise HistoryError(f"{state_dir}: no service store here ({path.name} missing); is it a service state dir?")
    return path


def _connect(db: Path) -> sqlite3.Connection:
    """A read-only connection: never takes the write lock, never creates or migrates anything."""
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA query_only=ON")
        conn.execute("SELECT 1 FROM jobs LIMIT 1")
    except sqlite3.Error as exc:
        raise HistoryError(f"{db}: cannot read the service store ({exc})") from None
    return conn


def _attempt_runs(conn: sqlite3.Connection, since: float) -> dict[str, list[tuple[float, str, str]]]:
    """Per job, its attempt starts and ends from the audit trail: ``(time, event, stage)`` in order."""
    out: dict[str, list[tuple[float, str, str]]] = {}
    rows = conn.execute(
        "SELECT job, event, time, extra FROM audit WHERE event IN ('allocation', 'preemption', 'cancel') "
        "AND job IS NOT NULL AND time >= ? ORDER BY id", (since,))
    for r in rows:
        stage = ""
        if r["event"] != "allocation":
            try:
                stage = str(json.loads(r["extra"]).get("stage", ""))
            except (ValueError, AttributeError):
                stage = ""
        out.setdefault(r["job"], []).append((float(r["time"]), r["event"], stage))
    return out


def _run_total(events: Sequence[tuple[float, str, str]], last_start: float, end: float) -> tuple[float, float]:
    """(first start, total run seconds) of a job's attempts; the last one runs from ``last_start`` to ``end``."""
    total, cur, first = 0.0, None, None
    for t, event, stage in events:
        if event == "allocation":
            first = t if first is None else first
            cur = t
        elif cur is not None and stage in ("requeued", "stopped"):
            total += t - cur
            cur = None
    if cur is None or cur < last_start:
        cur = last_start
    total += max(end - cur, 0.0)
    return (first if first is not None else last_start), total


def read_history(db: Path, *, since_s: float | None = None, now: float | None = None,
                 with_commands: bool = False) -> HistoryExport:
    """The jobs submitted in the last ``since_s`` seconds (all when None) that started at least once.

    Raises:
        HistoryError: the store cannot be read.
    """
    now = time.time() if now is None else now
    since = 0.0 if since_s is None else now - since_s
    conn = _connect(Path(db))
    try:
        conn.execute("BEGIN")  # one snapshot: jobs and audit agree
        rows = conn.execute("SELECT * FROM jobs WHERE submitted_at >= ? ORDER BY submitted_at, seq",
                            (since,)).fetchall()
        events = _attempt_runs(conn, since)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise HistoryError(f"{db}: cannot read the service store ({exc})") from None
    finally:
        conn.close()
    jobs: list[HistoryJob] = []
    not_started: dict[str, int] = {}
    for r in rows:
        if r["started_at"] is None:
            not_started[r["state"]] = not_started.get(r["state"], 0) + 1
            continue
        finished = r["finished_at"] if r["state"] in ("done", "failed", "cancelled") else None
        end = finished if finished is not None else now
        first, total = _run_total(events.get(r["id"], ()), float(r["started_at"]), float(end))
        # sqlite3.Row's `in` looks at values, not column names
        options = json.loads(r["options"] or "{}") if with_commands and "options" in r.keys() else {}  # noqa: SIM118
        jobs.append(HistoryJob(
            job_id=r["id"], submitted_at=float(r["submitted_at"]), first_start=first,
            last_start=float(r["started_at"]), finished_at=None if finished is None else float(finished),
            num_gpus=int(r["num_gpus"]), gpu_milli=int(r["gpu_milli"]), mig_profile=r["mig_profile"],
            gpu_models=tuple(json.loads(r["gpu_models"] or "[]")), priority=int(r["priority"]), user=r["user"],
            preemptible=bool(r["preemptible"]), deadline=r["deadline"],
            outcome=r["state"] if finished is not None else "running", exit_code=r["exit_code"],
            attempts=max(int(r["attempts"]), 1), run_s_total=total,
            argv=tuple(json.loads(r["argv"])) if with_commands else (),
            cwd=str(options.get("cwd") or "") if with_commands else ""))
    t0 = jobs[0].submitted_at if jobs else now
    return HistoryExport(jobs, t0, now, not_started)


def _num(x: float) -> str:
    text = f"{x:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def history_rows(export: HistoryExport, *, with_commands: bool = False) -> Iterable[list[str]]:
    """The CSV rows (header first) of an exported history."""
    yield [*COLUMNS, *(COMMAND_COLUMNS if with_commands else ())]
    for h in export.jobs:
        row = [h.job_id, _num(h.submitted_at - export.t0), _num(h.duration(export.now)), str(h.num_gpus),
               "" if h.gpu_milli == 1000 else str(h.gpu_milli), "|".join(h.gpu_models), str(h.priority), h.user,
               "1" if h.preemptible else "0", "" if h.deadline is None else _num(h.deadline - export.t0),
               "1" if h.censored else "0", h.outcome, "" if h.exit_code is None else str(h.exit_code),
               str(h.attempts), str(h.attempts - 1), _num(h.run_s_total), _num(h.wait_s), h.mig_profile or "",
               _num(h.submitted_at)]
        if with_commands:
            row += [json.dumps(list(h.argv)), h.cwd]
        yield row


def history_csv(export: HistoryExport, *, with_commands: bool = False) -> str:
    """The exported history as canonical CSV text."""
    buf = io.StringIO(newline="")
    csv.writer(buf, lineterminator="\n").writerows(history_rows(export, with_commands=with_commands))
    return buf.getvalue()


def write_history(path: Path, export: HistoryExport, *, with_commands: bool = False) -> int:
    """Write the history to ``path`` (atomically; 0600 with commands, which are private); returns the rows."""
    text = history_csv(export, with_commands=with_commands)
    try:
        atomic_write(path, text, mode=0o600 if with_commands else 0o644)
    except OSError as exc:
        raise HistoryError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return len(export.jobs)
