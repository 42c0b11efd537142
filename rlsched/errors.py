"""One flat error hierarchy for problems a user caused and can fix.

The CLI turns any :class:`RlschedError` into a one-line message and a non-zero
exit status; anything else reaching the top level is a bug in rlsched.
"""

from __future__ import annotations

from collections.abc import Iterable


class RlschedError(Exception):
    """Base class of every user-facing error."""


class UnknownGpuModelError(RlschedError):
    """A GPU model or MIG profile that the catalogue does not know."""


class ClusterSpecError(RlschedError):
    """A ``--cluster`` specification that does not parse or is inconsistent."""


class TraceError(RlschedError):
    """A malformed trace file; the message names file, line and column."""

    def __init__(self, path: str, line: int | None, column: str | None, message: str) -> None:
        where = path
        if line is not None:
            where += f":{line}"
        if column:
            where += f" (column {column})"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.column = column
        self.reason = message


class MarketError(TraceError):
    """A malformed price or availability file (same location format as traces)."""


class ScenarioError(RlschedError):
    """A scenario or policy configuration that cannot be used."""


def name_hint(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known``, or the empty string: the suffix of an
    unknown-name error, so a typo names its fix."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
