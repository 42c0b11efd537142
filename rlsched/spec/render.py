"""Print diagnostics the way Terraform does, or as ``validate --json``.

Text form::

    Error: Unsupported attribute

      on typo.hcl line 3, in pool "rollout":
       3 |   nodes     = local.rollout_nodez
         |                    ^
    This object does not have an attribute named "rollout_nodez". ...

The source line is read back from the file; a diagnostic without a range (a bad
``--var``) prints its summary and detail only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlsched.spec.model import Diagnostic

#: Longest stretch of a source line shown under a diagnostic (a minified or generated file can
#: have one line of megabytes); longer lines are cut around the caret.
_SNIPPET = 100
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    """``text`` with control characters written as escapes, so a spec cannot drive the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


class _Sources:
    def __init__(self, sources: dict[str, str] | None) -> None:
        self.cache: dict[str, list[str] | None] = {k: v.splitlines() for k, v in (sources or {}).items()}

    def line(self, filename: str, line: int) -> str | None:
        if filename not in self.cache:
            try:
                self.cache[filename] = Path(filename).read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                self.cache[filename] = None
        lines = self.cache[filename]
        if lines is None or not 1 <= line <= len(lines):
            return None
        return lines[line - 1]


def render_text(diags: Sequence[Diagnostic], sources: dict[str, str] | None = None) -> str:
    """Every diagnostic with its location, source line and caret; blank line between them."""
    src = _Sources(sources)
    chunks: list[str] = []
    for d in diags:
        head = "Error" if d.severity == "error" else "Warning"
        lines = [f"{head}: {_printable(d.summary)}"]
        r = d.range
        if r is not None:
            lines.append(f"  on {r.filename}:{r.line}:{r.column}")
            text = src.line(r.filename, r.line)
            if text is not None:
                text = _CONTROL.sub("?", text.replace("\t", " "))
                caret_col = max(1, min(r.column, len(text) + 1))
                width = 1
                if r.end_line == r.line and r.end_column and r.end_column > r.column:
                    width = max(1, min(r.end_column - r.column, len(text) - caret_col + 1))
                if len(text) > _SNIPPET:
                    start = max(0, min(caret_col - 1 - _SNIPPET // 2, len(text) - _SNIPPET))
                    shown = text[start:start + _SNIPPET]
                    prefix = "…" if start > 0 else ""
                    text = prefix + shown + ("…" if start + _SNIPPET < len(text) else "")
                    caret_col = caret_col - start + len(prefix)
                    width = max(1, min(width, _SNIPPET - (caret_col - len(prefix)) + 1))
                num = str(r.line)
                lines.append(f"  {num:>4} | {text}")
                lines.append(f"  {'':>4} | {' ' * (caret_col - 1)}{'^' * width}")
        if d.detail:
            lines.append("")
            lines.extend(f"  {_printable(ln)}" if ln else "" for ln in d.detail.splitlines())
        chunks.append("\n".join(lines))
    return "\n\n".join(chunks) + ("\n" if chunks else "")


def render_json(diags: Sequence[Diagnostic]) -> dict[str, Any]:
    """The ``validate --json`` document: ``{valid, error_count, warning_count, diagnostics}``."""
    errors = sum(1 for d in diags if d.severity == "error")
    return {
        "format_version": "1.0",
        "valid": errors == 0,
        "error_count": errors,
        "warning_count": sum(1 for d in diags if d.severity == "warning"),
        "diagnostics": [d.to_json() for d in diags],
    }
