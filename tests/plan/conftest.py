"""Fixtures for the end-to-end tests: a simulated fleet file, a pool spec, and the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The plan commands register themselves on import; importing them explicitly keeps these
# tests independent of which command modules rlsched.cli.commands already lists.
CLI = ("import importlib, contextlib\n"
       "for m in ('rlsched.cli.plan_cmd', 'rlsched.cli.backend_cmd'):\n"
       "    with contextlib.suppress(ImportError): importlib.import_module(m)\n"
       "from rlsched.cli import main; main()")

POOL_HCL = """
mig_layout "balanced" {
  devices = { "1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1 }
}

pool "train" {
  gpu_model = "H100-80GB"
  nodes     = ["gpu-h100-01"]
  mig       = "disabled"
  disruption {
    drain_timeout   = "%(drain)s"
    max_unavailable = 1
  }
}

pool "rollout" {
  gpu_model  = "H100-80GB"
  nodes      = ["gpu-h100-02", "gpu-h100-03"]
  mig_layout = mig_layout.balanced
  disruption {
    drain_timeout   = "%(drain)s"
    max_unavailable = 1
  }
}

quota "team_rl" {
  pool       = pool.rollout
  principal  = "team:rl"
  max_slices = { "1g.10gb" = 4 }
}
"""


def _have_real_modules() -> bool:
    try:
        from rlsched.runtime.sim_backend import SimulatedBackend  # noqa: F401
        from rlsched.spec import load_spec  # noqa: F401
    except ImportError:
        return False
    return True


needs_real = pytest.mark.skipif(not _have_real_modules(), reason="HCL loader or simulated backend not available")


def write_fleet(path: Path, nodes: str = "3x2xH100-80GB") -> Path:
    from rlsched.runtime.sim_backend import build_fleet, write_json_atomic

    write_json_atomic(path, build_fleet(nodes))
    return path


class Workspace:
    """A temp dir with fleet.json, pool.hcl and a CLI runner pointed at them."""

    def __init__(self, root: Path, drain: str = "5s") -> None:
        self.root = root
        self.fleet = write_fleet(root / "fleet.json")
        self.spec = root / "pool.hcl"
        self.spec.write_text(POOL_HCL % {"drain": drain})
        self.state = root / "rlsched.state.json"
        self.env = {**os.environ, "RLSCHED_BACKEND": f"sim:{self.fleet}", "PYTHONUNBUFFERED": "1"}
        self.env.pop("RLSCHED_APPLY_STEP_DELAY", None)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-c", CLI, *args]

    def run(self, *args: str, input: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), cwd=self.root, capture_output=True, text=True, input=input,
                              env={**self.env, **(env or {})}, timeout=timeout)

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**self.env, **(env or {})})

    def backend(self) -> Any:
        from rlsched.runtime.sim_backend import SimulatedBackend

        return SimulatedBackend(self.fleet)

    def plan_json(self) -> dict[str, Any]:
        proc = self.run("plan", str(self.spec), "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


@pytest.fixture
def ws(tmp_path: Path) -> Callable[..., Workspace]:
    def make(**kw: Any) -> Workspace:
        return Workspace(tmp_path, **kw)

    return make
