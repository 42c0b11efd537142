"""TableMarket and the bundled default market."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlsched.cluster.catalog import gpu_model
from rlsched.cluster.model import PoolKind, PoolSpec
from rlsched.errors import RlschedError
from rlsched.market import Market, default_market, provision_delay_s
from rlsched.market.canonical import AvailabilityRow, AvailabilityTable, PriceRow, PriceTable
from rlsched.market.market import TableMarket
from rlsched.market.preemption import ExponentialPreemption


def pool(kind: PoolKind, model: str = "H100-80GB", region: str = "", cost: float | None = None) -> PoolSpec:
    return PoolSpec(name=f"{kind.value}-{model}", kind=kind, model=gpu_model(model), gpus_per_node=8,
                    min_nodes=0, max_nodes=4, cost_per_gpu_hour=cost, region=region)


def table() -> PriceTable:
    return PriceTable.from_rows([
        PriceRow(0, "H100-80GB", "on_demand", 10.0, "r1"),
        PriceRow(0, "H100-80GB", "spot", 4.0, "r1"),
        PriceRow(3600, "H100-80GB", "spot", 2.0, "r1"),  # period = 3600 + 3600
        PriceRow(0, "H100-80GB", "spot", 1.0, "r2"),
        PriceRow(0, "H100-80GB", "on_demand", 9.0, "r2"),
    ])


def test_cost_integral_known_answer() -> None:
    m = TableMarket(table())
    p = pool(PoolKind.SPOT, region="r1")
    # 0..1h at $4, 1h..2h at $2, then wraps: 2h..3h at $4 -> $10 for 3 hours.
    assert m.cost(p, 0.0, 3 * 3600.0) == pytest.approx(10.0)
    assert m.price(p, 1800) == 4.0
    assert m.price(p, 5400) == 2.0
    assert m.ondemand_price(p, 0) == 10.0
    shifted = m.with_offset(3600.0)
    assert shifted.price(p, 0) == 2.0
    assert shifted.cost(p, 0.0, 3600.0) == pytest.approx(2.0)


def test_region_choice_fixed_cost_and_onprem() -> None:
    m = TableMarket(table())
    # No region on the pool: the cheapest market.
    assert m.price(pool(PoolKind.SPOT), 0) == 1.0
    assert m.price(pool(PoolKind.ONDEMAND), 0) == 9.0
    assert m.price(pool(PoolKind.ONDEMAND, cost=3.0), 0) == 3.0
    assert m.cost(pool(PoolKind.SPOT, cost=2.0), 0, 7200) == pytest.approx(4.0)
    onprem = pool(PoolKind.ONPREM)
    assert m.price(onprem, 0) == 0.0 and m.cost(onprem, 0, 1e6) == 0.0
    assert m.reclaim_rate_per_hour(onprem) == 0.0
    assert m.spot_available(pool(PoolKind.SPOT), 0) is None


def test_check_pools_names_missing_model() -> None:
    m = TableMarket(table())
    m.check_pools([pool(PoolKind.ONDEMAND), pool(PoolKind.ONPREM, "K80"), pool(PoolKind.ONDEMAND, "T4", cost=1)])
    with pytest.raises(RlschedError, match=r"no on_demand price for GPU model A100-80GB.*known models: H100-80GB"):
        m.check_pools([pool(PoolKind.ONDEMAND, "A100-80GB")])
    with pytest.raises(RlschedError, match="region 'r9'"):
        m.check_pools([pool(PoolKind.SPOT, region="r9")])


def test_lifetimes_and_availability() -> None:
    haz = ExponentialPreemption(0.5)
    m = TableMarket(table(), preemption={"H100-80GB": haz})
    sp = pool(PoolKind.SPOT, region="r1")
    a = m.sample_lifetime(sp, np.random.default_rng(3))
    b = m.sample_lifetime(sp, np.random.default_rng(3))
    assert a == b and a is not None and a > 0
    assert m.sample_lifetime(pool(PoolKind.ONDEMAND), np.random.default_rng(3)) is None
    assert m.reclaim_rate_per_hour(sp) == 0.5

    avail = AvailabilityTable.from_rows([AvailabilityRow(0, "H100-80GB", 4, "r1"),
                                         AvailabilityRow(3600, "H100-80GB", 2, "r1")])
    ma = TableMarket(table(), avail, preemption={"H100-80GB": haz}, offset_s=0.0)
    assert ma.spot_available(sp, 0) == 4
    assert ma.spot_available(sp, 3600) == 2
    assert ma.availability_changes(sp, 1, 7201) == [3600.0, 7200.0]  # 7200: wrap back to 4
    # Reclaims come from availability drops only.
    assert ma.sample_lifetime(sp, np.random.default_rng(0)) is None
    # One drop of half the nodes per 2-hour period.
    assert ma.reclaim_rate_per_hour(sp) == pytest.approx(0.25)
    assert ma.quote(sp, 0).spot_available_nodes == 4


def test_default_market_covers_models() -> None:
    m: Market = default_market()
    assert isinstance(m, TableMarket)
    for name in ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "V100-16GB", "K80", "T4", "L4", "A10",
                 "P100-16GB"):
        for kind in (PoolKind.SPOT, PoolKind.ONDEMAND):
            p = pool(kind, name)
            m.check_pools([p])
            price = m.price(p, 1000.0)
            assert 0.05 < price < 30.0, (name, kind, price)
            assert m.cost(p, 0, 3600) > 0
        sp = pool(PoolKind.SPOT, name)
        assert m.price(sp, 0) <= m.ondemand_price(sp, 0)
        assert m.reclaim_rate_per_hour(sp) > 0
        assert m.sample_lifetime(sp, np.random.default_rng(0)) is not None


def test_default_market_is_small() -> None:
    data = Path(__file__).resolve().parents[2] / "rlsched" / "data"
    assert sum(f.stat().st_size for f in data.glob("default_*.csv")) < 300_000


def test_provision_delay() -> None:
    assert provision_delay_s(PoolKind.ONDEMAND, "T4") == 180.0
    assert provision_delay_s("spot", "T4") == 240.0
    assert provision_delay_s(PoolKind.SPOT, gpu_model("H100-80GB")) == 360.0
    assert provision_delay_s(PoolKind.ONPREM, "H100-80GB") == 0.0
