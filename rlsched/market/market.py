""":class:`TableMarket`: the :class:`~rlsched.market.base.Market` built from canonical tables.

Rules (what the simulator sees):

* **Price of a pool.** A pool's ``cost_per_gpu_hour``, when set, always wins (on-prem,
  on-demand or spot). Otherwise on-prem pools cost 0; elastic pools read the series
  ``(pool.model.name, "spot" if SPOT else "on_demand", region)``. ``region`` is the
  pool's when set (it must exist in the table); when the pool says ``""`` the key
  without region is used if present, else the region whose mean price over one
  repetition is lowest (ties by name), i.e. a pool that does not care where it runs
  buys in the cheapest market.
* **On-demand equivalent.** ``ondemand_price`` reads the on-demand series of the
  pool's model (the pool's region if priced there, else as above). A spot pool whose
  model has no on-demand series falls back to its own spot price (then the "slack"
  signal is 0 rather than an error mid-run); an on-prem pool without one falls back
  to its fixed cost, or 0.
* **Missing prices** are reported before the run by :meth:`TableMarket.check_pools`
  (the simulator or CLI calls it), naming the model and the models the market knows.
* **Time.** Market time = simulation time + ``offset_s`` (``--market-offset``); every
  series wraps around (see :class:`~rlsched.market.series.StepSeries`).
* **Spot availability** comes from the availability table (key ``(model, region)``,
  then ``(model, "")``); no series = unlimited (None).
* **Reclaims.** With an availability series for a spot pool, reclaims come only from
  its drops: :meth:`sample_lifetime` returns None (the engine reclaims excess nodes
  when availability falls below what is held), and :meth:`reclaim_rate_per_hour` is
  the series' average fraction of nodes lost per hour. Without one, lifetimes come
  from the pool model's preemption model (Spot Advisor hazard), else the fallback
  model (the 2020 Kaplan-Meier curve), else never.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from rlsched.cluster.model import MarketQuote, PoolKind, PoolSpec
from rlsched.errors import RlschedError
from rlsched.market.canonical import AvailabilityTable, PriceTable
from rlsched.market.preemption import PreemptionModel
from rlsched.market.series import StepSeries

__all__ = ["TableMarket"]


def _capacity(pool: PoolSpec) -> str:
    return "spot" if pool.kind is PoolKind.SPOT else "on_demand"


class TableMarket:
    """A market read from canonical price (and availability) tables.

    Args:
        prices: price series per ``(model, capacity, region)``.
        availability: spot-availability series per ``(model, region)``, or None.
        preemption: per canonical GPU model, the lifetime model of its spot nodes.
        fallback_preemption: lifetime model for spot models absent from ``preemption``.
        offset_s: seconds added to simulation time before reading the market.
    """

    def __init__(
        self,
        prices: PriceTable,
        availability: AvailabilityTable | None = None,
        preemption: Mapping[str, PreemptionModel] | None = None,
        fallback_preemption: PreemptionModel | None = None,
        offset_s: float = 0.0,
    ) -> None:
        self.prices = prices
        self.availability = availability
        self.preemption: dict[str, PreemptionModel] = dict(preemption or {})
        self.fallback_preemption = fallback_preemption
        self.offset_s = float(offset_s)
        self._cache: dict[tuple[str, str, str], StepSeries | None] = {}
        self._avail_cache: dict[tuple[str, str], StepSeries | None] = {}
        self._avail_rate: dict[int, float] = {}

    def with_offset(self, offset_s: float) -> TableMarket:
        """The same market read ``offset_s`` seconds later (``--market-offset``)."""
        return TableMarket(self.prices, self.availability, self.preemption, self.fallback_preemption, offset_s)

    # ------------------------------------------------------------------ lookups
    def _series(self, model: str, capacity: str, region: str) -> StepSeries | None:
        key = (model, capacity, region)
        if key in self._cache:
            return self._cache[key]
        found = self.prices.get(model, capacity, region)
        if found is None and region == "":
            regions = self.prices.regions(model, capacity)
            if regions:
                best = min(regions, key=lambda r: (self._mean(model, capacity, r), r))
                found = self.prices.get(model, capacity, best)
        self._cache[key] = found
        return found

    def _mean(self, model: str, capacity: str, region: str) -> float:
        s = self.prices.get(model, capacity, region)
        return s.mean() if s is not None else math.inf

    def _pool_series(self, pool: PoolSpec, capacity: str) -> StepSeries | None:
        s = self._series(pool.model.name, capacity, pool.region)
        if s is None and pool.region and capacity != _capacity(pool):
            # The on-demand equivalent of a regional spot pool may be priced elsewhere.
            s = self._series(pool.model.name, capacity, "")
        return s

    def _require(self, pool: PoolSpec, capacity: str) -> StepSeries:
        s = self._pool_series(pool, capacity)
        if s is None:
            raise RlschedError(self._missing_message(pool, capacity))
        return s

    def _missing_message(self, pool: PoolSpec, capacity: str) -> str:
        model = pool.model.name
        known = self.prices.models(capacity)
        if pool.region and self.prices.regions(model, capacity):
            return (f"no {capacity} price for GPU model {model} in region {pool.region!r} (pool {pool.name}); "
                    f"regions with prices: {', '.join(self.prices.regions(model, capacity))}")
        return (f"no {capacity} price for GPU model {model} in the market (pool {pool.name}); known models: "
                f"{', '.join(known) or 'none'}; set cost_per_gpu_hour on the pool or add rows to the price file")

    def _avail_series(self, pool: PoolSpec) -> StepSeries | None:
        if self.availability is None or pool.kind is not PoolKind.SPOT:
            return None
        key = (pool.model.name, pool.region)
        if key not in self._avail_cache:
            s = self.availability.get(pool.model.name, pool.region)
            if s is None and pool.region:
                s = self.availability.get(pool.model.name, "")
            if s is None and not pool.region:
                regions = sorted(r for m, r in self.availability.series if m == pool.model.name)
                # Follow the spot price's region so that prices and capacity are one market.
                price_region = self._price_region(pool.model.name, "spot")
                if price_region in regions:
                    s = self.availability.get(pool.model.name, price_region)
                elif len(regions) == 1:
                    s = self.availability.get(pool.model.name, regions[0])
            self._avail_cache[key] = s
        return self._avail_cache[key]

    def _price_region(self, model: str, capacity: str) -> str | None:
        s = self._series(model, capacity, "")
        for (m, c, r), v in self.prices.series.items():
            if m == model and c == capacity and v is s:
                return r
        return None

    def check_pools(self, pools: Iterable[PoolSpec]) -> None:
        """Fail before a run if a pool's price cannot be read from this market.

        Raises:
            RlschedError: for the first elastic pool without a fixed cost whose model
                (and region, when given) has no series of its capacity.
        """
        for pool in pools:
            if pool.kind is PoolKind.ONPREM or pool.cost_per_gpu_hour is not None:
                continue
            cap = _capacity(pool)
            if self._pool_series(pool, cap) is None:
                raise RlschedError(self._missing_message(pool, cap))

    # ------------------------------------------------------------------ Market protocol
    def price(self, pool: PoolSpec, t: float) -> float:
        """USD per GPU-hour of ``pool`` at simulation time ``t``."""
        if pool.cost_per_gpu_hour is not None:
            return float(pool.cost_per_gpu_hour)
        if pool.kind is PoolKind.ONPREM:
            return 0.0
        return self._require(pool, _capacity(pool)).value_at(t + self.offset_s)

    def ondemand_price(self, pool: PoolSpec, t: float) -> float:
        """USD per GPU-hour of the on-demand equivalent of ``pool`` at ``t``."""
        if pool.kind is PoolKind.ONDEMAND:
            return self.price(pool, t)
        s = self._pool_series(pool, "on_demand")
        if s is not None:
            return s.value_at(t + self.offset_s)
        return self.price(pool, t)

    def cost(self, pool: PoolSpec, t0: float, t1: float) -> float:
        """USD for one GPU of ``pool`` held over ``[t0, t1]``."""
        if pool.cost_per_gpu_hour is not None:
            return float(pool.cost_per_gpu_hour) * (t1 - t0) / 3600.0
        if pool.kind is PoolKind.ONPREM:
            return 0.0
        s = self._require(pool, _capacity(pool))
        return s.integral(t0 + self.offset_s, t1 + self.offset_s) / 3600.0

    def spot_available(self, pool: PoolSpec, t: float) -> int | None:
        """Spot nodes obtainable at ``t``; None = unlimited or not a spot pool."""
        s = self._avail_series(pool)
        return None if s is None else int(s.value_at(t + self.offset_s))

    def availability_changes(self, pool: PoolSpec, t0: float, t1: float) -> list[float]:
        """Simulation times in ``[t0, t1)`` when ``pool``'s spot availability changes."""
        s = self._avail_series(pool)
        if s is None:
            return []
        off = self.offset_s
        return [x - off for x in s.changes(t0 + off, t1 + off)]

    def _preemption_model(self, pool: PoolSpec) -> PreemptionModel | None:
        return self.preemption.get(pool.model.name, self.fallback_preemption)

    def sample_lifetime(self, pool: PoolSpec, rng: np.random.Generator) -> float | None:
        """Seconds until a new spot node of ``pool`` is reclaimed (None = never / by availability)."""
        if pool.kind is not PoolKind.SPOT or self._avail_series(pool) is not None:
            return None
        m = self._preemption_model(pool)
        return None if m is None else m.sample_lifetime(rng)

    def reclaim_rate_per_hour(self, pool: PoolSpec) -> float:
        """Mean reclaim hazard per spot node-hour (0 for non-spot pools)."""
        if pool.kind is not PoolKind.SPOT:
            return 0.0
        s = self._avail_series(pool)
        if s is not None:
            return self._availability_rate(s)
        m = self._preemption_model(pool)
        return 0.0 if m is None else float(m.rate_per_hour)

    def _availability_rate(self, s: StepSeries) -> float:
        """Average share of held nodes lost per hour, if one held all that was available."""
        key = id(s)
        if key not in self._avail_rate:
            vals = s.values
            lost = 0.0
            for prev, new in zip(vals[:-1].tolist(), vals[1:].tolist(), strict=True):
                if prev > 0 and new < prev:
                    lost += (prev - new) / prev
            if math.isfinite(s.period) and vals[-1] > 0 and vals[0] < vals[-1]:
                lost += (vals[-1] - vals[0]) / vals[-1]
            span_h = s.period / 3600.0 if math.isfinite(s.period) else math.inf
            self._avail_rate[key] = lost / span_h if math.isfinite(span_h) and span_h > 0 else 0.0
        return self._avail_rate[key]

    # ------------------------------------------------------------------ convenience
    def quote(self, pool: PoolSpec, t: float) -> MarketQuote:
        """Everything a policy may look at for one pool at ``t``."""
        return MarketQuote(
            price_per_gpu_hour=self.price(pool, t),
            ondemand_per_gpu_hour=self.ondemand_price(pool, t),
            spot_available_nodes=self.spot_available(pool, t),
            reclaim_rate_per_hour=self.reclaim_rate_per_hour(pool),
        )
