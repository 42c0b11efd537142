"""Without NVML the GPU checks skip with a clear message: they never fail (runs everywhere)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_gpu_tests_skip_when_nvml_cannot_initialise() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE / "plugins"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", str(HERE / "test_gpu_check.py"), "-q", "-rs",
         "-p", "no:cacheprovider", "-p", "no_nvml"],
        capture_output=True, text=True, env=env, cwd=HERE.parent.parent, timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "3 skipped" in out and "no NVIDIA GPU/driver" in out and "failed" not in out, out
