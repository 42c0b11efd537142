"""Shared helpers for the runtime tests: a fleet file and the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.runtime.sim_backend import build_fleet, write_json_atomic

# Until rlsched.cli.commands imports backend_cmd, import it explicitly before main().
CLI = [sys.executable, "-c", "import rlsched.cli.backend_cmd; from rlsched.cli import main; main()"]


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "RLSCHED_BACKEND"}
    full_env.update(env or {})
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=120)


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """Two H100 nodes (balanced MIG), one A100-40GB node (MIG off), one V100 node."""
    path = tmp_path / "fleet.json"
    write_json_atomic(path, build_fleet("2x4xH100-80GB:balanced,1x2xA100-40GB,1x2xV100-16GB"))
    return path
