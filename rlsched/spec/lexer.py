"""A small, lossless HCL tokenizer for ``rlsched fmt`` and for error hints.

python-hcl2 drops comments from its dictionaries and cannot reproduce layout
(``shared/docs/HCL.md`` section 4), so the formatter works on this token stream
instead: every byte of the input belongs to exactly one token, so comments,
heredocs and string contents survive formatting untouched. Quoted strings are
single tokens even when they contain ``${ ... }`` with nested strings, so that
brace counting only ever sees structural brackets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPENERS = {"{": "}", "[": "]", "(": ")"}
CLOSERS = {"}", "]", ")"}

_MULTI = ("...", "[*]", "=>", "==", "!=", "<=", ">=", "&&", "||", "::", ".*")
_SINGLE = set("{}[]()=,.:?!+-*/%<>")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_HEREDOC = re.compile(r"<<(-?)([A-Za-z][A-Za-z0-9._-]*)\r?\n")


class LexError(Exception):
    """Text the tokenizer cannot split (unterminated string or comment)."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


@dataclass(frozen=True, slots=True)
class Token:
    """One token: ``kind`` is ws, nl, comment, string, heredoc, ident, number, punct or bad."""

    kind: str
    text: str
    line: int
    column: int


def tokenize(src: str) -> list[Token]:
    """Split ``src`` into tokens whose texts concatenate back to ``src``.

    Raises:
        LexError: for an unterminated string, heredoc or block comment.
    """
    tokens: list[Token] = []
    i, line, col, n = 0, 1, 1, len(src)

    def add(kind: str, end: int) -> None:
        nonlocal i, line, col
        text = src[i:end]
        tokens.append(Token(kind, text, line, col))
        nl = text.count("\n")
        if nl:
            line += nl
            col = len(text) - text.rfind("\n")
        else:
            col += len(text)
        i = end

    while i < n:
        c = src[i]
        if c == "\n":
            add("nl", i + 1)
        elif c == "\r" and src.startswith("\r\n", i):
            add("nl", i + 2)
        elif c in " \t\r\ufeff":
            j = i
            while j < n and src[j] in " \t\r\ufeff" and not src.startswith("\r\n", j):
                j += 1
            add("ws", max(j, i + 1))
        elif c == "#" or src.startswith("//", i):
            j = i
            while j < n and src[j] != "\n":
                j += 1
            if j > i and src[j - 1] == "\r":
                j -= 1
            add("comment", max(j, i + 1))
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            if j < 0:
                raise LexError("Unterminated comment: a /* comment needs a closing */", line, col)
            add("comment", j + 2)
        elif c == '"':
            add("string", _scan_string(src, i, line, col))
        elif src.startswith("<<", i) and (m := _HEREDOC.match(src, i)):
            add("heredoc", _scan_heredoc(src, m, line, col))
        elif c.isdigit():
            m2 = _NUMBER.match(src, i)
            assert m2 is not None
            add("number", m2.end())
        elif c.isalpha() or c == "_":
            m3 = _IDENT.match(src, i)
            assert m3 is not None
            add("ident", m3.end())
        else:
            for op in _MULTI:
                if src.startswith(op, i):
                    add("punct", i + len(op))
                    break
            else:
                add("punct" if c in _SINGLE else "bad", i + 1)
    return tokens


def _scan_string(src: str, start: int, line: int, col: int) -> int:
    """End offset (exclusive) of the quoted string starting at ``start``."""
    i, n = start + 1, len(src)
    while i < n:
        c = src[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        if c == "\n":
            break
        if src.startswith(("$${", "%%{"), i):
            i += 3
            continue
        if src.startswith(("${", "%{"), i):
            i = _scan_template_expr(src, i + 2, line, col)
            continue
        i += 1
    raise LexError("Unterminated string: a quoted string must end with \" on the same line", line, col)


def _scan_template_expr(src: str, i: int, line: int, col: int) -> int:
    """Skip a ``${ ... }`` body (nested strings and braces included); return the offset after ``}``."""
    depth, n = 1, len(src)
    while i < n:
        c = src[i]
        if c == '"':
            i = _scan_string(src, i, line, col)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise LexError("Unterminated template sequence: \"${\" needs a closing \"}\"", line, col)


def _scan_heredoc(src: str, m: re.Match[str], line: int, col: int) -> int:
    """End offset of a heredoc: through its closing marker, not the newline after it."""
    marker = m.group(2)
    pos = m.end()
    while pos <= len(src):
        eol = src.find("\n", pos)
        end = len(src) if eol < 0 else eol
        if src[pos:end].strip() == marker:
            return end - 1 if end > pos and src[end - 1] == "\r" else end
        if eol < 0:
            break
        pos = eol + 1
    raise LexError(f"Unterminated heredoc: no line closes <<{marker}", line, col)


def unclosed_bracket(src: str) -> Token | None:
    """The first opening bracket that is never closed, for "unclosed block" hints."""
    try:
        tokens = tokenize(src)
    except LexError:
        return None
    stack: list[Token] = []
    for t in tokens:
        if t.kind != "punct":
            continue
        if t.text in OPENERS:
            stack.append(t)
        elif t.text in CLOSERS and stack:
            stack.pop()
    return stack[-1] if stack else None
