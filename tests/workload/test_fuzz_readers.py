"""Property-based fuzzing of every trace reader: a Trace or one TraceError, never a traceback or a hang.

Files are built from each reader's own columns (sometimes dropped or repeated) and
cells drawn from hostile values (400-digit and 5000-digit numbers, 1e400, NaN,
infinities, dates, quotes, commas, newlines, NUL, other scripts) plus random text.
Each read must end within a CPU-time budget and a memory budget, with
``skip_bad_rows`` off (a TraceError naming the file) and on (a Trace, or a
TraceError only for file-level problems such as a missing column). The example
counts are small so that the test runs in CI in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlsched.errors import TraceError
from rlsched.workload import load_trace, read_canonical, read_dlrm_services, read_openb_pods, read_philly
from rlsched.workload.trace import Trace
from tests.budget import within_budget

# reader, columns, a valid row (rows are mostly this row with a few cells replaced)
READERS: dict[str, tuple[Callable[..., Trace], list[str], list[str]]] = {
    "canonical": (read_canonical, ["job_id", "submit_time", "duration", "num_gpus", "gpu_milli", "gpu_model",
                                   "priority", "user", "preemptible", "deadline", "cpus", "mem_mib", "kind",
                                   "checkpoint_interval", "duration_censored"],
                  ["j", "0", "100", "1", "1000", "A100", "0", "u", "1", "500", "4", "1024", "batch", "60", "0"]),
    "philly": (read_philly, ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"],
               ["2017-10-09 07:01:55", "66.0", "1", "66.0", "vc"]),
    "openb": (read_openb_pods, ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
                                "pod_phase", "creation_time", "deletion_time", "scheduled_time"],
              ["p", "1000", "1024", "1", "500", "", "LS", "Running", "0", "100", "0"]),
    "dlrm": (read_dlrm_services, ["instance_sn", "role", "app_name", "cpu_request", "gpu_request",
                                  "memory_request", "creation_time", "scheduled_time", "deletion_time"],
             ["i", "HN", "app", "12", "1", "120.0", "0", "10", "100"]),
}

HUGE = ["9" * 400, "-" + "9" * 400, "9" * 5000, "1e400", "-1e400", "1e308", "99999999999999999999999"]
HOSTILE = ["0", "1", "-1", "2.0", "2.5", "1000", "0.5", "nan", "NaN", "inf", "-inf", "Infinity", "", " ", "None",
           "null", "true", "1|2", "A100",
           "V100-16GB|T4", "LS", "BE", "Running", "2017-10-09 07:01:55", "2017-13-45 99:99:99", "9999-12-31 23:59:59",
           '"quoted, with comma"', '"multi\nline"', "\x00", "é", "日本", "0x10", "1_000", "+5", "  7  ", "1e3"]
CELL = st.one_of(st.sampled_from(HUGE), st.sampled_from(HOSTILE), st.text(max_size=12))
#: per read: seconds of CPU and bytes of Python allocations (a few rows cannot need more)
CPU_BUDGET_S = 5.0
MEMORY_BUDGET = 64 * 2**20


def _cell(text: str) -> str:
    if text.startswith('"') and text.endswith('"') and len(text) > 1:
        return text  # already a quoted CSV field
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


@st.composite
def _mutated_row(draw: st.DrawFn, valid: list[str]) -> list[str]:
    row = list(valid)
    for _ in range(draw(st.integers(1, 2))):
        row[draw(st.integers(0, len(row) - 1))] = draw(CELL)
    row[0] = row[0] + str(draw(st.integers(0, 10**6)))  # distinct ids, unless a cell replaced it
    return row


@st.composite
def trace_files(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(st.sampled_from(sorted(READERS)))
    _read, columns, valid = READERS[name]
    if draw(st.integers(0, 4)) == 0:  # columns dropped, repeated or reordered, rows of random cells
        columns = draw(st.lists(st.sampled_from(columns), min_size=1, max_size=len(columns) + 2))
        rows = draw(st.lists(st.lists(CELL, min_size=len(columns) - 1, max_size=len(columns) + 1), max_size=6))
    else:  # the reader's own columns, valid rows with a cell or two replaced
        rows = draw(st.lists(st.one_of(st.just(valid), _mutated_row(valid)), min_size=1, max_size=6))
    lines = [",".join(columns)] + [",".join(_cell(c) for c in row) for row in rows]
    return name, "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n", "\n\n"]))


def _bounded(fn: Callable[[], object]) -> object:
    """Run ``fn`` and check that it stayed within this module's CPU and memory budgets."""
    return within_budget(fn, CPU_BUDGET_S, MEMORY_BUDGET, "read")


def _read(fn: Callable[[], Trace]) -> Trace | TraceError:
    try:
        return fn()
    except TraceError as exc:
        assert "\n" not in str(exc).strip() or "multi" in str(exc), str(exc)
        return exc


def _known(name: str, column: str, value: str) -> tuple[str, str]:
    """A reader's valid row twice, the second with ``column`` set to ``value`` (a regression example)."""
    _read, columns, valid = READERS[name]
    bad = list(valid)
    bad[0] += "2" if name != "philly" else ""
    bad[columns.index(column)] = value
    return name, "\n".join(",".join(r) for r in (columns, valid, bad)) + "\n"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace_files())
@example(_known("canonical", "num_gpus", "9" * 400))  # was an OverflowError traceback (issue 17 item 15)
@example(_known("philly", "num_gpus", "9" * 400))
@example(_known("openb", "num_gpu", "9" * 400))
@example(_known("dlrm", "memory_request", "1e308"))
def test_trace_readers_never_crash_or_hang(tmp_path_factory: object, case: tuple[str, str]) -> None:
    name, text = case
    read = READERS[name][0]
    path = Path(str(tmp_path_factory.mktemp("fuzz"))) / f"{name}.csv"  # type: ignore[attr-defined]
    path.write_text(text, encoding="utf-8", newline="")
    strict = _bounded(lambda: _read(lambda: read(path)))
    lenient = _bounded(lambda: _read(lambda: read(path, skip_bad_rows=True)))
    if isinstance(strict, Trace):
        assert isinstance(lenient, Trace) and len(lenient.jobs) == len(strict.jobs)
    if isinstance(lenient, Trace):
        for job in lenient.jobs:  # what every consumer computes first
            assert job.gpu_demand * job.duration >= 0
        assert lenient.gpu_seconds() >= 0
    detected = _bounded(lambda: _read(lambda: load_trace(path, skip_bad_rows=True)))
    assert isinstance(detected, Trace | TraceError)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.sampled_from(sorted(READERS)))
def test_trace_readers_on_random_bytes(tmp_path_factory: object, data: bytes, name: str) -> None:
    read, columns, _valid = READERS[name]
    path = Path(str(tmp_path_factory.mktemp("fuzz"))) / f"{name}.csv"  # type: ignore[attr-defined]
    path.write_bytes(",".join(columns).encode() + b"\n" + data)
    result = _bounded(lambda: _read(lambda: read(path, skip_bad_rows=True)))
    assert isinstance(result, Trace | TraceError)
