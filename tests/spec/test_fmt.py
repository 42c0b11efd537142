"""``rlsched fmt``: comments kept, idempotent, aligned, configs are golden."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.spec.fmt import format_source
from tests.spec.conftest import ROOT, hcl_md_example

MESSY = '''# header
variable "region" {
    type = string # the type
  default     = "us-east"   // default
}
locals {


  prefix = "rl-${var.region}"
  rollout_nodes=["a","b"]
  /* block
     comment */
  x = -1+2*3
  h = <<EOT
  keep   this
EOT
}
pool "a" {
  gpu_model = "H100"
  nodes = local.rollout_nodes
}
'''

WANT = '''# header
variable "region" {
  type    = string    # the type
  default = "us-east" // default
}

locals {
  prefix        = "rl-${var.region}"
  rollout_nodes = ["a", "b"]
  /* block
     comment */
  x = -1 + 2 * 3
  h = <<EOT
  keep   this
EOT
}

pool "a" {
  gpu_model = "H100"
  nodes     = local.rollout_nodes
}
'''


def test_fmt_canonical_output() -> None:
    out, diags = format_source(MESSY)
    assert diags == [] and out == WANT


def test_fmt_keeps_every_comment() -> None:
    out, _ = format_source(MESSY)
    assert out is not None
    for c in ("# header", "# the type", "// default", "/* block\n     comment */"):
        assert c in out


@pytest.mark.parametrize("text", [MESSY, WANT, hcl_md_example()])
def test_fmt_idempotent(text: str) -> None:
    once, _ = format_source(text)
    assert once is not None
    assert format_source(once)[0] == once


@pytest.mark.parametrize("name", ["local.hcl", "onprem-mig.hcl", "hybrid-spot.hcl"])
def test_configs_are_golden(name: str) -> None:
    text = (ROOT / "configs" / name).read_text()
    assert format_source(text)[0] == text


def test_fmt_rejects_invalid_syntax(tmp_path: Path) -> None:
    out, diags = format_source('pool "a" {\n  x = [1 2]\n}\n', "bad.hcl")
    assert out is None and diags[0].range is not None and diags[0].range.line == 2
