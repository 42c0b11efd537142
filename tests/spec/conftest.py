"""Helpers for the spec tests: write HCL to a temp dir and load it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlsched.spec import Spec, SpecError, load_spec
from rlsched.spec.model import Diagnostic

ROOT = Path(__file__).resolve().parents[2]
HCL_MD = ROOT.parent / "shared" / "docs" / "HCL.md"


#: settings of the HCL.md example that rlsched rejects as not supported yet (README, "Pool specs")
NOT_SUPPORTED_YET = ("max_price_per_gpu_hour", "fallback_pool", "min_success_rate")


def hcl_md_example_as_written() -> str:
    """The section 8 example of shared/docs/HCL.md (a copy is kept in case the doc is absent)."""
    if HCL_MD.exists():
        m = re.search(r"## 8\..*?```hcl\n(.*?)```", HCL_MD.read_text(), re.S)
        if m:
            return m.group(1)
    return (Path(__file__).parent / "data" / "pool.hcl").read_text()


def hcl_md_example() -> str:
    """The HCL.md example without the settings rlsched does not support yet, so that it loads."""
    lines = hcl_md_example_as_written().splitlines(keepends=True)
    return "".join(ln for ln in lines if ln.split("=")[0].strip() not in NOT_SUPPORTED_YET)


def load(tmp_path: Path, text: str, name: str = "main.hcl", **kw: object) -> Spec:
    path = tmp_path / name
    path.write_text(text)
    return load_spec(path, env=kw.pop("env", {}), **kw)  # type: ignore[arg-type]


def errors(tmp_path: Path, text: str, name: str = "main.hcl", **kw: object) -> list[Diagnostic]:
    with pytest.raises(SpecError) as info:
        load(tmp_path, text, name, **kw)
    return [d for d in info.value.diagnostics if d.severity == "error"]
