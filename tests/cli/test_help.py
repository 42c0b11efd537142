"""Every command's ``--help`` renders: help text is user input to rich, and a stray
``[/...]`` in an option description once crashed ``rlsched simulate --help``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

import rlsched.cli.commands  # noqa: F401  (registers every command)
from rlsched.cli.app import app


def _paths(cmd: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield prefix
    # typer vendors its own click, so test for a group by its shape, not its class
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _paths(sub, (*prefix, name))


COMMANDS = list(_paths(typer.main.get_command(app)))


def test_the_command_tree_is_walked() -> None:
    names = {p[0] for p in COMMANDS if p}
    assert {"simulate", "train", "validate", "plan", "apply"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "rlsched")
def test_help_renders(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "Usage" in result.output
