"""The market generator: seeded draws, documented ranges, CSV round trip, bad input."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from rlsched.cluster.shorthand import parse_cluster
from rlsched.market.canonical import read_availability, read_prices
from rlsched.market.generator import (
    MARKET_FAMILIES,
    MarketSpec,
    MarketSpecError,
    generate_market,
    market_family,
    random_market,
    spot_cluster,
    with_market_overrides,
)


def test_a_draw_is_a_pure_function_of_its_seed() -> None:
    spec = market_family("mkt-regional")
    a, b = generate_market(spec, 7), generate_market(spec, 7)
    assert a.prices == b.prices and a.availability == b.availability
    c = generate_market(spec, 8)
    assert c.prices != a.prices and c.availability != a.availability


@pytest.mark.parametrize("name", sorted(MARKET_FAMILIES))
def test_every_family_stays_in_its_documented_ranges(name: str) -> None:
    spec = MARKET_FAMILIES[name]
    for seed in (0, 1):
        drawn = generate_market(spec, seed, gpu_model="A100-80GB", spot_nodes=8)
        market = drawn.market()
        pools = parse_cluster(spot_cluster(spec, "A100-80GB", 8, 8))
        market.check_pools(pools)  # every pool of the fleet is priced
        top = round(spec.capacity * 8)
        assert all(0 <= r.available_nodes <= top for r in drawn.availability)
        assert all(r.time_s == int(r.time_s) for r in (*drawn.prices, *drawn.availability))
        spot = [p for p in pools if p.kind.value == "spot"]
        od = next(p for p in pools if p.kind.value == "ondemand")
        for h in range(0, int(spec.horizon_days * 24), 5):
            for pool in spot:
                ratio = market.price(pool, h * 3600.0) / market.price(od, h * 3600.0)
                assert 0.05 - 1e-6 <= ratio <= 1.0 + 1e-3  # spot never dearer than on-demand
        # the realised mean ratio stays near the family's (drift and jumps move it, not away from (0, 1])
        assert 0.5 * spec.spot_ratio <= drawn.mean_ratio() <= min(1.0, 2.0 * spec.spot_ratio)


def test_the_availability_processes_differ_in_kind() -> None:
    def hours_at(name: str, test: object) -> float:
        drawn = generate_market(market_family(name), 3, spot_nodes=8)
        m = drawn.market()
        pool = parse_cluster(spot_cluster(drawn.spec, "H100-80GB", 8, 8))[0]
        return sum(bool(test(m.spot_available(pool, t * 600.0))) for t in range(30 * 144)) / 6.0  # type: ignore[operator]

    assert hours_at("mkt-long-outages", lambda n: n == 0) > 24  # ~1.5 x 12 h a week
    assert hours_at("mkt-cheap-stable", lambda n: n == 0) == 0
    levels = {r.available_nodes for r in generate_market(market_family("mkt-correlated-outages"), 3).availability}
    assert {8, 4, 1} <= levels  # the whole pool, half, an eighth
    regional = generate_market(with_market_overrides(market_family("mkt-regional"), region_correlation=1.0,
                                                     levels=(1.0,), reclaim_per_node_hour=0.0), 2)
    zero = {r: {a.time_s for a in regional.availability if a.region == r and a.available_nodes == 0}
            for r in regional.spec.region_names()}
    assert len(zero) == 3 and zero["region-a"] and zero["region-a"] == zero["region-b"] == zero["region-c"]


def test_csv_round_trip_gives_the_same_market(tmp_path: Path) -> None:
    drawn = generate_market(market_family("mkt-volatile"), 5, gpu_model="V100-16GB", spot_nodes=6)
    prices, avail = drawn.write(tmp_path)
    back_p, back_a = read_prices(prices), read_availability(avail)
    mem = drawn.market()
    for key, s in mem.prices.series.items():
        other = back_p.series[key]
        assert other.period == s.period and np.array_equal(other.values, s.values)
    for key, s in mem.availability.series.items():  # type: ignore[union-attr]
        assert np.array_equal(back_a.series[key].values, s.values)


def test_random_markets_cover_the_documented_ranges_and_honour_exclusions() -> None:
    draws = [random_market(np.random.default_rng(i)) for i in range(60)]
    for d in draws:
        d.validate()
        assert 0.2 <= d.spot_ratio <= 0.9
    assert any(d.regions > 1 for d in draws) and any(len(d.levels) > 1 for d in draws)
    assert any(d.outages_per_week > 0 for d in draws)
    ex = ["mkt-regional", "mkt-correlated-outages", "mkt-expensive", "mkt-volatile", "mkt-long-outages"]
    for i in range(40):
        d = random_market(np.random.default_rng(i), exclude=ex)
        assert d.regions == 1 and d.levels == (1.0,) and d.spot_ratio <= 0.6
        assert d.price_volatility <= 0.1 and d.price_jumps_per_week == 0 and d.price_step_h >= 12
        assert d.outages_per_week == 0 or d.outage_h <= 2.0
    with pytest.raises(MarketSpecError, match="unknown market family 'mkt-nope'"):
        random_market(np.random.default_rng(0), exclude=["mkt-nope"])


@pytest.mark.parametrize(("overrides", "message"), [
    ({"spot_ratio": 0.0}, "spot_ratio must be in (0, 1]"),
    ({"spot_ratio": 1.2}, "spot_ratio must be in (0, 1]"),
    ({"reclaim_per_node_hour": -0.1}, "reclaim_per_node_hour must be >= 0"),
    ({"outages_per_week": -1.0}, "outages_per_week must be >= 0"),
    ({"levels": (1.0, 1.5)}, "levels needs at least one fraction in [0, 1]"),
    ({"regions": 0}, "regions must be in 1..8"),
    ({"price_step_h": 0.0}, "price_step_h must be > 0"),
])
def test_impossible_parameters_are_named(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(MarketSpecError, match="market family 'x': " + re.escape(message)):
        generate_market(with_market_overrides(MarketSpec("x"), **overrides))
    with pytest.raises(MarketSpecError, match="unknown parameter 'ratio'"):
        with_market_overrides(MarketSpec("x"), ratio=0.5)
    with pytest.raises(MarketSpecError, match="no on-demand list price for GPU model RTX6000"):
        generate_market(MarketSpec("x"), gpu_model="RTX6000")  # a catalogue GPU the bundled market does not sell
    with pytest.raises(MarketSpecError, match="unknown GPU model 'Z80'"):
        generate_market(MarketSpec("x"), gpu_model="Z80")


def _cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from rlsched.cli import main

    monkeypatch.setattr(sys, "argv", ["rlsched", "market", "generate", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_writes_the_canonical_csvs_and_refuses_bad_input_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _cli(monkeypatch, capsys, "--family", "mkt-long-outages", "--seed", "4", "--gpu", "A100-80GB",
                        "--out", str(tmp_path / "m"))
    assert code == 0 and "availability rows" in out and "--cluster spot:0-8x8xA100-80GB" in out
    drawn = generate_market(market_family("mkt-long-outages"), 4, gpu_model="A100-80GB")
    assert read_prices(tmp_path / "m" / "prices.csv").rows == sorted(drawn.prices, key=lambda r: (r.key, r.time_s))
    for args, message in (
        (["--family", "mkt-volatil", "--out", str(tmp_path)], "unknown market family 'mkt-volatil' (did you mean"),
        (["--family", "mkt-volatile", "--set", "spot_ratio=1.5", "--out", str(tmp_path)], "spot_ratio must be in"),
        (["--family", "mkt-volatile", "--set", "reclaim_per_node_hour=-2", "--out", str(tmp_path)], ">= 0"),
        (["--family", "mkt-volatile"], "--out DIR is required"),
    ):
        code, _, err = _cli(monkeypatch, capsys, *args)
        assert code == 1 and err.startswith("error: ") and message in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
