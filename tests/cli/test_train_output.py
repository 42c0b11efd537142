"""MLflow's INFO log lines stay out of ``rlsched train`` / ``models`` output unless asked for (issue 22.10)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
from rlsched.cli.train_cmd import mlflow_log_level
mlflow_log_level(verbose=sys.argv[1] == "verbose")
import mlflow
mlflow.set_tracking_uri("sqlite:///mlruns.db")
mlflow.search_experiments()
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_mlflow_info_lines_only_when_verbose(tmp_path: Path, verbose: bool) -> None:
    pytest.importorskip("mlflow")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_LOGGING_LEVEL"}
    p = subprocess.run([sys.executable, "-c", SCRIPT, "verbose" if verbose else "quiet"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    creating = "Creating initial MLflow database tables" in p.stderr
    assert creating == verbose, p.stderr
    if not verbose:
        assert " INFO " not in p.stderr, p.stderr


def test_train_has_a_verbose_flag() -> None:
    from typer.testing import CliRunner

    import rlsched.cli.commands  # noqa: F401  (registers every command)
    from rlsched.cli.app import app

    out = CliRunner().invoke(app, ["train", "--help"], terminal_width=200).output
    assert "--verbose" in out and "MLflow" in out
