"""Helpers for building :class:`~rlsched.spec.model.Diagnostic` values.

Every user error in a spec becomes a Diagnostic; evaluation code raises
:class:`EvalError` deep inside expressions and the caller turns it into one
diagnostic, then keeps going so that *all* problems are reported in one run.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from rlsched.spec.model import Diagnostic, SourceRange


class EvalError(Exception):
    """An expression cannot be evaluated; becomes exactly one diagnostic."""

    def __init__(self, summary: str, detail: str = "", rng: SourceRange | None = None) -> None:
        super().__init__(summary)
        self.summary = summary
        self.detail = detail
        self.rng = rng

    def diagnostic(self) -> Diagnostic:
        return Diagnostic("error", self.summary, self.detail, self.rng)


class Poisoned(Exception):
    """A value depends on something already reported; report nothing more.

    Without this, one typo in a local would produce a cascade of follow-on
    errors in every block using it, burying the real one.
    """


#: did_you_mean compares at most this many candidates of at most this many characters: fuzzy
#: matching costs the product of the lengths, and a typo is never in a 100,000-key map anyway.
_MAX_CANDIDATES = 1000
_MAX_NAME = 64


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` Did you mean "x"?`` for the closest candidate, or the empty string."""
    if len(name) > _MAX_NAME:
        return ""
    pool = sorted({c for c in candidates if len(c) <= _MAX_NAME})
    if len(pool) > _MAX_CANDIDATES:
        return ""
    close = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    return f' Did you mean "{close[0]}"?' if close else ""


def error(summary: str, detail: str = "", rng: SourceRange | None = None) -> Diagnostic:
    return Diagnostic("error", summary, detail, rng)


def warning(summary: str, detail: str = "", rng: SourceRange | None = None) -> Diagnostic:
    return Diagnostic("warning", summary, detail, rng)
