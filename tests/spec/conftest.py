"""Helpers for the spec tests: write HCL to a temp dir and load it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlsched.spec import Spec, SpecError, load_spec
from rlsched.spec.model import Diagnostic

ROOT = Path(__file__).resolve().parents[2]
HCL_MD = ROOT.parent / "shared" / "docs" / "HCL.md"


def hcl_md_example() -> str:
    """The section 8 example of shared/docs/HCL.md (a copy is kept in case the doc is absent)."""
    if HCL_MD.exists():
        m = re.search(r"## 8\..*?```hcl\n(.*?)```", HCL_MD.read_text(), re.S)
        if m:
            return m.group(1)
    return (Path(__file__).parent / "data" / "pool.hcl").read_text()


def load(tmp_path: Path, text: str, name: str = "main.hcl", **kw: object) -> Spec:
    path = tmp_path / name
    path.write_text(text)
    return load_spec(path, env=kw.pop("env", {}), **kw)  # type: ignore[arg-type]


def errors(tmp_path: Path, text: str, name: str = "main.hcl", **kw: object) -> list[Diagnostic]:
    with pytest.raises(SpecError) as info:
        load(tmp_path, text, name, **kw)
    return [d for d in info.value.diagnostics if d.severity == "error"]
