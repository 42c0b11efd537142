"""The one skeleton of the row-per-job trace readers (Philly, openb pods, DLRM).

Every such reader opens the file, checks the header, walks the rows, reports a
short row or a bad field the same way (an error, or a ``"bad row"`` count with
``skip_bad_rows``), and turns what it parsed into a :class:`Trace`. Only the
parts that differ live in each format: which columns the header must have,
how one row becomes a record, and how the records become jobs. Keeping the
walk in one place keeps the error lines, the skip counts and the order of the
checks the same for every format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, TypeVar

from rlsched.cluster.job import Job
from rlsched.errors import TraceError
from rlsched.workload._csvio import RowError, Tally, header_index, no_gc, open_text, rows
from rlsched.workload.trace import Trace

R = TypeVar("R")


class TableFormat(Protocol[R]):
    """The per-format parts of a row-per-job reader; ``R`` is what one good row parses to.

    Attributes:
        what: the format's name in a missing-column error (``"Philly trace"``).
        required: columns the header must name.
        empty_message: the error for a file with no header row.
        no_rows_message: the error for a header without data rows, or None when the
            format checks that itself in :meth:`jobs`.
    """

    @property
    def what(self) -> str: ...
    @property
    def required(self) -> tuple[str, ...]: ...
    @property
    def empty_message(self) -> str: ...
    @property
    def no_rows_message(self) -> str | None: ...

    def columns(self, src: str, header: list[str], index: dict[str, int]) -> int:
        """Take the column positions from the header (checked for ``required``); return the
        number of fields a row needs. Raises a TraceError for a header the format cannot read."""
        ...

    def parse_row(self, line: int, fields: list[str], tally: Tally) -> R | None:
        """One row with enough fields: its record, or None for a row dropped on purpose
        (counted in ``tally`` when it should be). Raises RowError for a bad field."""
        ...

    def jobs(self, src: str, parsed: list[R], tally: Tally) -> list[Job]:
        """The jobs of the good rows, in file order."""
        ...


def read_table(path: str | Path, fmt: TableFormat[R], *, skip_bad_rows: bool) -> Trace:
    """Read a row-per-job CSV trace with the per-format parts of ``fmt``.

    Raises:
        TraceError: missing or empty file, a missing column, a short or bad row (unless
            ``skip_bad_rows``), or whatever the format rejects.
    """
    src = str(path)
    tally = Tally(src, skip_bad_rows)
    with no_gc():
        parsed = _parse_rows(path, fmt, tally)
        jobs = fmt.jobs(src, parsed, tally)
    return tally.trace(jobs)


def _parse_rows(path: str | Path, fmt: TableFormat[R], tally: Tally) -> list[R]:
    """The records of the file's good rows; short and bad rows go to ``tally`` (or raise)."""
    src = str(path)
    parsed: list[R] = []
    data_rows = 0
    with open_text(path) as fh:
        it = rows(fh, src)
        first = next(it, None)
        if first is None:
            raise TraceError(src, None, None, fmt.empty_message)
        header = first[1]
        need = fmt.columns(src, header, header_index(header, src, fmt.required, fmt.what))
        for line, fields in it:
            data_rows += 1
            if len(fields) < need:
                tally.bad(line, None, f"row has {len(fields)} fields, the header has {len(header)}")
                continue
            try:
                record = fmt.parse_row(line, fields, tally)
            except RowError as exc:
                tally.bad(line, exc.column, exc.message)
                continue
            if record is not None:
                parsed.append(record)
    if data_rows == 0 and fmt.no_rows_message is not None:
        raise TraceError(src, None, None, fmt.no_rows_message)
    return parsed
