"""Numbers no trace can mean (400 digits, 1e400, 5000-digit integers) in every reader and column.

Each must be a TraceError at the row's line and column, in one readable line, and
``skip_bad_rows`` must skip the row; before, a 400-digit ``num_gpus`` passed the
reader and raised OverflowError in whatever next turned it into a float.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rlsched.errors import TraceError
from rlsched.workload import read_canonical, read_dlrm_services, read_openb_pods, read_philly
from rlsched.workload.trace import Trace

HUGE = ["9" * 400, "-" + "9" * 400, "1e400", "9" * 5000, "99999999999999999999999"]

# reader, header, a good row, the numeric columns to poison
READERS: dict[str, tuple[Callable[..., Trace], list[str], list[str], list[str]]] = {
    "canonical": (read_canonical,
                  ["job_id", "submit_time", "duration", "num_gpus", "gpu_milli", "priority", "deadline", "cpus",
                   "mem_mib", "checkpoint_interval"],
                  ["a", "0", "100", "1", "1000", "0", "500", "4", "1024", "60"],
                  ["submit_time", "duration", "num_gpus", "gpu_milli", "priority", "deadline", "cpus", "mem_mib",
                   "checkpoint_interval"]),
    "philly": (read_philly, ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"],
               ["2017-10-09 07:01:55", "66.0", "1", "66.0", "vc"], ["duration", "num_gpus"]),
    "openb": (read_openb_pods,
              ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time",
               "scheduled_time"],
              ["p", "1000", "1024", "1", "500", "LS", "0", "100", "0"],
              ["cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time", "deletion_time",
               "scheduled_time"]),
    "dlrm": (read_dlrm_services,
             ["instance_sn", "app_name", "cpu_request", "gpu_request", "memory_request", "creation_time",
              "scheduled_time", "deletion_time"],
             ["i", "app", "12", "1", "120.0", "0", "10", "100"],
             ["cpu_request", "gpu_request", "memory_request", "creation_time", "scheduled_time", "deletion_time"]),
}
CASES = [(r, c, h) for r, (_f, _hd, _row, cols) in READERS.items() for c in cols for h in HUGE]


def _write(path: Path, header: list[str], good: list[str], bad: list[str]) -> Path:
    path.write_text("\n".join(",".join(r) for r in (header, good, bad)) + "\n")
    return path


@pytest.mark.parametrize(("reader", "column", "huge"), CASES, ids=[f"{r}-{c}-{len(h)}" for r, c, h in CASES])
def test_huge_number_is_a_located_error_or_a_skipped_row(tmp_path: Path, reader: str, column: str,
                                                         huge: str) -> None:
    read, header, good, _cols = READERS[reader]
    bad = list(good)
    bad[0] = bad[0] + "-2" if header[0] != "timestamp" else bad[0]
    bad[header.index(column)] = huge
    path = _write(tmp_path / f"{reader}.csv", header, good, bad)
    with pytest.raises(TraceError) as info:
        read(path)
    assert (info.value.line, info.value.column) == (3, column), str(info.value)
    assert len(str(info.value)) < 250 and "\n" not in str(info.value)
    trace = read(path, skip_bad_rows=True)
    assert len(trace.jobs) == 1 and trace.skipped_rows == 1
    assert trace.gpu_seconds() >= 0  # what `trace info` computes first: used to raise OverflowError


def test_trace_info_skips_a_400_digit_row(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rlsched.cli import commands  # noqa: F401  (registers every command)
    from rlsched.cli.app import app

    path = tmp_path / "t.csv"
    path.write_text("submit_time,duration,num_gpus\n0,100,1\n10,100," + "9" * 400 + "\n")
    res = CliRunner().invoke(app, ["trace", "info", str(path)])
    assert isinstance(res.exception, TraceError) and res.exception.line == 3  # main() prints it in one line
    res = CliRunner().invoke(app, ["trace", "info", "--skip-bad-rows", str(path)])
    assert res.exit_code == 0, res.output
    assert "1 bad row" in res.output
