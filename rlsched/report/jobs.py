"""How ``rlsched status`` and ``rlsched audit`` show jobs and audit records on a terminal.

Pure functions from the service's JSON (job and audit dicts) to text and rich
tables, so they are tested without a service. Every string that comes from a job,
the service or the backend goes through :mod:`rlsched.report.terminal` (control
characters escaped, no rich markup). Device UUIDs are never split across lines:
the column that holds them is at least as wide as its longest UUID and wraps only
between UUIDs.

Times in the job table:

* ``AGE`` - time since the job was submitted (until now, whatever its state), as
  in ``kubectl get``.
* ``RUNTIME`` - how long its last run lasted: from its last start until it ended,
  or until now while it runs; ``-`` for a job that never started.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from rlsched.report.terminal import cell, escape_control, shell_join

#: The job table's columns (``AGE`` and ``RUNTIME`` are defined in the module doc).
STATUS_COLUMNS = ("JOB", "STATE", "USER", "PRI", "REQUEST", "DEVICES", "AGE", "RUNTIME", "WHY / EXIT")
AUDIT_COLUMNS = ("ID", "TIME", "EVENT", "JOB", "DEVICES", "POLICY", "REASON")


def timestamp(t: Any) -> str:
    """Local time ``YYYY-MM-DD HH:MM:SS`` of a Unix time, ``-`` when there is none."""
    if not isinstance(t, (int, float)) or t <= 0:
        return "-"
    try:
        return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return "-"


def duration(start: Any, end: Any = None, *, now: float | None = None) -> str:
    """``end - start`` (``end`` defaults to now) as ``42s``, ``5m07s``, ``3h02m`` or ``2d04h``.

    ``-`` when there is no start time.
    """
    if not isinstance(start, (int, float)) or start <= 0:
        return "-"
    stop = end if isinstance(end, (int, float)) and end > 0 else (time.time() if now is None else now)
    s = max(0.0, stop - start)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s // 60:.0f}m{s % 60:02.0f}s"
    if s < 86400:
        return f"{s // 3600:.0f}h{(s % 3600) // 60:02.0f}m"
    return f"{s // 86400:.0f}d{(s % 86400) // 3600:02.0f}h"


def request_of(j: dict[str, Any]) -> dict[str, Any]:
    """The job's request (argv, gpus, mig, deadline...): ``j["request"]`` or the job itself."""
    r = j.get("request")
    return r if isinstance(r, dict) else j


def request_text(j: dict[str, Any]) -> str:
    """``2 GPUs`` or ``mig 3g.40gb``."""
    r = request_of(j)
    if r.get("mig"):
        return f"mig {escape_control(r['mig'])}"
    n = r.get("gpus")
    return f"{n} GPU" + ("s" if n != 1 else "") if n is not None else "-"


def _allocation(j: dict[str, Any]) -> dict[str, Any]:
    a = j.get("allocation")
    return a if isinstance(a, dict) else {}


def devices_text(j: dict[str, Any]) -> str:
    """``node: UUID, UUID`` (``node: ...; node: ...`` for a gang over several nodes; control characters
    escaped); ``-`` when the job holds nothing."""
    a = _allocation(j)
    devs = a.get("devices") or j.get("devices") or []
    if not devs:
        return "-"
    groups = a.get("by_node")
    if isinstance(groups, dict) and len(groups) > 1:  # a gang over several nodes: each node's own devices
        return escape_control("; ".join(f"{n}: " + ", ".join(str(d) for d in ds) for n, ds in groups.items()))
    node = a.get("node") or ""
    return escape_control((f"{node}: " if node else "") + ", ".join(str(d) for d in devs))


def why_text(j: dict[str, Any]) -> str:
    """Queued: ``#position reason``; ended: ``exit N, reason``; otherwise the reason (or ``-``)."""
    state = j.get("state")
    reason = j.get("reason") or ""
    if state == "queued":
        pos = j.get("position")
        head = f"#{pos} " if pos is not None else ""
        text = f"{head}{reason}".strip() or "-"
    elif state in ("done", "failed", "cancelled"):
        code = j.get("exit_code")
        bits = [f"exit {code}" if code is not None else "", reason or j.get("last_reason") or ""]
        text = ", ".join(str(b) for b in bits if b) or "-"
    else:
        text = reason or "-"
    return escape_control(text)


def _unbreakable_width(texts: Sequence[str], floor: int) -> int:
    """The longest space-free run in ``texts`` (a UUID with its comma), at least ``floor``."""
    return max([floor, *(len(w) for t in texts for w in t.split())])


def _job_table(columns: Sequence[str], rows: Sequence[Sequence[Text]], no_wrap: set[str]) -> Table:
    """A borderless table whose DEVICES column is never narrower than its longest UUID (so none is split),
    whose ``no_wrap`` columns keep their cells on one line and whose other columns fold."""
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    dev = columns.index("DEVICES")
    dev_width = _unbreakable_width([r[dev].plain for r in rows], len("DEVICES"))
    for col in columns:
        if col == "DEVICES":
            table.add_column(col, min_width=dev_width, overflow="fold")
        elif col in no_wrap:
            table.add_column(col, no_wrap=True)
        else:
            table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(*r)
    return table


def status_table(jobs: Sequence[dict[str, Any]], *, now: float | None = None) -> Table:
    """The job list of ``rlsched status``: one row per job (see the module doc for AGE and RUNTIME)."""
    rows = []
    for j in jobs:
        started = j.get("started_at") if j.get("state") != "queued" else None
        end = j.get("finished_at") if j.get("state") in ("done", "failed", "cancelled", "preempted") else None
        rows.append((
            cell(j.get("id")), cell(j.get("state")), cell(j.get("user") or "-"), cell(j.get("priority", "-")),
            Text(request_text(j)), Text(devices_text(j)), Text(duration(j.get("submitted_at"), now=now)),
            Text(duration(started, end, now=now)), Text(why_text(j)),
        ))
    return _job_table(STATUS_COLUMNS, rows, {"JOB", "STATE", "PRI", "AGE", "RUNTIME"})


def job_detail(j: dict[str, Any]) -> list[tuple[str, str]]:
    """``rlsched status JOB``: (field, value) pairs, every value safe to print."""
    req = request_of(j)
    rows: list[tuple[str, Any]] = [
        ("job", j.get("id")), ("state", j.get("state")), ("user", j.get("user")), ("priority", j.get("priority")),
        ("request", request_text(j)), ("command", shell_join(req.get("argv") or []) or "-"),
    ]
    if j.get("state") == "queued":
        rows += [("position", j.get("position", "-")), ("reason", j.get("reason") or "-")]
    else:
        rows += [("allocation", devices_text(j)), ("pid", j.get("pid") or "-"),
                 ("exit code", j.get("exit_code") if j.get("exit_code") is not None else "-"),
                 ("reason", j.get("reason") or j.get("last_reason") or "-")]
    rows += [("attempts", j.get("attempts", "-")), ("submitted", timestamp(j.get("submitted_at"))),
             ("started", timestamp(j.get("started_at"))), ("finished", timestamp(j.get("finished_at")))]
    if req.get("deadline"):
        rows.append(("deadline", timestamp(req.get("deadline"))))
    return [(k, escape_control(v if v is not None else "-")) for k, v in rows]


def job_detail_text(j: dict[str, Any]) -> str:
    """:func:`job_detail` as aligned ``field  value`` lines."""
    rows = job_detail(j)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def audit_table(records: Sequence[dict[str, Any]]) -> Table:
    """The audit trail of ``rlsched audit``: one row per record, devices whole."""
    rows = []
    for r in records:
        policy = str(r.get("policy") or "")
        if r.get("model_version"):
            policy += f"@{r['model_version']}"
        devices = ", ".join(str(g) for g in (r.get("gpus") or [])) or "-"
        rows.append((cell(r.get("id")), Text(timestamp(r.get("time"))), cell(r.get("event")),
                     cell(r.get("job") or "-"), cell(devices), cell(policy or "-"), cell(r.get("reason") or "-")))
    return _job_table(AUDIT_COLUMNS, rows, {"ID", "TIME", "EVENT", "JOB"})
