"""Converters on small slices of the real public data (tests/data/market)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.errors import MarketError
from rlsched.market.canonical import PriceTable, read_prices, write_prices
from rlsched.market.sources import AWS_ONDEMAND_LIST_USD_PER_GPU_HOUR, convert_aws, convert_azure, convert_gcp


def test_gcp_per_gpu_and_window(data_dir: Path) -> None:
    rows, meta = convert_gcp([data_dir / "gcp_changepoints_slice.csv"], region="us-central1",
                             start="2024-06-01", end="2025-06-01")
    keys = {r.key for r in rows}
    assert ("H100-80GB", "spot", "us-central1") in keys
    assert ("A100-40GB", "on_demand", "us-central1") in keys
    assert all(r.region == "us-central1" for r in rows)
    assert min(r.time_s for r in rows) == 0.0
    assert max(r.time_s for r in rows) < 366 * 86400
    od = [r for r in rows if r.key == ("A100-40GB", "on_demand", "us-central1")]
    # a2-highgpu-1g is $3.673385 per VM-hour for 1 GPU (the median shape is the same per GPU).
    assert od[0].usd_per_gpu_hour == pytest.approx(3.673385, rel=1e-6)
    h100 = [r.usd_per_gpu_hour for r in rows if r.key == ("H100-80GB", "on_demand", "us-central1")]
    assert all(5.0 < p < 15.0 for p in h100)
    # The converted rows are a valid canonical table.
    PriceTable.from_rows(rows)
    assert meta.regions["H100-80GB"] == ["us-central1"]


def test_gcp_default_region_and_all(data_dir: Path) -> None:
    rows, meta = convert_gcp([data_dir / "gcp_changepoints_slice.csv"])
    assert all(len(v) == 1 for v in meta.regions.values())
    rows_all, meta_all = convert_gcp([data_dir / "gcp_changepoints_slice.csv"], region="all")
    assert set(meta_all.regions["H100-80GB"]) == {"us-central1", "europe-west4"}
    assert len(rows_all) > len(rows)
    # Spot was not offered before 2023-05: derived availability marks 0 nodes then.
    zero = [a for a in meta.availability if a.available_nodes == 0 and a.time_s == 0.0]
    assert zero


def test_aws_spot_and_list_ondemand(data_dir: Path, tmp_path: Path) -> None:
    rows, meta = convert_aws([data_dir / "aws_spot_slice.csv"], region="us-east-1")
    assert meta.regions == {"K80": ["us-east-1"], "V100-16GB": ["us-east-1"]}
    od = {r.gpu_model: r.usd_per_gpu_hour for r in rows if r.capacity == "on_demand"}
    assert od == AWS_ONDEMAND_LIST_USD_PER_GPU_HOUR
    spot = [r.usd_per_gpu_hour for r in rows if r.key == ("V100-16GB", "spot", "us-east-1")]
    assert spot and all(0.5 < p < 3.06 for p in spot)
    out = tmp_path / "aws.csv"
    write_prices(out, rows)
    assert read_prices(out).models("spot") == ["K80", "V100-16GB"]
    per_az, meta_az = convert_aws([data_dir / "aws_spot_slice.csv"], region="all", per_az=True)
    assert any(r.endswith(("a", "b", "c", "d", "e", "f")) for r in meta_az.regions["K80"])
    assert per_az


def test_azure_with_mapping(data_dir: Path) -> None:
    files = [data_dir / "azure_lowpri_price_us_east.csv", data_dir / "azure_lowpri_price_us_south_central.csv",
             data_dir / "azure_instance_mapping.csv"]
    rows, meta = convert_azure(files, region="us-east")
    assert {r.capacity for r in rows} == {"spot"}
    k80 = [r for r in rows if r.gpu_model == "K80"]
    # NC6 (1x K80) at $0.12276 per VM-hour on 2/24/2020; NC12 (2x) and NC24 (4x) give the same per GPU.
    assert k80[0].time_s == 0.0
    assert k80[0].usd_per_gpu_hour == pytest.approx(0.12276)
    assert set(meta.regions) == {"K80", "P100-16GB", "V100-16GB"}


def test_converter_errors_name_location(tmp_path: Path) -> None:
    bad = tmp_path / "gcp.csv"
    bad.write_text("snapshot_utc,instance_type,gpu_model,gpu_count,region,hour_ondemand_usd,hour_spot_usd\n"
                   "2024-01-01T00:00:00Z,x,a100,1,r,abc,\n")
    with pytest.raises(MarketError, match=r"gcp\.csv:2 \(column hour_ondemand_usd\)"):
        convert_gcp([bad])
    missing = tmp_path / "aws.csv"
    missing.write_text("timestamp_utc,region\n")
    with pytest.raises(MarketError, match="availability_zone"):
        convert_aws([missing])
