"""Property-based fuzzing: the loader returns a Spec or raises SpecError, nothing else."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.spec import Spec, SpecError, load_spec
from rlsched.spec.fmt import format_source
from tests.spec.conftest import ROOT, hcl_md_example

SEEDS = [hcl_md_example(), *(p.read_text() for p in sorted((ROOT / "configs").glob("*.hcl")))]
ALPHABET = st.sampled_from([*'{}[]()=,."$%#/*\n -+!?:<>~\\abcdefghijklmnopqrstuvwxyz0123456789_',
                            "pool", "var.", "local.", "${", "%{", "<<EOT\n", "\nEOT\n", "for", "in", "each.key"])


def _check(text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.hcl"
        path.write_text(text)
        try:
            result = load_spec(path, env={})
        except SpecError as exc:
            assert exc.diagnostics
        else:
            assert isinstance(result, Spec)
    out, diags = format_source(text, "fuzz.hcl")
    assert out is not None or diags
    if out is not None:
        assert format_source(out)[0] == out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_random_text(text: str) -> None:
    _check(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ALPHABET, max_size=60))
def test_random_tokens(parts: list[str]) -> None:
    _check("".join(parts))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SEEDS), st.data())
def test_mutated_valid_files(seed: str, data: st.DataObject) -> None:
    text = seed
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 12)))
        insert = data.draw(st.lists(ALPHABET, max_size=3).map("".join))
        text = text[:i] + insert + text[j:]
    _check(text)
