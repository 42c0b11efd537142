"""Property-based fuzzing: the loader returns a Spec or raises SpecError, nothing else, within budgets.

Every example must also end within a CPU-time budget and a memory budget (issue 17
items 9 and 16): random text, random tokens, mutated valid specs, and random
expressions built from the whole function set, operators, for expressions,
templates and splats, with hostile leaves (huge numbers, format widths, regexes),
evaluated with and without variable values. Example counts are small so that CI
runs this in seconds.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.spec import Spec, SpecError, load_spec
from rlsched.spec.fmt import format_source
from rlsched.spec.functions import FUNCTIONS
from tests.budget import within_budget
from tests.spec.conftest import ROOT, hcl_md_example

SEEDS = [hcl_md_example(), *(p.read_text() for p in sorted((ROOT / "configs").glob("*.hcl")))]
ALPHABET = st.sampled_from([*'{}[]()=,."$%#/*\n -+!?:<>~\\abcdefghijklmnopqrstuvwxyz0123456789_',
                            "pool", "var.", "local.", "${", "%{", "<<EOT\n", "\nEOT\n", "for", "in", "each.key"])


#: per load: seconds of CPU and bytes of Python allocations
CPU_BUDGET_S = 10.0
MEMORY_BUDGET = 256 * 2**20


def _bounded(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` and check that it stayed within this module's CPU and memory budgets."""
    return within_budget(fn, CPU_BUDGET_S, MEMORY_BUDGET)


def _load(path: Path, unknown: bool = False) -> None:
    try:
        result = load_spec(path, env={}, unknown_variables=unknown)
    except SpecError as exc:
        assert exc.diagnostics and any(d.severity == "error" for d in exc.diagnostics)
    else:
        assert isinstance(result, Spec)


def _check(text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.hcl"
        path.write_text(text)
        _bounded(lambda: _load(path))
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


_LEAF = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(['"a"', '""', '"1"', '"true"', "true", "false", "null", '"%s-%d"', '"/(a+)+$/"', '"${1}"',
                     "var.v", "var.u", "local.l", "1e400", "-0", "x", '"%2000000000s"', '"%.9999999f"',
                     '"1g.10gb"', "each.key", "range(1024)", '"${join("", range(1024))}"', "9" * 400]),
)


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(st.sampled_from(["a", "b", '"c"']), children), max_size=3).map(
            lambda kv: "{" + ", ".join(f"{k} = {v}" for k, v in kv) + "}"),
        st.tuples(st.sampled_from([*sorted(FUNCTIONS), "try", "can", "nope"]), st.lists(children, max_size=4)).map(
            lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.tuples(children, st.sampled_from(["+", "-", "*", "/", "%", "==", "!=", "<", ">", "&&", "||"]),
                  children).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(children, children, children).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
        st.tuples(children, children).map(lambda t: f"[for x in {t[0]} : {t[1]}]"),
        st.tuples(children, children).map(lambda t: f"{{for k, x in {t[0]} : k => {t[1]}...}}"),
        st.tuples(children, children).map(lambda t: f"{t[0]}[{t[1]}]"),
        children.map(lambda c: f'"pre-${{{c}}}-%{{for y in {c}}}${{y}}%{{endfor}}"'),
        children.map(lambda c: f"{c}[*].a"),
        children.map(lambda c: f"-{c}"),
        children.map(lambda c: f"!{c}"),
    )


EXPRESSIONS = st.recursive(_LEAF, _extend, max_leaves=14)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRESSIONS, st.booleans())
def test_random_expressions(expr: str, unknown: bool) -> None:
    """Any expression evaluates or is one located error; never a traceback, a hang or a memory blow-up."""
    text = ('variable "v" {\n  default = [1, "a"]\n}\nvariable "u" {\n}\n'
            f"locals {{\n  l = {{ a = 1 }}\n  e = {expr}\n}}\n"
            f'pool "p" {{\n  for_each   = toset(["a"])\n  gpu_model  = "H100"\n  node_count = {expr}\n}}\n'
            f'output "o" {{\n  value = {expr}\n}}\n')
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.hcl"
        path.write_text(text)
        _bounded(lambda: _load(path, unknown))
