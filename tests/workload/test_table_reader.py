"""The shared row-per-job reader skeleton, driven by a minimal format."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.cluster.job import Job
from rlsched.errors import TraceError
from rlsched.workload._csvio import RowError, Tally, parse_float
from rlsched.workload.table_reader import read_table


class _Tiny:
    """``id,duration``: rows with duration 0 are dropped and counted, negative ones are bad."""

    what = "tiny trace"
    required = ("id", "duration")
    empty_message = "empty: expected a tiny header"
    no_rows_message: str | None = "no tiny rows"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def columns(self, src: str, header: list[str], index: dict[str, int]) -> int:
        self.calls.append("columns")
        self.i_id, self.i_dur = index["id"], index["duration"]
        return max(self.i_id, self.i_dur) + 1

    def parse_row(self, line: int, fields: list[str], tally: Tally) -> tuple[str, float] | None:
        duration = parse_float(fields[self.i_dur], "duration")
        if duration < 0:
            raise RowError("duration", "negative")
        if duration == 0:
            tally.skip("zero")
            return None
        return fields[self.i_id], duration

    def jobs(self, src: str, parsed: list[tuple[str, float]], tally: Tally) -> list[Job]:
        self.calls.append("jobs")
        return [Job(name, float(i), d, 1, duration_censored=name.endswith("*")) for i, (name, d) in enumerate(parsed)]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(text)
    return p


def test_good_rows_become_jobs_and_drops_are_counted(tmp_path: Path) -> None:
    fmt = _Tiny()
    tr = read_table(_write(tmp_path, "id,duration\na,5\nb,0\nc*,7\n"), fmt, skip_bad_rows=False)
    assert [j.job_id for j in tr.jobs] == ["a", "c*"]
    assert (tr.skipped_rows, tr.skip_reasons, tr.censored) == (1, {"zero": 1}, 1)
    assert fmt.calls == ["columns", "jobs"]


def test_short_and_bad_rows_raise_at_their_line(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r":3: row has 1 fields, the header has 2"):
        read_table(_write(tmp_path, "id,duration\na,5\nb\n"), _Tiny(), skip_bad_rows=False)
    with pytest.raises(TraceError, match=r":2 \(column duration\): negative"):
        read_table(_write(tmp_path, "id,duration\na,-1\n"), _Tiny(), skip_bad_rows=False)


def test_short_and_bad_rows_are_counted_when_skipped(tmp_path: Path) -> None:
    tr = read_table(_write(tmp_path, "id,duration\na,5\nb\nc,-1\nd,x\n"), _Tiny(), skip_bad_rows=True)
    assert [j.job_id for j in tr.jobs] == ["a"]
    assert tr.skip_reasons == {"bad row": 3}


def test_header_problems(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="empty: expected a tiny header"):
        read_table(_write(tmp_path, ""), _Tiny(), skip_bad_rows=False)
    with pytest.raises(TraceError, match=r"column duration.*missing required column of a tiny trace"):
        read_table(_write(tmp_path, "id\na\n"), _Tiny(), skip_bad_rows=False)
    with pytest.raises(TraceError, match="no tiny rows"):
        read_table(_write(tmp_path, "id,duration\n"), _Tiny(), skip_bad_rows=False)


def test_a_format_can_check_for_rows_itself(tmp_path: Path) -> None:
    fmt = _Tiny()
    fmt.no_rows_message = None
    tr = read_table(_write(tmp_path, "id,duration\n"), fmt, skip_bad_rows=False)
    assert tr.jobs == [] and fmt.calls == ["columns", "jobs"]
