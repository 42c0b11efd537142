"""Reader of the Microsoft Philly job table (``philly-2017/philly_jobs.csv``).

The table (the one the Pollux simulator replays) has one row per job:
``timestamp`` (submission, ``YYYY-MM-DD HH:MM:SS``), ``duration`` (s),
``num_gpus``, ``gpu_time`` (duration x num_gpus, redundant and ignored) and
``cluster`` (the virtual-cluster id).

Mapping, and why:

* ``submit_time`` is seconds since the earliest timestamp *of the selected rows*,
  so a per-VC trace starts at 0 like a whole-cluster one. Timestamps carry no
  time zone; they are subtracted as naive wall-clock times, so no DST shifts are
  introduced.
* ``user`` is the virtual cluster: in Philly a VC is a team with a GPU quota,
  which is exactly what fairness and quota policies key on.
* Philly requests are whole GPUs of unknown model: ``gpu_models`` stays empty
  (any model), ``gpu_milli`` 1000, priority 0.
* ``job_id`` is ``philly-<line>``: the table has no id column and the physical
  line is stable whatever VC filter is applied.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from rlsched.cluster.job import Job
from rlsched.errors import TraceError
from rlsched.workload._csvio import RowError, Tally, header_index, no_gc, open_text, parse_float, parse_int, rows, shown
from rlsched.workload.trace import Trace

REQUIRED = ("timestamp", "duration", "num_gpus", "cluster")
_EPOCH = datetime(1970, 1, 1)


def _timestamp(text: str) -> float:
    """Seconds of a naive ``YYYY-MM-DD HH:MM:SS`` since 1970 (no time-zone math)."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise RowError("timestamp", f"not a 'YYYY-MM-DD HH:MM:SS' timestamp: {shown(text)}") from None
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return (dt - _EPOCH).total_seconds()


def philly_virtual_clusters(path: str | Path) -> dict[str, int]:
    """Job count per virtual cluster, largest first (to pick a ``virtual_cluster``).

    Raises:
        TraceError: file missing or not a Philly table.
    """
    src = str(path)
    counts: dict[str, int] = {}
    with no_gc(), open_text(path) as fh:
        it = rows(fh, src)
        first = next(it, None)
        if first is None:
            raise TraceError(src, None, None, "empty file: expected a Philly header row")
        i_vc = header_index(first[1], src, REQUIRED, "Philly trace")["cluster"]
        for _line, f in it:
            if i_vc < len(f):
                vc = f[i_vc].strip()
                counts[vc] = counts.get(vc, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def read_philly(path: str | Path, *, virtual_cluster: str | None = None, skip_bad_rows: bool = False) -> Trace:
    """Read the Philly job table, optionally one virtual cluster only.

    Args:
        path: ``philly_jobs.csv`` or a file with the same columns.
        virtual_cluster: keep only this VC's jobs (``cluster`` column).
        skip_bad_rows: count malformed rows instead of raising.

    Raises:
        TraceError: missing file or column, a bad row (unless skipped), or a
            ``virtual_cluster`` with no jobs (the message lists the VCs there are).
    """
    src = str(path)
    tally = Tally(src, skip_bad_rows)
    parsed: list[tuple[int, float, float, int, str]] = []
    vcs: dict[str, int] = {}
    with no_gc(), open_text(path) as fh:
        it = rows(fh, src)
        first = next(it, None)
        if first is None:
            raise TraceError(src, None, None, "empty file: expected a Philly header row and job rows")
        idx = header_index(first[1], src, REQUIRED, "Philly trace")
        i_ts, i_dur, i_ng, i_vc = idx["timestamp"], idx["duration"], idx["num_gpus"], idx["cluster"]
        need = max(i_ts, i_dur, i_ng, i_vc) + 1
        for line, f in it:
            if len(f) < need:
                tally.bad(line, None, f"row has {len(f)} fields, the header has {len(first[1])}")
                continue
            vc = f[i_vc].strip()
            vcs[vc] = vcs.get(vc, 0) + 1
            if virtual_cluster is not None and vc != virtual_cluster:
                continue
            try:
                ts = _timestamp(f[i_ts])
                duration = parse_float(f[i_dur], "duration")
                if duration <= 0:
                    raise RowError("duration", f"duration must be > 0, got {duration:g}")
                ngpu = parse_int(f[i_ng], "num_gpus")
                if ngpu < 0:
                    raise RowError("num_gpus", f"num_gpus must be >= 0, got {ngpu}")
            except RowError as exc:
                tally.bad(line, exc.column, exc.message)
                continue
            parsed.append((line, ts, duration, ngpu, vc))
    if not vcs:
        raise TraceError(src, None, None, "no job rows: the file has only a header")
    if virtual_cluster is not None and virtual_cluster not in vcs:
        known = ", ".join(f"{k} ({v})" for k, v in sorted(vcs.items(), key=lambda kv: -kv[1]))
        raise TraceError(src, None, "cluster", f"no jobs for virtual cluster {shown(virtual_cluster)}; known: {known}")
    t0 = min((p[1] for p in parsed), default=0.0)
    jobs = [Job(f"philly-{line}", ts - t0, duration, ngpu, user=vc) for line, ts, duration, ngpu, vc in parsed]
    return Trace(jobs, source=src, skipped_rows=tally.skipped, skip_reasons=tally.reasons)
