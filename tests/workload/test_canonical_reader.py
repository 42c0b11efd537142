"""The canonical job-trace CSV: happy path, every kind of bad input, round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.cluster.job import Job, JobKind
from rlsched.errors import TraceError
from rlsched.workload import read_canonical, write_canonical

HEADER = "job_id,submit_time,duration,num_gpus,gpu_milli,gpu_model,priority,user,preemptible,deadline"


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_reads_all_columns_sorted_and_resolves_models(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        HEADER + ",extra\n"
        "b,20,100,2,,V100M32|t4,3,alice,1,500,zzz\n"
        "a,10.5,50,1,250,,,bob,0,,\n"
        "c,10.5,7,0,,,,,,,\n",
    )
    tr = read_canonical(p)
    assert [j.job_id for j in tr.jobs] == ["a", "c", "b"]  # sorted, ties keep file order
    a, c, b = tr.jobs
    assert a.fractional and a.gpu_milli == 250 and a.gpu_demand == 0.25 and a.user == "bob"
    assert b.gpu_models == frozenset({"V100-32GB", "T4"})
    assert (b.priority, b.preemptible, b.deadline) == (3, True, 500.0)
    assert c.num_gpus == 0  # CPU-only rows are kept, not errors
    assert tr.skipped_rows == 0 and tr.censored == 0
    assert tr.start == 10.5 and tr.end == 120.0
    assert tr.gpu_seconds() == pytest.approx(0.25 * 50 + 2 * 100)


def test_minimal_columns_and_row_number_ids(tmp_path: Path) -> None:
    p = _write(tmp_path, "duration,submit_time,num_gpus\n5,1,1\n\n6,0,2.0\n")
    tr = read_canonical(p)
    assert [(j.job_id, j.num_gpus) for j in tr.jobs] == [("2", 2), ("1", 1)]
    assert all(j.gpu_milli == 1000 and j.gpu_models == frozenset() for j in tr.jobs)


@pytest.mark.parametrize(
    ("row", "line", "column", "fragment"),
    [
        ("x,abc,10,1,,,,,,", 3, "submit_time", "not a number: 'abc'"),
        ("x,1,-5,1,,,,,,", 3, "duration", "duration must be > 0, got -5"),
        ("x,1,0,1,,,,,,", 3, "duration", "duration must be > 0"),
        ("x,1,nan,1,,,,,,", 3, "duration", "finite"),
        ("x,1,10,1.5,,,,,,", 3, "num_gpus", "not an integer"),
        ("x,1,10,-1,,,,,,", 3, "num_gpus", ">= 0"),
        ("x,1,10,1,1001,,,,,", 3, "gpu_milli", "gpu_milli must be in 1..1000, got 1001"),
        ("x,1,10,1,0,,,,,", 3, "gpu_milli", "1..1000"),
        ("x,1,10,1,,B200,,,,", 3, "gpu_model", "unknown GPU model 'B200'"),
        ("x,1,10,1,,,high,,,", 3, "priority", "not an integer"),
        ("x,1,10,1,,,,,maybe,", 3, "preemptible", "0 or 1"),
        ("x,1,10,1,,,,,,soon", 3, "deadline", "not a number"),
        ("a,1,10,1,,,,,,", 3, "job_id", "duplicate job_id 'a' (first on line 2)"),
        ("x,1,10", 3, None, "row has 3 fields"),
    ],
)
def test_bad_rows_name_file_line_and_column(
    tmp_path: Path, row: str, line: int, column: str | None, fragment: str
) -> None:
    p = _write(tmp_path, f"{HEADER}\na,0,1,1,,,,,,\n{row}\n")
    with pytest.raises(TraceError) as info:
        read_canonical(p)
    err = info.value
    assert (err.path, err.line, err.column) == (str(p), line, column)
    assert fragment in str(err)
    where = f"{p}:{line}" + (f" (column {column})" if column else "")
    assert str(err).startswith(where)


def test_physical_line_counts_blank_lines_and_multiline_fields(tmp_path: Path) -> None:
    p = _write(tmp_path, 'job_id,submit_time,duration,num_gpus,user\n\n"a",0,1,1,"two\nlines"\nb,0,-1,1,x\n')
    with pytest.raises(TraceError) as info:
        read_canonical(p)
    assert info.value.line == 5 and info.value.column == "duration"


def test_missing_required_column(tmp_path: Path) -> None:
    p = _write(tmp_path, "job_id,submit_time,num_gpus\na,0,1\n")
    with pytest.raises(TraceError) as info:
        read_canonical(p)
    assert (info.value.line, info.value.column) == (1, "duration")
    assert "missing required column" in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"), [("", "empty file"), ("\n\n", "empty file"), (HEADER + "\n", "only a header")]
)
def test_empty_and_header_only(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(TraceError, match=fragment):
        read_canonical(_write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="file not found"):
        read_canonical(tmp_path / "nope.csv")


def test_skip_bad_rows_counts_instead_of_raising(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        f"{HEADER}\na,0,1,1,,,,,,\nb,0,-1,1,,,,,,\nc,x,1,1,,,,,,\na,0,1,1,,,,,,\nd,0,1,1,,H100,,,,\n",
    )
    tr = read_canonical(p, skip_bad_rows=True)
    assert [j.job_id for j in tr.jobs] == ["a", "d"]
    assert tr.skipped_rows == 3 and tr.skip_reasons == {"bad row": 3}
    assert tr.jobs[1].gpu_models == frozenset({"H100-80GB"})


def test_cpu_only_gpu_milli_zero_is_accepted(tmp_path: Path) -> None:
    tr = read_canonical(_write(tmp_path, "submit_time,duration,num_gpus,gpu_milli\n0,1,0,0\n"))
    assert tr.jobs[0].num_gpus == 0 and tr.jobs[0].gpu_milli == 1000


def test_round_trip_is_lossless(tmp_path: Path) -> None:
    jobs = [
        Job("a", 0.1 + 0.2, 1 / 3, 1, 143, frozenset({"A100-80GB", "H100-80GB"}), 2, "team,x", True, 99.5),
        Job("b", 1e9 + 0.5, 7.0, 8, user='q"uote'),
        Job("c", 3.0, 12.25, 0, cpus=1.5, mem_mib=2048, kind=JobKind.SERVICE, checkpoint_interval=600.0),
        Job("d", 4.0, 5.0, 2, duration_censored=True, deadline=-1.0),
    ]
    p = tmp_path / "out.csv"
    assert write_canonical(p, jobs) == 4
    tr = read_canonical(p)
    assert tr.jobs == sorted(jobs, key=lambda j: j.submit_time)
    assert tr.censored == 1


def test_writer_keeps_simple_traces_simple(tmp_path: Path) -> None:
    p = tmp_path / "out.csv"
    write_canonical(p, [Job("a", 0.0, 5.0, 1)])
    assert p.read_text().splitlines() == ["job_id,submit_time,duration,num_gpus", "a,0,5,1"]


def test_writer_reports_unwritable_destination(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot write"):
        write_canonical(tmp_path / "missing-dir" / "out.csv", [Job("a", 0.0, 5.0)])
