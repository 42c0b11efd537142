"""Docstrings state the contract; measurements and histories live in BENCHMARKS.md.

A number measured on one commit goes stale at the next, and a docstring that quotes it
keeps it long after (issue 18 item 5). These checks look for the forms such notes take -
a speed or cost *ratio* written ``0.95x``, a commit hash, "measured on codec v5" or
"first measured", a dated change - and nothing else: units and quantities that belong
to a contract (``GPU-hours``, ``1e-9``, ``+-50``, percentages of a stated tolerance,
"measured against the size limits") are not flagged. A contract threshold is written
"1.02 times the best heuristic's", which reads the same and is not mistaken for a
measurement.

The second check keeps the ``GpuPoolEnv`` docstring's observation shapes, layout
count and rule names equal to what the codec and the rule registry define.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlsched.envs.codec import GLOBAL_FEATURES, JOB_FEATURES, LAYOUT_ORDER, POOL_FEATURES
from rlsched.envs.gpu_pool import GpuPoolEnv
from rlsched.policies.rules import RULES

PACKAGE = Path(__file__).resolve().parents[1] / "rlsched"

#: name -> pattern of a measurement or history note; each is narrow on purpose (see the module doc).
PATTERNS: dict[str, re.Pattern[str]] = {
    # 0.95x, 1.37x: a measured ratio (a bare "2x" or "K x H" is arithmetic, not flagged)
    "ratio": re.compile(r"(?<![\w.])\d+\.\d+x\b"),
    # a 7-40 digit hex word holding both digits and letters a-f: a commit or content hash
    "hash": re.compile(r"(?<![\w./-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])"),
    # "first measured", "when measured", "measured on codec v5", "measured at git ..."
    "measured": re.compile(r"\b(?:first|when|as|re-?)\s+measured\b"
                           r"|\bmeasured\s+(?:on|at|in)\s+(?:codec\s+v\d|git\b|20\d\d)", re.IGNORECASE),
    # "codec v3 took them from...": the codec's version lives in CODEC_VERSION, not in prose
    "codec history": re.compile(r"\bcodec\s+v\d+\b", re.IGNORECASE),
    # "3x faster", "2.5 times slower"
    "speed-up": re.compile(r"\b\d+(?:\.\d+)?\s*(?:x|times)\s+(?:faster|slower)\b", re.IGNORECASE),
    # "2026-11-30: the argument became ...", "regenerated 2026-12-01"
    "dated change": re.compile(r"\b20\d\d-\d\d-\d\d:"
                               r"|\b(?:measured|regenerated|retrained|as of)\s+(?:on\s+)?20\d\d-\d\d-\d\d\b",
                               re.IGNORECASE),
}


def _docstrings() -> Iterator[tuple[str, str]]:
    """(``path:line name``, docstring) of every module, class and function in the package."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, kinds):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    line = getattr(node, "lineno", 1)
                    name = getattr(node, "name", "<module>")
                    yield f"{path.relative_to(PACKAGE.parent)}:{line} {name}", doc


def _offences(doc: str) -> list[str]:
    return [f"{kind}: {m.group(0)!r}" for kind, pat in PATTERNS.items() for m in pat.finditer(doc)]


def test_no_docstring_carries_measurements_or_history() -> None:
    found = [f"{where}: {', '.join(hits)}" for where, doc in _docstrings() if (hits := _offences(doc))]
    assert not found, ("docstrings quote measurements or history (move them to BENCHMARKS.md and point "
                       "there):\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "reaches 0.848x weighted-priority's mean JCT",
    "the rule's first version (git 907c3dd) took longer",
    "policy sha256 7dd9674f",
    "measured on codec v5: on openb",
    "0.956x when first measured",
    "Codec v3 took them from the next 64 jobs only",
    "about 3x faster than torch",
    "2026-11-30: the deadline_guard argument became rules",
    "Regenerated 2026-12-01 at git 39d54c1",
])
def test_patterns_catch_measurements(text: str) -> None:
    assert _offences(text), text


@pytest.mark.parametrize("text", [
    "a rule's saving in GPU-hours and USD per GPU-hour",
    "cost_usd <= baseline x (1 + 1e-9)",
    "at most 1.02 times the best heuristic's",
    "K x P pairs instead of building the (K, P, 3H) tensor",
    "measured against the size limits",
    "offered load is measured against the cluster's base capacity",
    "a bucket (<5%, 5-10%, 10-15%, 15-20%, >20%)",
    "Philly's trace time 0 is 2017-09-04 10:30:41",
    "``/v1/jobs`` and gpupool-codec-v6-<digest>",
    "GPU-5a3b2c1d-0000 and the GPU UUID",
    "decimal 1234567 is a count, not a hash",
])
def test_patterns_spare_contract_content(text: str) -> None:
    assert not _offences(text), _offences(text)


def test_gpu_pool_env_docstring_matches_codec_and_rules() -> None:
    doc = GpuPoolEnv.__doc__ or ""
    n_job = re.search(r"``jobs`` ``\(K, (\d+) \+ P\)``", doc)
    n_pool = re.search(r"``pools`` ``\(P, (\d+)\)``", doc)
    n_glob = re.search(r"``globals`` ``\((\d+),\)``", doc)
    n_layouts = re.search(r"L = (\d+) MIG layouts", doc)
    assert n_job and n_pool and n_glob and n_layouts, "GpuPoolEnv docstring lost its shape lines"
    assert int(n_job.group(1)) == len(JOB_FEATURES)
    assert int(n_pool.group(1)) == len(POOL_FEATURES)
    assert int(n_glob.group(1)) == len(GLOBAL_FEATURES)
    assert int(n_layouts.group(1)) == len(LAYOUT_ORDER)
    rules_arg = doc[doc.index("* ``rules``"):]
    for name in RULES:
        assert f"``{name}``" in rules_arg, f"rule {name!r} missing from GpuPoolEnv's ``rules`` argument"
