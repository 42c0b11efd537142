"""Shared plumbing of the trace readers: opening files, headers, numbers, bad rows.

Every reader reports problems the same way: a :class:`~rlsched.errors.TraceError`
naming the file, the 1-based *physical* line where the row starts and the column,
so that a user can open the file at that line and fix it. With ``skip_bad_rows``
the same problems are counted instead, because a long real trace with a handful of
broken rows is still worth replaying, but never silently.
"""

from __future__ import annotations

import csv
import gc
import gzip
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from rlsched.cluster.catalog import CATALOG, resolve_model_name
from rlsched.cluster.job import Job
from rlsched.errors import TraceError
from rlsched.workload.trace import Trace

#: Strings that real traces use for "no value" in numeric time columns.
MISSING = frozenset({"", "nan", "NaN", "NAN", "None", "null", "NULL"})

#: skip_reasons key for a row that breaks the format and was skipped on request.
BAD_ROW = "bad row"

#: Largest integer a trace field may hold: every integer up to it is exact as a float, so
#: arithmetic mixing it with times never overflows or rounds (a 400-digit count would).
MAX_INT = 2**53
#: Largest magnitude of a float field: above nanoseconds since 1970, far beyond any real time,
#: duration, CPU or memory figure, and small enough that sums and products stay finite.
MAX_FLOAT = 1e19
#: Longest cell text quoted in an error message; longer cells are cut (the line says where).
_SHOWN = 40


def shown(text: str) -> str:
    """``text`` quoted for a one-line message, cut to a readable length when huge."""
    text = text.strip()
    if len(text) <= _SHOWN:
        return repr(text)
    return repr(text[:_SHOWN]) + f"... ({len(text)} characters)"


class RowError(Exception):
    """A problem with one field of one row; the reader adds file and line."""

    def __init__(self, column: str | None, message: str) -> None:
        super().__init__(message)
        self.column = column
        self.message = message


def open_text(path: str | Path) -> TextIO:
    """Open a trace for reading as UTF-8 text (gzip if it ends in ``.gz``).

    Raises a TraceError rather than OSError because a wrong path is a user mistake
    that the CLI must report in one line.
    """
    p = Path(path)
    try:
        if p.suffix == ".gz":
            return gzip.open(p, "rt", encoding="utf-8-sig", newline="")
        return p.open("r", encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise TraceError(str(path), None, None, "file not found") from None
    except IsADirectoryError:
        raise TraceError(str(path), None, None, "is a directory, not a trace file") from None
    except PermissionError:
        raise TraceError(str(path), None, None, "permission denied") from None
    except OSError as exc:
        raise TraceError(str(path), None, None, f"cannot open: {exc.strerror or exc}") from None


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a reader builds its job list.

    A reader allocates millions of long-lived objects and no cycles; the
    collector's repeated full passes over them would otherwise triple the read
    time of a million-row trace. Nesting is safe: the outer state is restored.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def rows(fh: TextIO, path: str) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(first physical line, fields)`` for every non-blank CSV record.

    ``csv.reader.line_num`` is the *last* line of a record, which differs from the
    first when a quoted field spans lines; the first line is what an editor shows.
    Decoding and CSV-level errors become TraceErrors at the line where they occur.
    """
    reader = csv.reader(fh)
    prev = 0
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except UnicodeDecodeError:
            raise TraceError(path, reader.line_num + 1, None, "not UTF-8 text") from None
        except csv.Error as exc:
            raise TraceError(path, reader.line_num, None, f"malformed CSV: {exc}") from None
        start = prev + 1
        prev = reader.line_num
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue
        yield start, fields


def header_index(header: list[str], path: str, required: tuple[str, ...], what: str = "trace") -> dict[str, int]:
    """Map column names (stripped) to positions, checking the required ones.

    Raises:
        TraceError: on line 1 naming the first missing required column.
    """
    index: dict[str, int] = {}
    for i, name in enumerate(header):
        index.setdefault(name.strip(), i)
    for col in required:
        if col not in index:
            have = ", ".join(h.strip() for h in header) or "nothing"
            raise TraceError(path, 1, col, f"missing required column of a {what} (header has: {have})")
    return index


def parse_float(text: str, column: str) -> float:
    """A finite float of magnitude at most :data:`MAX_FLOAT`; NaN and infinities are errors
    because no time can be NaN."""
    try:
        value = float(text)
    except ValueError:
        raise RowError(column, f"not a number: {shown(text)}") from None
    if math.isnan(value) or (math.isinf(value) and "inf" in text.lower()):
        raise RowError(column, f"must be a finite number, got {shown(text)}")
    if abs(value) > MAX_FLOAT:  # also a number too long for a float (float() gives infinity)
        raise RowError(column, f"out of range (at most {MAX_FLOAT:g} in magnitude), got {shown(text)}")
    return value


def parse_int(text: str, column: str) -> int:
    """An integer of magnitude at most :data:`MAX_INT`; ``"2.0"`` is accepted because
    spreadsheet and pandas exports write it."""
    try:
        value = int(text)
    except ValueError:  # also int()'s digit limit: such a number is out of range anyway
        try:
            number = float(text)
        except ValueError:
            raise RowError(column, f"not an integer: {shown(text)}") from None
        if math.isfinite(number) and abs(number) > MAX_INT:
            raise RowError(column, f"out of range (at most {MAX_INT} in magnitude), got {shown(text)}") from None
        if not number.is_integer():
            raise RowError(column, f"not an integer: {shown(text)}") from None
        value = int(number)
    if abs(value) > MAX_INT:
        raise RowError(column, f"out of range (at most {MAX_INT} in magnitude), got {shown(text)}")
    return value


def optional_float(text: str, column: str) -> float | None:
    """A float, or None for the missing markers of :data:`MISSING`."""
    text = text.strip()
    if text in MISSING:
        return None
    return parse_float(text, column)


class Tally:
    """Counts skipped rows by reason; raises on bad rows unless told to skip them."""

    def __init__(self, path: str, skip_bad_rows: bool) -> None:
        self.path = path
        self.skip_bad_rows = skip_bad_rows
        self.skipped = 0
        self.reasons: dict[str, int] = {}

    def bad(self, line: int, column: str | None, message: str) -> None:
        """A row that breaks the format: an error, or counted as ``"bad row"``."""
        if not self.skip_bad_rows:
            raise TraceError(self.path, line, column, message)
        self.skip(BAD_ROW)

    def skip(self, reason: str) -> None:
        """A well-formed row that the reader drops on purpose (counted, never silent)."""
        self.skipped += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def trace(self, jobs: list[Job]) -> Trace:
        """The read trace: ``jobs`` with this tally's skip counts and how many durations are censored."""
        return Trace(jobs, source=self.path, skipped_rows=self.skipped, skip_reasons=self.reasons,
                     censored=sum(1 for j in jobs if j.duration_censored))


class ModelCache:
    """Resolves ``|``-separated model lists once per distinct string.

    Real traces repeat a handful of spellings millions of times, so caching the
    whole cell turns per-row regex work into one dict lookup.
    """

    def __init__(self) -> None:
        self._cache: dict[str, frozenset[str]] = {"": frozenset()}

    def __call__(self, text: str, column: str) -> frozenset[str]:
        hit = self._cache.get(text)
        if hit is not None:
            return hit
        names: set[str] = set()
        for part in text.split("|"):
            part = part.strip()
            if not part:
                continue
            canonical = resolve_model_name(part)
            if canonical is None:
                raise RowError(column, f"unknown GPU model {shown(part)}; known: {', '.join(CATALOG)}")
            names.add(canonical)
        value = frozenset(names)
        self._cache[text] = value
        return value
