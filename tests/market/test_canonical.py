"""Canonical price / availability CSVs: happy path and every documented error."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.errors import MarketError
from rlsched.market.canonical import (
    AvailabilityRow,
    PriceRow,
    read_availability,
    read_prices,
    write_availability,
    write_prices,
)


def _write(tmp_path: Path, text: str, name: str = "p.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_read_prices_happy_path(tmp_path: Path) -> None:
    p = _write(tmp_path, "time_s,gpu_model,capacity,usd_per_gpu_hour,region,extra\n"
                         "3600,h100-80gb,spot,2.5,us-central1,x\n"
                         "0,H100-80GB,spot,3.0,us-central1,\n"
                         "0,H100-80GB,on_demand,11,us-central1,\n"
                         "0,V100M16,on-demand,3.06,\n")
    t = read_prices(p)
    assert t.models() == ["H100-80GB", "V100-16GB"]
    s = t.get("H100-80GB", "spot", "us-central1")
    assert s is not None
    assert s.value_at(0) == 3.0
    assert s.value_at(3600) == 2.5
    assert t.get("V100-16GB", "on_demand") is not None
    assert t.regions("H100-80GB", "spot") == ["us-central1"]


def test_one_regions_series_wrap_around_together(tmp_path: Path) -> None:
    # us-central1: on-demand changes at 0 and 100 (own period 200), spot at 0, 100, 200, 300 (own period
    # 400). One history: both wrap at 400, so at t=250 on-demand still holds its last price (on its own
    # it would already have started over) and spot and on-demand come from the same recorded moment.
    # Another region keeps its own period; a single-valued key stays constant.
    p = _write(tmp_path, "time_s,gpu_model,capacity,usd_per_gpu_hour,region\n"
                         "0,H100-80GB,on_demand,11,us-central1\n100,H100-80GB,on_demand,6,us-central1\n"
                         "0,H100-80GB,spot,8,us-central1\n100,H100-80GB,spot,4,us-central1\n"
                         "200,H100-80GB,spot,3,us-central1\n300,H100-80GB,spot,2.5,us-central1\n"
                         "0,H100-80GB,on_demand,10,us-east1\n100,H100-80GB,on_demand,5,us-east1\n"
                         "0,A100-80GB,on_demand,5,us-central1\n")
    t = read_prices(p)
    od, spot = t.get("H100-80GB", "on_demand", "us-central1"), t.get("H100-80GB", "spot", "us-central1")
    other, flat = t.get("H100-80GB", "on_demand", "us-east1"), t.get("A100-80GB", "on_demand", "us-central1")
    assert od is not None and spot is not None and other is not None and flat is not None
    assert od.period == spot.period == 400.0
    assert od.value_at(250) == 6.0 and spot.value_at(250) == 3.0
    assert od.value_at(450) == 11.0 and spot.value_at(450) == 8.0  # the history starts over, together
    assert other.period == 200.0 and other.value_at(250) == 10.0
    assert flat.value_at(1e9) == 5.0
    assert read_prices(p, period_s=1000.0).get("H100-80GB", "on_demand", "us-central1").period == 1000.0  # type: ignore[union-attr]


def test_prices_round_trip(tmp_path: Path) -> None:
    rows = [PriceRow(0.0, "A100-40GB", "spot", 1.25, "r1"), PriceRow(60.5, "A100-40GB", "spot", 1.5, "r1")]
    out = tmp_path / "o.csv"
    assert write_prices(out, rows) == 2
    assert read_prices(out).rows == rows


def test_availability_round_trip(tmp_path: Path) -> None:
    rows = [AvailabilityRow(0.0, "L4", 4), AvailabilityRow(100.0, "L4", 0)]
    out = tmp_path / "a.csv"
    write_availability(out, rows)
    t = read_availability(out)
    s = t.get("L4")
    assert s is not None
    assert s.value_at(50) == 4
    assert s.value_at(150) == 0


@pytest.mark.parametrize(
    ("body", "line", "column", "fragment"),
    [
        ("0,H100-80GB,spot,-1\n", 2, "usd_per_gpu_hour", "> 0"),
        ("0,H100-80GB,spot,0\n", 2, "usd_per_gpu_hour", "> 0"),
        ("0,H100-80GB,spot,\n", 2, "usd_per_gpu_hour", "missing"),
        ("0,H100-80GB,spot,abc\n", 2, "usd_per_gpu_hour", "not a number"),
        ("0,H100-80GB,spot,1\n5,Z9000,spot,1\n", 3, "gpu_model", "Z9000"),
        ("0,H100-80GB,preemptible,1\n", 2, "capacity", "unknown capacity"),
        ("x,H100-80GB,spot,1\n", 2, "time_s", "not a number"),
        ("0,H100-80GB,spot,1\n10,H100-80GB,spot,2\n10,H100-80GB,spot,3\n", 4, "time_s", "duplicate"),
    ],
)
def test_price_errors_name_line_and_column(tmp_path: Path, body: str, line: int, column: str, fragment: str) -> None:
    p = _write(tmp_path, "time_s,gpu_model,capacity,usd_per_gpu_hour\n" + body)
    with pytest.raises(MarketError) as ei:
        read_prices(p)
    msg = str(ei.value)
    assert f"{p}:{line}" in msg
    assert f"column {column}" in msg
    assert fragment in msg
    assert ei.value.line == line and ei.value.column == column


def test_same_time_in_other_region_is_fine(tmp_path: Path) -> None:
    p = _write(tmp_path, "time_s,gpu_model,capacity,usd_per_gpu_hour,region\n0,L4,spot,1,a\n0,L4,spot,2,b\n")
    assert read_prices(p).regions("L4", "spot") == ["a", "b"]


def test_missing_column_and_empty_file(tmp_path: Path) -> None:
    p = _write(tmp_path, "time_s,gpu_model,usd_per_gpu_hour\n0,L4,1\n")
    with pytest.raises(MarketError, match=r"p\.csv:1 \(column capacity\)"):
        read_prices(p)
    e = _write(tmp_path, "", "e.csv")
    with pytest.raises(MarketError, match="empty file"):
        read_prices(e)
    h = _write(tmp_path, "time_s,gpu_model,capacity,usd_per_gpu_hour\n", "h.csv")
    with pytest.raises(MarketError, match="no data rows"):
        read_prices(h)


def test_availability_wrong_columns(tmp_path: Path) -> None:
    # A price file given as availability: the required column is named.
    p = _write(tmp_path, "time_s,gpu_model,capacity,usd_per_gpu_hour\n0,L4,spot,1\n", "a.csv")
    with pytest.raises(MarketError) as ei:
        read_availability(p)
    assert "a.csv:1" in str(ei.value) and "column available_nodes" in str(ei.value)


@pytest.mark.parametrize(
    ("body", "line", "column"),
    [
        ("0,L4,-1\n", 2, "available_nodes"),
        ("0,L4,1.5\n", 2, "available_nodes"),
        ("0,L4,\n", 2, "available_nodes"),
        ("0,L4,1\n0,L4,2\n", 3, "time_s"),
        ("0,NoSuchGPU,1\n", 2, "gpu_model"),
    ],
)
def test_availability_errors(tmp_path: Path, body: str, line: int, column: str) -> None:
    p = _write(tmp_path, "time_s,gpu_model,available_nodes\n" + body, "a.csv")
    with pytest.raises(MarketError) as ei:
        read_availability(p)
    assert f"a.csv:{line} (column {column})" in str(ei.value)
