"""``rlsched fmt``: rewrite HCL in canonical style, keeping every comment.

python-hcl2 cannot do this (``dumps`` drops comments; ``reconstruct`` loses
layout), so this is a small pretty printer over :mod:`rlsched.spec.lexer` tokens,
modelled on Terraform's ``hclwrite`` formatter:

* indentation is two spaces per level, one level per line with a net opening
  bracket (hclwrite's indent stack, so odd inputs like ``})`` stay sane);
* spacing inside a line is normalised (``a = f(x, y)``, ``x[0]``, ``-1``, ``{ a = 1 }``);
* ``=`` is aligned within a run of consecutive single-line attributes, and
  trailing comments within a run of consecutive commented lines;
* blank lines: at most one in a row, none just inside braces, exactly one after
  every top-level block;
* comments, heredocs and string contents are copied byte for byte.

Only whitespace between tokens changes, so formatting never changes meaning, and
formatting a formatted file changes nothing.
"""

from __future__ import annotations

from rlsched.spec.diagnostics import error
from rlsched.spec.lexer import CLOSERS, OPENERS, LexError, Token, tokenize
from rlsched.spec.model import Diagnostic, SourceRange
from rlsched.spec.syntax import parse_text

_KEYWORDS = {"in", "if", "for", "else", "endif", "endfor", "return"}
_UNARY_AFTER = {"=", "(", "[", ",", "?", ":", "{", "=>", "==", "!=", "<", ">", "<=", ">=", "&&", "||", "+",
                "-", "*", "/", "%", "!"}


def format_source(src: str, filename: str = "<input>") -> tuple[str | None, list[Diagnostic]]:
    """Canonical text of ``src``, or ``(None, diagnostics)`` when its syntax is invalid."""
    src = src.replace("\r\n", "\n").lstrip("\ufeff")
    body, diags = parse_text(src, filename)
    errors = [d for d in diags if d.severity == "error"]
    if body is None or errors:
        return None, errors or diags
    try:
        tokens = tokenize(src)
    except LexError as exc:
        return None, [error("Invalid syntax", exc.message, SourceRange(filename, exc.line, exc.column))]
    return _format_tokens(tokens), []


def _split_lines(tokens: list[Token]) -> list[list[Token]]:
    lines: list[list[Token]] = [[]]
    for t in tokens:
        if t.kind == "nl":
            lines.append([])
        elif t.kind != "ws":
            lines[-1].append(t)
    return lines


def _bracket(t: Token) -> int:
    if t.kind != "punct":
        return 0
    if t.text in OPENERS:
        return 1
    if t.text in CLOSERS:
        return -1
    return 0


def _space(prev2: Token | None, prev: Token, cur: Token) -> bool:
    p, c = prev.text, cur.text
    if cur.kind == "comment" or prev.kind == "comment":
        return True
    if cur.kind == "punct" and c in (",", ")", "]", "...", ".", ".*", "[*]", "::"):
        return False
    if prev.kind == "punct" and p in ("(", "[", ".", ".*", "::"):
        return False
    if p == "{" and c == "}":
        return False
    if c in ("(", "[") and cur.kind == "punct" and p not in _KEYWORDS and (
            prev.kind in ("ident", "string", "number") or p in (")", "]", "[*]")):
        return False  # a call f(x) or an index x[0]
    if prev.kind == "punct" and p == "!":
        return False
    unary_minus = prev.kind == "punct" and p == "-" and (
        prev2 is None or (prev2.kind == "punct" and prev2.text in _UNARY_AFTER)
        or (prev2.kind == "ident" and prev2.text in _KEYWORDS))
    return not unary_minus


def _join(tokens: list[Token]) -> str:
    out = ""
    for i, t in enumerate(tokens):
        if i and _space(tokens[i - 2] if i > 1 else None, tokens[i - 1], t):
            out += " "
        out += t.text.rstrip() if t.kind == "comment" else t.text
    return out


class _Line:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.indent = 0
        self.lead: list[Token] = tokens
        self.assign: list[Token] = []
        self.comment: list[Token] = []
        if len(tokens) > 1 and tokens[-1].kind == "comment":
            self.lead, self.comment = tokens[:-1], tokens[-1:]
        for i, t in enumerate(self.lead):
            if i > 0 and t.kind == "punct" and t.text == "=":
                rest = self.lead[i:]
                if sum(_bracket(x) for x in rest) == 0 and not any(x.kind == "heredoc" for x in rest):
                    self.lead, self.assign = self.lead[:i], rest
                break


def _format_tokens(tokens: list[Token]) -> str:
    lines = [_Line(t) for t in _split_lines(tokens)]
    # indentation (hclwrite's indent stack)
    indents: list[int] = []
    for line in lines:
        if not line.tokens:
            continue
        net = sum(_bracket(t) for t in line.tokens)
        if net > 0:
            line.indent = len(indents)
            indents.append(net)
        elif net < 0:
            closed = -net
            while closed > 0 and indents:
                if closed > indents[-1]:
                    closed -= indents.pop()
                elif closed < indents[-1]:
                    indents[-1] -= closed
                    closed = 0
                else:
                    indents.pop()
                    closed = 0
            line.indent = len(indents)
        else:
            line.indent = len(indents)
    # blank lines
    kept: list[_Line] = []
    depth = 0
    block_open = False
    for line in lines:
        if not line.tokens:
            if kept and kept[-1].tokens and not _opens_brace(kept[-1]):
                kept.append(line)
            continue
        if line.tokens[0].text == "}" and kept and not kept[-1].tokens:
            kept.pop()
        start_depth = depth
        depth = max(0, depth + sum(_bracket(t) for t in line.tokens))
        if start_depth == 0 and _is_block_start(line):
            if kept and kept[-1].tokens and kept[-1].tokens[0].kind != "comment":
                kept.append(_Line([]))
            block_open = True
        if start_depth == 0 and not _is_block_start(line) and kept and kept[-1].tokens and \
                getattr(kept[-1], "ends_block", False):
            kept.append(_Line([]))
        kept.append(line)
        if depth == 0 and block_open:
            line.ends_block = True  # type: ignore[attr-defined]
            block_open = False
    while kept and not kept[-1].tokens:
        kept.pop()
    # cells and alignment
    texts: list[str] = []
    leads = ["  " * ln.indent + _join(ln.lead) for ln in kept]
    assign_width: list[int | None] = [None] * len(kept)
    i = 0
    while i < len(kept):
        if not kept[i].assign:
            i += 1
            continue
        j = i
        while j < len(kept) and kept[j].assign:
            j += 1
        width = max(len(leads[k]) for k in range(i, j))
        for k in range(i, j):
            assign_width[k] = width
        i = j
    bodies: list[str] = []
    for k, ln in enumerate(kept):
        text = leads[k]
        if ln.assign:
            text = text.ljust(assign_width[k] or 0) + " " + _join(ln.assign)
        bodies.append(text)
    i = 0
    while i < len(kept):
        if not kept[i].comment:
            texts.append(bodies[i])
            i += 1
            continue
        j = i
        while j < len(kept) and kept[j].comment:
            j += 1
        width = max(len(bodies[k]) for k in range(i, j))
        for k in range(i, j):
            texts.append(bodies[k].ljust(width) + " " + kept[k].comment[0].text.rstrip())
        i = j
    out = "\n".join(t.rstrip() if "\n" not in t else t for t in texts)
    return out + "\n" if out else ""


def _opens_brace(line: _Line) -> bool:
    return bool(line.tokens) and any(t.text == "{" for t in line.tokens) and \
        sum(_bracket(t) for t in line.tokens) > 0 and (line.lead or line.tokens)[-1].text in ("{", "[", "(")


def _is_block_start(line: _Line) -> bool:
    """A top-level line that starts a block: a name, labels, then ``{`` before any ``=``."""
    t = line.tokens
    if not t or t[0].kind != "ident":
        return False
    for tok in t[1:]:
        if tok.kind == "punct" and tok.text == "{":
            return True
        if tok.kind not in ("ident", "string"):
            return False
    return False
