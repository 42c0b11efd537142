"""Hostile and awkward inputs to the spec tools (issue 17): every one gives located diagnostics, fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.spec.fmt import format_source
from tests.spec.conftest import errors


@pytest.mark.parametrize("text", ['policy "default" { health {} }\n', 'pool "a" { lifecycle {} }\n',
                                  'pool "a" { lifecycle { prevent_destroy = true } }\n'])
def test_one_line_block_holding_a_block(tmp_path: Path, text: str) -> None:
    """A nested block on a one-line block is one located error (it raised IndexError before)."""
    diags = errors(tmp_path, text)
    match = [d for d in diags if d.summary == "Argument definition required"]
    assert len(match) == 1, diags
    assert match[0].range is not None and (match[0].range.line, match[0].range.column) == (1, text.index("{") + 3)
    out, fdiags = format_source(text, "x.hcl")
    assert out is None and [d.summary for d in fdiags] == ["Argument definition required"]
