"""``rlsched market convert`` and ``show`` through Typer's runner."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from rlsched.cli import market_cmd  # noqa: F401  (registers the commands)
from rlsched.cli.app import app
from rlsched.market.canonical import read_availability, read_prices

runner = CliRunner()


def test_convert_gcp_and_show(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    av = tmp_path / "a.csv"
    res = runner.invoke(app, ["market", "convert", "--source", "gcp", "--input",
                              str(data_dir / "gcp_changepoints_slice.csv"), "--out-prices", str(out),
                              "--out-availability", str(av), "--region", "us-central1", "--start", "2023-01-01"])
    assert res.exit_code == 0, res.output
    assert "gcp:" in res.output and "price rows" in res.output
    assert read_prices(out).regions("H100-80GB", "spot") == ["us-central1"]
    assert read_availability(av).get("A100-40GB", "us-central1") is not None
    png = tmp_path / "p.png"
    res = runner.invoke(app, ["market", "show", str(out), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "H100-80GB" in res.output
    assert png.stat().st_size > 1000


def test_convert_azure_and_aws(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "az.csv"
    res = runner.invoke(app, ["market", "convert", "--source", "azure",
                              "--input", str(data_dir / "azure_lowpri_price_us_east.csv"),
                              "--input", str(data_dir / "azure_instance_mapping.csv"), "--out-prices", str(out)])
    assert res.exit_code == 0, res.output
    assert read_prices(out).models("spot") == ["K80", "P100-16GB", "V100-16GB"]
    out2 = tmp_path / "aws.csv"
    res = runner.invoke(app, ["market", "convert", "--source", "aws", "--input", str(data_dir / "aws_spot_slice.csv"),
                              "--out-prices", str(out2), "--start", "2020-01-01", "--end", "2020-02-01"])
    assert res.exit_code == 0, res.output
    assert max(r.time_s for r in read_prices(out2).rows) < 31 * 86400


def test_show_bad_file_is_a_market_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time_s,gpu_model,capacity,usd_per_gpu_hour\n0,H100-80GB,spot,-2\n")
    res = runner.invoke(app, ["market", "show", str(bad)])
    assert res.exit_code != 0
    assert "bad.csv:2" in str(res.exception)
