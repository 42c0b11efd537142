"""Seeded synthetic spot *markets*: whole families of price and availability histories.

A spot policy tuned on three real price periods has shown little: real spot markets
differ in how cheap spot is, how prices move, and above all in how capacity behaves.
A :class:`MarketSpec` describes a market family by its processes and
:func:`generate_market` draws one concrete market from it for a seed, as canonical
price and availability rows (``shared/data/FORMAT.md``), so a generated market is a
plain :class:`~rlsched.market.market.TableMarket` (the simulator path is the one real
markets take) and can be written to the canonical CSVs (``rlsched market generate``)
and read back unchanged.

Prices (USD per GPU-hour):

* **On-demand**: the family's ``ondemand_usd``, else the bundled market's list price of
  the GPU model; ``ondemand_changes`` list-price changes of +-5-15% at uniform times.
* **Spot**: ``ratio x on-demand``, changing at Poisson times (mean ``price_step_h``
  apart). The log ratio is ``log(spot_ratio)`` + the region's offset (uniform in
  ``+-region_spread``) + a linear drift (``drift_per_week``) + persistent jumps (Poisson,
  ``price_jumps_per_week``, log size uniform in ``+-price_jump``) + an AR(1) deviation
  (coefficient 0.8 per change, stationary sd ``price_volatility``). The ratio is clipped
  to [0.05, 1]: spot never costs more than on-demand here.

Spot availability (nodes obtainable; the simulator reclaims held nodes above it):

* **Correlated capacity**: a continuous-time Markov chain over ``levels`` (fractions of
  the top capacity ``capacity x spot_nodes``), leaving each state after an exponential
  time of mean ``level_hold_h`` for a uniformly chosen other state. A drop takes many
  nodes at once and low states last hours: losses are correlated in time and across nodes.
* **Long outages**: Poisson (``outages_per_week`` per region), exponential length of mean
  ``outage_h``, capacity 0 throughout.
* **Regions**: ``regions`` markets (``region-a``, ``region-b``, ...), each with its own
  spot prices, capacity chain and outages. A share ``region_correlation`` of every
  region's outages comes from one process shared by all regions (the same hours), the
  rest from the region's own; each region's outage rate stays ``outages_per_week``.
  One on-demand series (no region) serves them all.
* **Reclaims**: with an availability series the only reclaims are its drops, so the
  per-node hazard ``reclaim_per_node_hour`` is drawn as one-node dips: Poisson at
  ``hazard x top capacity`` per hour, each lasting an exponential time of mean
  ``reclaim_dip_min`` minutes. A dip reclaims a node only when the fleet held every
  available node, so the realised rate is at most the hazard.

Times are whole seconds and prices rounded to 1e-4 USD, so writing the rows as CSV and
reading them back gives the same series. Every draw is a pure function of
``(family, seed, gpu_model, spot_nodes)`` (NumPy's PCG64).

:data:`MARKET_FAMILIES` names documented families; :func:`random_market` draws one inside
the documented ranges for domain-randomised training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rlsched.errors import RlschedError, name_hint
from rlsched.market.canonical import (
    AvailabilityRow,
    AvailabilityTable,
    PriceRow,
    PriceTable,
    write_availability,
    write_prices,
)
from rlsched.market.market import TableMarket

__all__ = [
    "MARKET_FAMILIES",
    "GeneratedMarket",
    "MarketSpec",
    "MarketSpecError",
    "generate_market",
    "market_family",
    "random_market",
    "spot_cluster",
    "with_market_overrides",
]

_WEEK_H = 168.0
#: Spot ratios are clipped to this range after the dynamics.
_RATIO_FLOOR, _RATIO_CEIL = 0.05, 1.0


class MarketSpecError(RlschedError):
    """A market family that cannot produce a market (the message names the field)."""


@dataclass(frozen=True)
class MarketSpec:
    """The processes a market family is drawn from (see the module docstring).

    Attributes:
        name: family name.
        spot_ratio: typical spot / on-demand price ratio, in (0, 1].
        ondemand_usd: on-demand USD per GPU-hour; 0 = the bundled market's price of the GPU.
        ondemand_changes: on-demand list-price changes over the horizon.
        price_step_h: mean hours between spot price changes.
        price_volatility: stationary sd of the log ratio's AR(1) deviation.
        price_jumps_per_week: rate of persistent jumps of the log ratio.
        price_jump: largest absolute log size of a jump.
        drift_per_week: trend of the log ratio per week.
        capacity: top spot capacity per region as a fraction of the fleet's spot pool.
        levels: capacity states as fractions of the top capacity (one state = constant).
        level_hold_h: mean hours spent in one capacity state.
        outages_per_week: rate of full outages per region.
        outage_h: mean outage length in hours.
        reclaim_per_node_hour: reclaim hazard of one spot node (as one-node dips).
        reclaim_dip_min: mean minutes one reclaim dip lasts.
        regions: number of spot regions.
        region_correlation: share of outages shared by every region, in [0, 1].
        region_spread: regions' log spot-ratio offsets are uniform in +-this.
        horizon_days: length of the drawn history (the market wraps around after it).
        description: one line for tables.
    """

    name: str
    spot_ratio: float = 0.35
    ondemand_usd: float = 0.0
    ondemand_changes: int = 0
    price_step_h: float = 24.0
    price_volatility: float = 0.05
    price_jumps_per_week: float = 0.0
    price_jump: float = 0.3
    drift_per_week: float = 0.0
    capacity: float = 1.0
    levels: tuple[float, ...] = (1.0,)
    level_hold_h: float = 12.0
    outages_per_week: float = 0.0
    outage_h: float = 8.0
    reclaim_per_node_hour: float = 0.0
    reclaim_dip_min: float = 20.0
    regions: int = 1
    region_correlation: float = 0.0
    region_spread: float = 0.0
    horizon_days: float = 30.0
    description: str = field(default="", compare=False)

    def region_names(self) -> tuple[str, ...]:
        """The regions' names (``""`` for a one-region market: pools need not name it)."""
        if self.regions == 1:
            return ("",)
        return tuple(f"region-{chr(ord('a') + i)}" for i in range(self.regions))

    def validate(self) -> None:
        """Raise :class:`MarketSpecError` naming the first impossible parameter."""
        def bad(what: str, why: str) -> MarketSpecError:
            return MarketSpecError(f"market family {self.name!r}: {what} {why}")

        def finite(v: float) -> bool:
            return isinstance(v, (int, float)) and math.isfinite(v)

        if not (finite(self.spot_ratio) and 0 < self.spot_ratio <= 1):
            raise bad("spot_ratio", f"must be in (0, 1] (spot / on-demand price), got {self.spot_ratio}")
        if not (finite(self.ondemand_usd) and self.ondemand_usd >= 0):
            raise bad("ondemand_usd", f"must be >= 0 (0 = the bundled list price), got {self.ondemand_usd}")
        if not 0 <= self.ondemand_changes <= 1000:
            raise bad("ondemand_changes", f"must be in 0..1000, got {self.ondemand_changes}")
        for what, v in (("price_step_h", self.price_step_h), ("level_hold_h", self.level_hold_h),
                        ("outage_h", self.outage_h), ("reclaim_dip_min", self.reclaim_dip_min)):
            if not (finite(v) and v > 0):
                raise bad(what, f"must be > 0, got {v}")
        for what, v in (("price_volatility", self.price_volatility), ("price_jump", self.price_jump),
                        ("price_jumps_per_week", self.price_jumps_per_week),
                        ("outages_per_week", self.outages_per_week),
                        ("reclaim_per_node_hour", self.reclaim_per_node_hour),
                        ("region_spread", self.region_spread)):
            if not (finite(v) and v >= 0):
                raise bad(what, f"must be >= 0 (a rate or a size), got {v}")
        if self.price_volatility > 2 or self.price_jump > 3 or self.region_spread > 3:
            raise bad("price_volatility/price_jump/region_spread", "must stay below 2 / 3 / 3 (log sizes)")
        if self.reclaim_per_node_hour > 10 or self.outages_per_week > 168:
            raise bad("reclaim_per_node_hour/outages_per_week", "must be <= 10 per node-hour / 168 per week")
        if not finite(self.drift_per_week) or abs(self.drift_per_week) > 2:
            raise bad("drift_per_week", f"must be in [-2, 2] (log ratio per week), got {self.drift_per_week}")
        if not (finite(self.capacity) and 0 < self.capacity <= 10):
            raise bad("capacity", f"must be in (0, 10] (fraction of the spot pool), got {self.capacity}")
        if not self.levels or any(not (finite(x) and 0 <= x <= 1) for x in self.levels):
            raise bad("levels", f"needs at least one fraction in [0, 1], got {self.levels}")
        if not 1 <= self.regions <= 8:
            raise bad("regions", f"must be in 1..8, got {self.regions}")
        if not (finite(self.region_correlation) and 0 <= self.region_correlation <= 1):
            raise bad("region_correlation", f"must be in [0, 1], got {self.region_correlation}")
        if not (finite(self.horizon_days) and 1 <= self.horizon_days <= 366):
            raise bad("horizon_days", f"must be in [1, 366], got {self.horizon_days}")


@dataclass(frozen=True)
class GeneratedMarket:
    """One draw of a market family: canonical rows and how they were made."""

    spec: MarketSpec
    seed: int
    gpu_model: str
    spot_nodes: int
    prices: tuple[PriceRow, ...]
    availability: tuple[AvailabilityRow, ...]

    @property
    def source(self) -> str:
        return f"market-generator:{self.spec.name}:{self.seed}:{self.gpu_model}x{self.spot_nodes}"

    def market(self, offset_s: float = 0.0) -> TableMarket:
        """The draw as a :class:`TableMarket` (reclaims come from availability drops only)."""
        return TableMarket(PriceTable.from_rows(self.prices, source=self.source),
                           AvailabilityTable.from_rows(self.availability, source=self.source),
                           {}, None, offset_s=offset_s)

    def write(self, out_dir: str | Path) -> tuple[Path, Path]:
        """Write ``prices.csv`` and ``availability.csv`` into ``out_dir``; their paths."""
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        p, a = d / "prices.csv", d / "availability.csv"
        write_prices(p, self.prices)
        write_availability(a, self.availability)
        return p, a

    def mean_ratio(self) -> float:
        """Time-weighted mean over regions of spot / on-demand price over the horizon (a summary)."""
        table = PriceTable.from_rows(self.prices)
        h = self.spec.horizon_days * 86400.0
        od = table.get(self.gpu_model, "on_demand", "")
        assert od is not None
        ods = od.integral(0.0, h)
        ratios = []
        for r in self.spec.region_names():
            s = table.get(self.gpu_model, "spot", r)
            assert s is not None
            ratios.append(s.integral(0.0, h) / ods)
        return float(np.mean(ratios))


def _list_price(gpu_model: str) -> float:
    """The bundled market's on-demand price of ``gpu_model`` (mean of its series)."""
    from rlsched.market.defaults import default_prices

    table = default_prices()
    regions = table.regions(gpu_model, "on_demand")
    if not regions:
        raise MarketSpecError(f"no on-demand list price for GPU model {gpu_model} in the bundled market; "
                              f"set ondemand_usd (known: {', '.join(table.models('on_demand'))})")
    s = table.get(gpu_model, "on_demand", regions[0])
    assert s is not None
    return float(s.mean())


def _poisson_times(rng: np.random.Generator, rate_per_h: float, horizon_h: float) -> npt.NDArray[np.float64]:
    """Sorted event times (hours) of a Poisson process on ``[0, horizon_h)``."""
    if rate_per_h <= 0:
        return np.zeros(0)
    n = int(rng.poisson(rate_per_h * horizon_h))
    return np.sort(rng.uniform(0.0, horizon_h, n))


def _intervals(rng: np.random.Generator, rate_per_h: float, mean_len_h: float,
               horizon_h: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Starts and ends (hours) of intervals starting as a Poisson process, exponential lengths."""
    starts = _poisson_times(rng, rate_per_h, horizon_h)
    return starts, starts + rng.exponential(mean_len_h, starts.size)


def _active(starts: npt.NDArray[np.float64], ends: npt.NDArray[np.float64],
            t: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """How many of the intervals ``[start, end)`` contain each time of ``t``."""
    return (np.searchsorted(np.sort(starts), t, side="right")
            - np.searchsorted(np.sort(ends), t, side="right")).astype(np.int64)


def _spot_ratios(spec: MarketSpec, rng: np.random.Generator, horizon_h: float,
                 offset: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Change times (hours, the first at 0) and spot / on-demand ratios of one region."""
    times = np.concatenate(([0.0], _poisson_times(rng, 1.0 / spec.price_step_h, horizon_h)))
    jumps_at = _poisson_times(rng, spec.price_jumps_per_week / _WEEK_H, horizon_h)
    jump_sizes = rng.uniform(-spec.price_jump, spec.price_jump, jumps_at.size)
    cum_jump = np.concatenate(([0.0], np.cumsum(jump_sizes)))[np.searchsorted(jumps_at, times, side="right")]
    dev = np.empty(times.size)
    shocks = rng.standard_normal(times.size)
    dev[0] = spec.price_volatility * shocks[0]
    scale = spec.price_volatility * math.sqrt(1 - 0.8 ** 2)
    for i in range(1, times.size):
        dev[i] = 0.8 * dev[i - 1] + scale * shocks[i]
    log_ratio = math.log(spec.spot_ratio) + offset + spec.drift_per_week * times / _WEEK_H + cum_jump + dev
    return times, np.clip(np.exp(log_ratio), _RATIO_FLOOR, _RATIO_CEIL)


def _capacity_chain(spec: MarketSpec, rng: np.random.Generator,
                    horizon_h: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Change times (hours) and capacity fractions of the Markov-modulated capacity."""
    k = len(spec.levels)
    state = int(rng.integers(k))
    times, fracs, t = [0.0], [spec.levels[state]], 0.0
    if k == 1:
        return np.array(times), np.array(fracs)
    while True:
        t += float(rng.exponential(spec.level_hold_h))
        if t >= horizon_h:
            break
        state = (state + 1 + int(rng.integers(k - 1))) % k  # a uniformly chosen *other* state
        times.append(t)
        fracs.append(spec.levels[state])
    return np.array(times), np.array(fracs)


def _compress(times_s: npt.NDArray[np.int64], values: Sequence[float]) -> list[tuple[int, float]]:
    """``(time, value)`` pairs without repeats of the previous value (the first kept)."""
    out: list[tuple[int, float]] = []
    for t, v in zip(times_s.tolist(), values, strict=True):
        if not out or v != out[-1][1]:
            out.append((int(t), v))
    return out


def generate_market(spec: MarketSpec, seed: int = 0, *, gpu_model: str = "H100-80GB",
                    spot_nodes: int = 8) -> GeneratedMarket:
    """Draw one market of ``spec`` for ``gpu_model`` and a spot pool of ``spot_nodes`` nodes per region.

    Raises:
        MarketSpecError: an impossible parameter (named), an unknown GPU model, or
            ``spot_nodes`` < 1.
    """
    from rlsched.cluster.catalog import resolve_model_name

    spec.validate()
    model = resolve_model_name(gpu_model)
    if model is None:
        raise MarketSpecError(f"unknown GPU model {gpu_model!r} for market family {spec.name!r}")
    if spot_nodes < 1:
        raise MarketSpecError(f"spot_nodes must be >= 1, got {spot_nodes}")
    rng = np.random.default_rng([seed, 0x5B07])
    horizon_h = spec.horizon_days * 24.0

    # On-demand: one series (no region), a few list-price changes.
    base = spec.ondemand_usd or _list_price(model)
    od_t = np.concatenate(([0.0], np.sort(rng.uniform(0.0, horizon_h, spec.ondemand_changes))))
    od_v = base * np.concatenate(([1.0], np.cumprod(np.exp(rng.uniform(0.05, 0.15, spec.ondemand_changes)
                                                           * rng.choice([-1.0, 1.0], spec.ondemand_changes)))))
    od_ts = np.round(od_t * 3600.0).astype(np.int64)
    od_pairs = _compress(od_ts, [round(float(v), 4) for v in od_v])
    prices = [PriceRow(float(t), model, "on_demand", v) for t, v in od_pairs]

    def od_at(t_s: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        idx = np.searchsorted(np.array([t for t, _ in od_pairs]), t_s, side="right") - 1
        return np.array([v for _, v in od_pairs])[idx]

    regions = spec.region_names()
    shared_rate = spec.outages_per_week * spec.region_correlation / _WEEK_H
    shared = _intervals(rng, shared_rate, spec.outage_h, horizon_h)
    top = max(1, round(spec.capacity * spot_nodes))
    availability: list[AvailabilityRow] = []
    for region in regions:
        offset = float(rng.uniform(-spec.region_spread, spec.region_spread)) if spec.regions > 1 else 0.0
        st, ratios = _spot_ratios(spec, rng, horizon_h, offset)
        st_s = np.round(st * 3600.0).astype(np.int64)
        spot_v = [round(max(float(r * o), 1e-4), 4) for r, o in zip(ratios, od_at(st_s), strict=True)]
        prices.extend(PriceRow(float(t), model, "spot", v, region) for t, v in _compress(st_s, spot_v))

        ct, fracs = _capacity_chain(spec, rng, horizon_h)
        own = _intervals(rng, spec.outages_per_week * (1 - spec.region_correlation) / _WEEK_H, spec.outage_h,
                         horizon_h)
        o_starts, o_ends = np.concatenate((shared[0], own[0])), np.concatenate((shared[1], own[1]))
        d_starts, d_ends = _intervals(rng, spec.reclaim_per_node_hour * top, spec.reclaim_dip_min / 60.0, horizon_h)
        edges = np.concatenate(([0.0], ct, o_starts, o_ends, d_starts, d_ends))
        edges_s = np.unique(np.round(edges[edges < horizon_h] * 3600.0).astype(np.int64))
        th = edges_s / 3600.0
        level = fracs[np.searchsorted(ct, th, side="right") - 1]
        nodes = np.maximum(0, np.round(level * top).astype(np.int64) - _active(d_starts, d_ends, th))
        nodes[_active(o_starts, o_ends, th) > 0] = 0
        availability.extend(AvailabilityRow(float(t), model, int(v), region)
                            for t, v in _compress(edges_s, [int(x) for x in nodes]))
    return GeneratedMarket(spec, seed, model, spot_nodes, tuple(prices), tuple(availability))


def spot_cluster(spec: MarketSpec, gpu_model: str, spot_nodes: int, ondemand_nodes: int,
                 gpus_per_node: int = 8) -> str:
    """The ``--cluster`` string of a hybrid fleet for ``spec``: one elastic spot pool per region + on-demand."""
    parts = [f"spot:0-{spot_nodes}x{gpus_per_node}x{gpu_model}" + (f"/region={r}" if r else "")
             for r in spec.region_names()]
    parts.append(f"ondemand:0-{ondemand_nodes}x{gpus_per_node}x{gpu_model}")
    return ",".join(parts)


_M = MarketSpec

#: Documented market families (README, "Spot families"). Each stresses one way real
#: spot markets differ; ``mkt-cheap-stable`` is the easy reference.
MARKET_FAMILIES: dict[str, MarketSpec] = {m.name: m for m in (
    _M("mkt-cheap-stable", spot_ratio=0.25, price_step_h=48.0, price_volatility=0.03, reclaim_per_node_hour=0.002,
       description="spot at ~25% of on-demand, slow small price moves, the whole spot pool nearly always "
                   "available, rare reclaims"),
    _M("mkt-expensive", spot_ratio=0.8, price_step_h=24.0, price_volatility=0.05, ondemand_changes=2,
       reclaim_per_node_hour=0.01,
       description="spot at ~80% of on-demand: little to save, reclaims still cost work; two list-price changes"),
    _M("mkt-correlated-outages", spot_ratio=0.35, levels=(1.0, 0.5, 0.125), level_hold_h=6.0,
       reclaim_per_node_hour=0.01,
       description="Markov-modulated capacity: the whole pool, half, an eighth, ~6 h per state; a drop "
                   "reclaims many nodes at once"),
    _M("mkt-long-outages", spot_ratio=0.3, outages_per_week=1.5, outage_h=12.0, reclaim_per_node_hour=0.005,
       description="spot at ~30%, 1.5 outages a week of ~12 h with no spot capacity at all"),
    _M("mkt-regional", spot_ratio=0.35, regions=3, region_spread=0.4, levels=(1.0, 0.5), level_hold_h=12.0,
       outages_per_week=3.0, outage_h=4.0, region_correlation=0.5, reclaim_per_node_hour=0.005,
       description="three regions with prices up to 1.5x apart, half/full capacity chains and ~4 h outages, "
                   "half of them in every region at once"),
    _M("mkt-volatile", spot_ratio=0.5, price_step_h=2.0, price_volatility=0.25, price_jumps_per_week=2.0,
       price_jump=0.5, drift_per_week=0.05, reclaim_per_node_hour=0.05,
       description="spot around 50% moving every ~2 h (sd 0.25 in log), jumps twice a week, upward drift, "
                   "reclaims ~1 per node a day"),
)}


def market_family(name: str) -> MarketSpec:
    """The named market family; :class:`MarketSpecError` with a suggestion for an unknown name."""
    if name in MARKET_FAMILIES:
        return MARKET_FAMILIES[name]
    raise MarketSpecError(f"unknown market family {name!r}{name_hint(name, MARKET_FAMILIES)}; "
                          f"known: {', '.join(MARKET_FAMILIES)}")


def random_market(rng: np.random.Generator, *, name: str = "random-market",
                  exclude: Sequence[str] = ()) -> MarketSpec:
    """A market family drawn inside the documented ranges: domain randomisation for training.

    Spot ratios 0.2-0.9; price steps every 2-72 h with volatility up to 0.3, jumps in a
    third of the draws and drifts of +-0.1 a week; a capacity chain of 2-3 levels in half;
    outages (2-24 h) in 40%; 2-3 regions in a quarter; reclaim hazards 0.001-0.1 per
    node-hour. ``exclude`` names fixed families whose *kind* the draw must avoid
    (leave-one-family-out training): ``mkt-correlated-outages`` keeps capacity constant,
    ``mkt-long-outages`` outages over 2 h, ``mkt-regional`` more than one region,
    ``mkt-volatile`` volatility over 0.1, jumps and steps under 12 h, ``mkt-expensive``
    ratios over 0.6, ``mkt-cheap-stable`` ratios under 0.35.
    """
    ex = set(exclude)
    unknown = ex - set(MARKET_FAMILIES)
    if unknown:
        raise MarketSpecError(f"unknown market family {sorted(unknown)[0]!r} in exclude; "
                              f"known: {', '.join(MARKET_FAMILIES)}")
    lo = 0.35 if "mkt-cheap-stable" in ex else 0.2
    hi = 0.6 if "mkt-expensive" in ex else 0.9
    calm = "mkt-volatile" in ex
    step_h = float(math.exp(rng.uniform(math.log(12.0 if calm else 2.0), math.log(72.0))))
    jumps = 0.0 if calm or rng.random() >= 1 / 3 else float(rng.uniform(0.5, 3.0))
    chain = "mkt-correlated-outages" not in ex and rng.random() < 0.5
    levels = (1.0, *sorted(rng.uniform(0.0, 0.8, int(rng.integers(1, 3))).round(3).tolist(), reverse=True)) \
        if chain else (1.0,)
    outages = rng.random() < 0.4
    max_outage = 2.0 if "mkt-long-outages" in ex else 24.0
    regions = 1 if "mkt-regional" in ex or rng.random() >= 0.25 else int(rng.integers(2, 4))
    return MarketSpec(
        name=name, spot_ratio=float(rng.uniform(lo, hi)), ondemand_changes=int(rng.integers(0, 3)),
        price_step_h=step_h, price_volatility=float(rng.uniform(0.0, 0.1 if calm else 0.3)),
        price_jumps_per_week=jumps, price_jump=float(rng.uniform(0.1, 0.5)),
        drift_per_week=float(rng.uniform(-0.1, 0.1)), levels=levels,
        level_hold_h=float(rng.uniform(2.0, 24.0)),
        outages_per_week=float(rng.uniform(0.5, 3.0)) if outages else 0.0,
        outage_h=float(rng.uniform(1.0, max_outage)) if outages else 8.0,
        reclaim_per_node_hour=float(math.exp(rng.uniform(math.log(0.001), math.log(0.1)))),
        regions=regions, region_correlation=float(rng.uniform(0.0, 1.0)),
        region_spread=float(rng.uniform(0.0, 0.4)) if regions > 1 else 0.0,
    )


def with_market_overrides(spec: MarketSpec, **overrides: object) -> MarketSpec:
    """``spec`` with some fields replaced; unknown fields are a :class:`MarketSpecError`."""
    known = set(MarketSpec.__dataclass_fields__)
    for key in overrides:
        if key not in known:
            raise MarketSpecError(f"market family {spec.name!r}: unknown parameter {key!r}; "
                                  f"known: {', '.join(sorted(known))}")
    return replace(spec, **overrides)  # type: ignore[arg-type]
