"""Every file the README's pool-spec walk-through uses is shipped, validates, and gives the output shown."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rlsched.cli.commands  # noqa: F401  (registers every command)
from rlsched.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGS = sorted((ROOT / "configs").glob("*.hcl"))


def test_every_config_the_readme_names_exists() -> None:
    named = set(re.findall(r"configs/[\w.-]+\.hcl", README))
    assert "configs/small.hcl" in named
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"README names files that are not shipped: {missing}"


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_validates(config: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(config)])
    assert result.exit_code == 0, result.output
    assert "Success! The configuration is valid." in result.output


def test_configs_readme_lists_every_config() -> None:
    text = (ROOT / "configs" / "README.md").read_text()
    assert "to come" not in text
    for config in CONFIGS:
        assert f"`{config.name}`" in text, f"configs/README.md does not describe {config.name}"


def test_the_readme_mig_error_is_what_small_hcl_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk-through's error block (file, line, column, message) is real output for the edited small.hcl."""
    block = re.search(r"\$ sed -i '(s/[^']+)' small\.hcl\n\$ rlsched validate small\.hcl\n(.*?)```", README, re.S)
    assert block, "README: the MIG error example is missing"
    sub, expected = block.group(1), block.group(2)
    _, old, new, _ = sub.split("/")
    spec = tmp_path / "small.hcl"
    shutil.copy(ROOT / "configs" / "small.hcl", spec)
    spec.write_text(spec.read_text().replace(old, new))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", "small.hcl"])
    assert result.exit_code == 1
    assert expected.strip() in result.output.strip()
