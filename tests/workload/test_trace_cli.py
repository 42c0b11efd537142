"""``rlsched trace convert`` / ``rlsched trace info`` through Typer's test runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsched.cli import trace_cmd  # noqa: F401  (registers the commands)
from rlsched.cli.app import app
from rlsched.errors import TraceError
from rlsched.workload import read_canonical, read_openb_pods

runner = CliRunner()


def test_convert_openb_to_canonical(data_dir: Path, tmp_path: Path) -> None:
    src, dst = data_dir / "openb_pods_slice.csv", tmp_path / "out.csv"
    result = runner.invoke(app, ["trace", "convert", str(src), str(dst)])
    assert result.exit_code == 0, result.output
    original = read_openb_pods(src)
    assert f"wrote {len(original)} jobs" in result.output
    assert "1 zero duration" in result.output and f"{original.censored} censored" in result.output
    back = read_canonical(dst)
    assert back.jobs == original.jobs


def test_convert_philly_one_vc_max_jobs(data_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "vc.csv"
    result = runner.invoke(
        app,
        ["trace", "convert", str(data_dir / "philly_slice.csv"), str(dst), "--format", "philly",
         "--virtual-cluster", "6214e9", "--max-jobs", "3"],
    )
    assert result.exit_code == 0, result.output
    tr = read_canonical(dst)
    assert len(tr) == 3 and {j.user for j in tr.jobs} == {"6214e9"}


def test_convert_skip_bad_rows(tmp_path: Path) -> None:
    src, dst = tmp_path / "in.csv", tmp_path / "out.csv"
    src.write_text("submit_time,duration,num_gpus\n0,1,1\n0,-1,1\n")
    result = runner.invoke(app, ["trace", "convert", str(src), str(dst)])
    assert isinstance(result.exception, TraceError) and result.exception.line == 3
    result = runner.invoke(app, ["trace", "convert", str(src), str(dst), "--skip-bad-rows"])
    assert result.exit_code == 0 and "skipped 1 (1 bad row)" in result.output


@pytest.mark.parametrize("args", [["--format", "xls"], []])
def test_convert_errors_are_rlsched_errors(tmp_path: Path, args: list[str]) -> None:
    result = runner.invoke(app, ["trace", "convert", str(tmp_path / "none.csv"), str(tmp_path / "o.csv"), *args])
    assert isinstance(result.exception, TraceError)


def test_info_table(data_dir: Path) -> None:
    result = runner.invoke(app, ["trace", "info", str(data_dir / "dlrm_slice.csv"), "--capacity", "8"])
    assert result.exit_code == 0, result.output
    assert "services" in result.output and "offered load on 8 GPUs" in result.output
    assert "GPU demand by num_gpus" in result.output
