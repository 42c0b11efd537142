"""Bounds on reading and evaluating a spec: a spec is code, and code can be a bomb.

A pool spec is evaluated by ``validate``, ``plan``, ``apply`` and on every reload of
the live service, so no input may make evaluation hang, exhaust memory or crash the
interpreter. Every bound here fails with a located diagnostic, and all of them
together keep one load of a spec to a few seconds and a few hundred MiB at most:

* **source**: :data:`MAX_SOURCE_BYTES` per file and twice that per load (parsing with
  python-hcl2's Lark parser is the slowest step, so the source size bounds it) and
  :data:`MAX_NESTING` brackets, template sequences and heredocs deep,
  checked by :func:`source_problem` before the parser (and its recursion) sees the text;
* **values**: strings of :data:`MAX_STRING` characters, collections of
  :data:`MAX_ITEMS` elements, values of :data:`MAX_VALUE_SIZE` units in all (shared
  sub-values count once per reference, so repeated doubling is caught), nested
  :data:`MAX_VALUE_DEPTH` deep, numbers within :data:`MAX_INTEGER` (every string a
  function or template builds is checked, so a string inside a collection is too);
* **work**: one :class:`Budget` of :data:`MAX_WORK` units per load, shared by every
  expression: each evaluation step costs one unit, each new string or collection its
  size, each function call the size of its arguments (what the function may read).

Regular expressions run on RE2 (linear time, Terraform's own regexp syntax), so no
pattern can backtrack catastrophically. Limit errors are :class:`LimitError`, which
``try()`` and ``can()`` do not swallow: a bomb must not be retried quietly.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from rlsched.spec.diagnostics import EvalError, Poisoned
from rlsched.spec.model import SourceRange

#: Largest spec, variables file or variable value, in bytes (UTF-8).
MAX_SOURCE_BYTES = 256 * 1024
#: Deepest nesting of brackets, quoted strings, template sequences and heredocs.
MAX_NESTING = 64
#: Longest string value, in characters.
MAX_STRING = 1024 * 1024
#: Most elements in one list, set, map or object.
MAX_ITEMS = 100_000
#: Largest value in units: 1 per element or scalar plus 1 per 16 characters of strings.
MAX_VALUE_SIZE = 1_000_000
#: Deepest nesting of collections inside a value.
MAX_VALUE_DEPTH = 64
#: Largest magnitude of an integer result (beyond it arithmetic would grow without bound).
MAX_INTEGER = 2**63
#: Work units one load of a spec may spend (about two seconds of evaluation).
MAX_WORK = 2_000_000

_CHARS_PER_UNIT = 16


class LimitError(EvalError):
    """A bound of this module was exceeded; never swallowed by ``try()`` or ``can()``."""


class Budget:
    """The work left to one load, and the measured size of every collection it made.

    Sizes are remembered by object identity (the objects are kept alive here, so an
    identity is never reused) so that measuring a new collection costs only its own
    length: its elements were measured when they were made.
    """

    def __init__(self, work: int = MAX_WORK) -> None:
        self.left = work
        self.exhausted = False
        self._sizes: dict[int, tuple[Any, int, int]] = {}

    def charge(self, units: int, rng: SourceRange | None) -> None:
        """Spend ``units``; the first overdraft is one diagnostic, later ones stay silent."""
        self.left -= units
        if self.left >= 0:
            return
        if self.exhausted:
            raise Poisoned("evaluation budget")
        self.exhausted = True
        raise LimitError("Evaluation budget exceeded",
                         f"Evaluating the spec takes more than {MAX_WORK:,} steps (each value built counts by its "
                         "size); a spec that describes GPU pools never needs that many. Look for large "
                         "for expressions, range() products or repeated doubling.", rng)

    def measure(self, value: Any, rng: SourceRange | None) -> tuple[int, int]:
        """``(size, depth)`` of ``value``, checking every value bound on the way."""
        if isinstance(value, list | dict):
            known = self._sizes.get(id(value))
            if known is not None:
                return known[1], known[2]
            return self._measure_collection(value, rng)
        if isinstance(value, str):
            if len(value) > MAX_STRING:
                raise LimitError("String too long", f"The string has {len(value):,} characters; at most "
                                 f"{MAX_STRING:,} are allowed.", rng)
            return 1 + len(value) // _CHARS_PER_UNIT, 0
        if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INTEGER <= value <= MAX_INTEGER:
            raise LimitError("Number out of range", "The result is beyond ±2^63; numbers in a spec are counts, "
                             "sizes and prices.", rng)
        if isinstance(value, float) and not math.isfinite(value):
            raise LimitError("Number out of range", "The result is not a finite number.", rng)
        return 1, 0

    def _measure_collection(self, value: list[Any] | dict[str, Any], rng: SourceRange | None) -> tuple[int, int]:
        if len(value) > MAX_ITEMS:
            raise LimitError("Collection too large", f"The value has {len(value):,} elements; at most "
                             f"{MAX_ITEMS:,} are allowed.", rng)
        self.charge(len(value), rng)
        size, depth = 1, 0
        if isinstance(value, dict):
            size += sum(1 + len(k) // _CHARS_PER_UNIT for k in value)
            items: Any = value.values()
        else:
            items = value
        sizes = self._sizes
        for item in items:
            if isinstance(item, list | dict):
                known = sizes.get(id(item))
                s, d = (known[1], known[2]) if known is not None else self._measure_collection(item, rng)
                size += s
                if d > depth:
                    depth = d
                if size > MAX_VALUE_SIZE:
                    raise LimitError("Value too large", f"The value holds more than {MAX_VALUE_SIZE:,} elements "
                                     "and string pieces in all (a value used twice counts twice).", rng)
            elif isinstance(item, str):
                size += 1 + len(item) // _CHARS_PER_UNIT
            else:
                size += 1
        if size > MAX_VALUE_SIZE:
            raise LimitError("Value too large", f"The value holds more than {MAX_VALUE_SIZE:,} elements and string "
                             "pieces in all (a value used twice counts twice).", rng)
        depth += 1
        if depth > MAX_VALUE_DEPTH:
            raise LimitError("Value nested too deeply", f"Lists and maps are nested more than {MAX_VALUE_DEPTH} "
                             "deep.", rng)
        sizes[id(value)] = (value, size, depth)
        return size, depth


_CURRENT: ContextVar[Budget | None] = ContextVar("rlsched_spec_budget", default=None)


def current_budget() -> Budget:
    """The budget of the load in progress, or a fresh one for a stand-alone evaluation."""
    budget = _CURRENT.get()
    return budget if budget is not None else Budget()


@contextlib.contextmanager
def budget_scope(budget: Budget | None = None) -> Iterator[Budget]:
    """Make ``budget`` (default: a new one) the budget of every evaluation inside the block."""
    budget = budget or Budget()
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


# --- source checks ---------------------------------------------------------------------

_HEREDOC = re.compile(r"<<-?([A-Za-z][A-Za-z0-9._-]*)\r?\n")
_CLOSERS = {"}": "{", "]": "[", ")": "("}


def source_problem(text: str) -> tuple[str, str, int] | None:
    """``(summary, detail, offset)`` when ``text`` is too large or nests too deeply, else None.

    The scan is iterative and linear: it follows quoted strings, ``${``/``%{``
    sequences, comments and heredocs closely enough to count real nesting, and
    leaves every other judgement (unterminated strings, stray brackets) to the parser.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        return ("File too large", f"The file has {size:,} bytes; a spec file may have at most {MAX_SOURCE_BYTES:,}.",
                0)
    stack: list[str] = []  # "{", "[", "(", '"' string, "T" template sequence, "H" heredoc body
    heredoc_ends: list[int] = []
    i, n = 0, len(text)
    while i < n:
        top = stack[-1] if stack else ""
        c = text[i]
        if top in ('"', "H"):
            if top == "H" and i >= heredoc_ends[-1]:
                stack.pop()
                heredoc_ends.pop()
                continue
            if top == '"' and c == "\\":
                i += 2
                continue
            if (top == '"' and c == '"') or (top == '"' and c == "\n"):
                stack.pop()
                i += 1
                continue
            if text.startswith(("$${", "%%{"), i):
                i += 3
                continue
            if text.startswith(("${", "%{"), i):
                stack.append("T")
                i += 2
            else:
                i += 1
        elif c == "#" or text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        elif c == '"':
            stack.append('"')
            i += 1
        elif c == "<" and (m := _HEREDOC.match(text, i)):
            marker = re.compile(r"^[ \t]*" + re.escape(m.group(1)) + r"[ \t]*\r?$", re.M)
            close = marker.search(text, m.end())
            stack.append("H")
            heredoc_ends.append(n if close is None else close.start())
            i = m.end()
        elif c in "{[(":
            stack.append(c)
            i += 1
        elif c in "}])":
            if stack and (stack[-1] == _CLOSERS[c] or (c == "}" and stack[-1] == "T")):
                stack.pop()
            i += 1
            continue
        else:
            i += 1
            continue
        if len(stack) > MAX_NESTING:
            return ("Too deeply nested", f"Brackets, strings and template sequences are nested more than "
                    f"{MAX_NESTING} deep here; a spec never needs that.", i - 1)
    return None


def offset_range(text: str, offset: int, filename: str) -> SourceRange:
    """The 1-based line and column of a character offset."""
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return SourceRange(filename, line, column)


def check_format_width(flags: str) -> None:
    """Refuse a ``format()`` width or precision that would build a huge string."""
    for number in re.findall(r"\d+", flags):
        if len(number) > 7 or int(number) > MAX_STRING:
            raise ValueError(f"the width or precision {number} is larger than the longest string allowed "
                             f"({MAX_STRING:,} characters)")


__all__ = ["MAX_ITEMS", "MAX_NESTING", "MAX_SOURCE_BYTES", "MAX_STRING", "MAX_VALUE_DEPTH", "MAX_VALUE_SIZE",
           "MAX_WORK", "Budget", "LimitError", "budget_scope", "check_format_width", "current_budget",
           "offset_range", "source_problem"]
