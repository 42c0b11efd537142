"""What users expect of a CLI (issue 22.9): --version, shell completion, a complete grouped command
list, and help text without reStructuredText markup."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

import pytest
import typer.main
from typer.testing import CliRunner

import rlsched.cli.commands  # noqa: F401  (registers every command)
from rlsched.cli.app import HELP_SECTIONS, OTHER_SECTION, app, section_of

from .test_help import COMMANDS

ROOT = typer.main.get_command(app)
TOP = {name: cmd for name, cmd in ROOT.commands.items()}  # type: ignore[attr-defined]


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"rlsched {metadata.version('rlsched')}\n"


def test_every_command_is_in_a_named_section_of_the_help() -> None:
    homeless = sorted(name for name, cmd in TOP.items() if section_of(name, cmd) == OTHER_SECTION)
    assert not homeless, f"add these to HELP_SECTIONS in rlsched/cli/app.py: {homeless}"
    out = CliRunner().invoke(app, ["--help"], terminal_width=100).output
    headers = [line[:-1] for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headers == ["Options", *HELP_SECTIONS], out
    listed = re.findall(r"^  ([a-z][a-z-]*)  ", out, re.M)
    assert sorted(listed) == sorted(TOP), "the command list must name every command exactly once"


@pytest.mark.parametrize("group", ["", "trace", "market", "inventory", "state", "models"])
def test_command_lists_are_never_truncated(group: str) -> None:
    out = CliRunner().invoke(app, [*group.split(), "--help"], terminal_width=80).output
    assert "..." not in out.split("\n", 1)[1], out  # the usage line has COMMAND [ARGS]...


def test_short_help_is_whole() -> None:
    out = CliRunner().invoke(app, ["--help"], terminal_width=100).output
    for name, cmd in TOP.items():
        first = (cmd.help or "").strip().split("\n\n")[0].split(". ")[0]
        assert " ".join(first.split()[:3]) in " ".join(out.split()), name


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "rlsched")
def test_help_has_no_rst_markup(path: tuple[str, ...]) -> None:
    out = CliRunner().invoke(app, [*path, "--help"], terminal_width=200).output
    for token in ("``", ":func:", ":class:", ":mod:", ":meth:", ":data:"):
        assert token not in out, f"rlsched {' '.join(path)} --help shows {token!r}:\n{out}"
    assert not re.search(r"^\s*\.\. \w+::", out, re.M), out  # no RST directive


def test_shell_completion_is_offered_and_completes_commands() -> None:
    out = CliRunner().invoke(app, ["--help"]).output
    assert "--install-completion" in out and "--show-completion" in out
    env = {**os.environ, "_RLSCHED_COMPLETE": "complete_bash", "COMP_WORDS": "rlsched sim", "COMP_CWORD": "1"}
    p = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'rlsched'; from rlsched.cli import main; "
                        "main()"], env=env, capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["simulate"], (p.stdout, p.stderr)


def test_policy_names_complete() -> None:
    env = {**os.environ, "_RLSCHED_COMPLETE": "complete_bash", "COMP_WORDS": "rlsched simulate --policy spot-",
           "COMP_CWORD": "3"}
    p = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'rlsched'; from rlsched.cli import main; "
                        "main()"], env=env, capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["spot-fallback", "spot-greedy"], (p.stdout, p.stderr)
