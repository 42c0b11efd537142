"""Text that is safe to print on a terminal, whoever wrote it.

Job names, argv, users, reasons, pool names, registry tags and server error
messages are written by someone other than the person reading the output. A
control character in them (an ``ESC ]`` sequence sets the window title or writes
the clipboard, ``ESC [2J`` clears the screen, ``\\r`` overwrites a line, a
bidirectional override reorders what is shown) must never reach the terminal as
such. Every human-readable renderer passes such strings through
:func:`escape_control` (plain text) or :func:`cell` (a rich table cell or
``console.print`` argument, which also stops ``[...]`` being read as rich markup);
argv is shown by :func:`shell_join`, which quotes it so that it can be pasted back
into a shell. JSON output needs none of this: ``json.dumps`` escapes control
characters itself.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

#: Width of tables written to a pipe or file when ``COLUMNS`` is not set: wide enough that
#: nothing is dropped or wrapped, so ``rlsched status | grep`` sees whole rows.
PIPE_WIDTH = 240

# C0 controls, DEL, C1 controls, the Unicode line/paragraph separators and the
# bidirectional embedding/override/isolate characters (the "Trojan Source" set).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\x1b": "\\e", "\x07": "\\a", "\x08": "\\b", "\x00": "\\0"}


def _escape_char(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_control(value: object, *, keep: str = "") -> str:
    """``str(value)`` with every control character written as a visible escape (``ESC`` -> ``\\e``).

    ``keep`` names characters to pass through unchanged (``"\\n\\t"`` for multi-line
    output such as job logs); everything else in the unsafe set is escaped.
    Printable text, including non-ASCII letters, is left as it is.
    """
    text = str(value)
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: m.group(0) if m.group(0) in keep else _escape_char(m.group(0)), text)


def has_control(value: object) -> bool:
    """Whether :func:`escape_control` would change ``str(value)``."""
    return _UNSAFE.search(str(value)) is not None


def cell(value: object, style: str = "") -> Text:
    """A rich ``Text`` of ``value`` with control characters escaped and no markup interpretation.

    Use it for every table cell or printed fragment whose text comes from a job, a
    server, a file or a registry: a plain ``str`` given to rich is parsed as markup, so
    ``[/]`` in a job name would break the table and ``[link=...]`` would forge a link.
    """
    return Text(escape_control("-" if value is None else value), style=style)


def _ansi_c_quote(arg: str) -> str:
    """Bash's ``$'...'`` quoting: control characters as escapes, the result pastes back as the same bytes."""
    out = []
    for ch in arg:
        if ch in ("\\", "'"):
            out.append("\\" + ch)
        elif _UNSAFE.match(ch):
            out.append(_escape_char(ch) if ch != "\x00" else "\\x00")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def shell_join(argv: Iterable[object]) -> str:
    """argv as one shell command line, safe to print: ``shlex.quote`` per argument, or ``$'...'`` for an
    argument holding control characters (``$'\\e]0;title\\a'``), so nothing raw reaches the terminal and
    the line can still be pasted back into bash or zsh."""
    parts = []
    for a in argv:
        s = str(a)
        parts.append(_ansi_c_quote(s) if has_control(s) else shlex.quote(s))
    return " ".join(parts)


def output_console(*, stderr: bool = False, **kw: Any) -> Console:
    """A rich console as wide as the terminal: ``$COLUMNS`` when set, else the terminal's width, else
    (output to a pipe or file) :data:`PIPE_WIDTH`. Tables built for it adapt to that width."""
    console = Console(stderr=stderr, **kw)
    columns = os.environ.get("COLUMNS", "")
    if not console.is_terminal and not columns.isdigit():
        console = Console(stderr=stderr, width=PIPE_WIDTH, **kw)
    return console


class LogWriter:
    """Writes a job's captured output to a binary stream: byte for byte to a pipe or file, and with control
    characters escaped (newlines, tabs and carriage returns kept) when the stream is a terminal.

    Output arrives in chunks that may split a UTF-8 character; an incremental decoder keeps the pieces
    together, and bytes that are not UTF-8 show as U+FFFD rather than reaching the terminal.
    """

    def __init__(self, stream: Any, *, escape: bool) -> None:
        import codecs

        self.stream = stream
        self.escape = escape
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, data: bytes, *, final: bool = False) -> None:
        """Write one chunk (``final``: no more will come, flush a trailing partial character)."""
        if self.escape:
            text = self._decoder.decode(data, final=final)
            data = escape_control(text, keep="\n\t\r").encode("utf-8")
        if data:
            self.stream.write(data)
        self.stream.flush()


def fit_columns(build: Any, columns: Sequence[str], drop_order: Sequence[str],
                width: int) -> tuple[list[str], list[str]]:
    """(shown, hidden): the columns of the table ``build(shown)`` makes, leaving out ``drop_order``'s columns
    one by one, first to last, until the table is at most ``width`` characters wide (or nothing is left
    to drop). Columns not in ``drop_order`` always stay."""
    import io

    shown = list(columns)
    hidden: list[str] = []
    console = Console(width=100_000, file=io.StringIO())  # a measure is clamped to the console's width
    for name in drop_order:
        if console.measure(build(shown)).maximum <= width:
            break
        if name in shown:
            shown.remove(name)
            hidden.append(name)
    return shown, hidden
