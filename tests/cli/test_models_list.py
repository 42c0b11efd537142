"""``rlsched models list`` fits the terminal and escapes registry strings (issues 22.10, 17.4)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from typer.testing import CliRunner

import rlsched.cli.commands  # noqa: F401  (registers every command)
from rlsched.cli.app import app

ROWS = [
    {"name": "rlsched-ppo", "version": v, "aliases": ["champion"] if v == 3 else [],
     "created": "2026-11-30T12:00:00+00:00",
     "tags": {"eval_mean_jct_s": "7200", "eval_cost_usd": "0", "eval_baseline_mean_jct_s": "7500",
              "eval_baseline_cost_usd": "0", "observation_signature": "a3f9c2d1e4b5a6c7d8e9f0a1",
              "git_commit": "fd924e4abcdef0123", "promoted_by": "alice\x1b]0;pwned\x07",
              "promoted_at": "2026-11-30T13:00:00"}}
    for v in (1, 2, 3)
]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("rlsched.train.registry")

    def list_versions(name: str | None) -> list[dict[str, Any]]:
        return ROWS

    fake.list_versions = list_versions  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rlsched.train.registry", fake)


@pytest.mark.parametrize("columns", [80, 120, 240])
def test_models_list_fits_the_terminal(registry: None, monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    out = CliRunner().invoke(app, ["models", "list"])
    assert out.exit_code == 0, out.output
    table = [line for line in out.output.splitlines() if line[:1] in "┏┃┡│└"]
    assert max(len(line) for line in table) <= columns, out.output
    assert "…" not in out.output
    header = table[1]
    for always in ("model", "version", "aliases", "JCT vs WP"):
        assert always in header
    if columns >= 240:
        assert "signature" in header and "not shown" not in out.output
    else:
        assert "not shown, to fit the terminal: signature" in out.output
    assert "\x1b" not in out.output and "\x07" not in out.output


def test_no_cost_ratio_when_the_baseline_paid_nothing(registry: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    out = CliRunner().invoke(app, ["models", "list"]).output
    row = next(line for line in out.splitlines() if "│ rlsched-ppo" in line and "champion" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[6] == "0.960" and cells[7] == "-", cells  # JCT vs WP, cost vs WP
    assert "alice\\e]0;pwned\\a" in out
