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
from rlsched.workload.table_reader import read_table
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
    return read_table(path, _PhillyTable(virtual_cluster), skip_bad_rows=skip_bad_rows)


#: One good row: (physical line, submission since 1970, duration, GPUs, virtual cluster).
_PhillyRow = tuple[int, float, float, int, str]


class _PhillyTable:
    """The Philly parts of :func:`~rlsched.workload.table_reader.read_table`.

    Rows of every virtual cluster are counted (an unknown ``virtual_cluster`` is reported
    with the ones there are); only the selected cluster's rows are parsed.
    """

    what = "Philly trace"
    required = REQUIRED
    empty_message = "empty file: expected a Philly header row and job rows"
    no_rows_message = None  # checked in jobs(): a file whose rows are all short has no job rows either

    def __init__(self, virtual_cluster: str | None) -> None:
        self.virtual_cluster = virtual_cluster
        self.vcs: dict[str, int] = {}
        self.i_ts = self.i_dur = self.i_ng = self.i_vc = 0

    def columns(self, src: str, header: list[str], index: dict[str, int]) -> int:
        """Positions of the four used columns; a row needs all of them."""
        self.i_ts, self.i_dur, self.i_ng, self.i_vc = (index[c] for c in REQUIRED)
        return max(self.i_ts, self.i_dur, self.i_ng, self.i_vc) + 1

    def parse_row(self, line: int, fields: list[str], tally: Tally) -> _PhillyRow | None:
        """The row's job fields, or None for another virtual cluster's row."""
        vc = fields[self.i_vc].strip()
        self.vcs[vc] = self.vcs.get(vc, 0) + 1
        if self.virtual_cluster is not None and vc != self.virtual_cluster:
            return None
        ts = _timestamp(fields[self.i_ts])
        duration = parse_float(fields[self.i_dur], "duration")
        if duration <= 0:
            raise RowError("duration", f"duration must be > 0, got {duration:g}")
        ngpu = parse_int(fields[self.i_ng], "num_gpus")
        if ngpu < 0:
            raise RowError("num_gpus", f"num_gpus must be >= 0, got {ngpu}")
        return line, ts, duration, ngpu, vc

    def jobs(self, src: str, parsed: list[_PhillyRow], tally: Tally) -> list[Job]:
        """Jobs submitted relative to the earliest selected row, after the checks that need every row."""
        if not self.vcs:
            raise TraceError(src, None, None, "no job rows: the file has only a header")
        if self.virtual_cluster is not None and self.virtual_cluster not in self.vcs:
            known = ", ".join(f"{k} ({v})" for k, v in sorted(self.vcs.items(), key=lambda kv: -kv[1]))
            raise TraceError(src, None, "cluster",
                             f"no jobs for virtual cluster {shown(self.virtual_cluster)}; known: {known}")
        t0 = min((p[1] for p in parsed), default=0.0)
        return [Job(f"philly-{line}", ts - t0, duration, ngpu, user=vc) for line, ts, duration, ngpu, vc in parsed]
