"""The steps every training run shares: one run per run folder, and a holder killed with -9 frees it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.errors import RlschedError
from rlsched.train.run_steps import hold_run_dir

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
from pathlib import Path
from rlsched.train.run_steps import hold_run_dir
with hold_run_dir(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def _hold(run_dir: Path) -> subprocess.Popen[str]:
    """A real process holding ``run_dir`` (it prints ``held`` once it has the lock)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_train_on_a_held_run_folder_is_one_line_and_touches_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = _hold(run_dir)
    try:
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "latest.json").write_text('{"path": "step-000000064.zip", "steps": 64}')
        res = subprocess.run([sys.executable, "-m", "rlsched", "train", str(ROOT / "experiments" / "smoke.yaml"),
                              "--run-dir", str(run_dir), "--no-track", "--quiet"],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert res.returncode != 0
        err = res.stderr.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert str(run_dir) in err and f"pid {holder.pid}" in err and "--run-dir" in err, err
        # the other run's files are as they were
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest.json"]
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_killed_with_9_leaves_the_folder_free(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = _hold(run_dir)
    with pytest.raises(RlschedError, match=f"pid {holder.pid}"), hold_run_dir(run_dir):
        pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with hold_run_dir(run_dir):  # the kernel dropped the dead holder's flock
        assert (run_dir / ".lock").read_text().strip() == str(os.getpid())
