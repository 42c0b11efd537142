"""Readers and writers of the canonical market CSVs (``shared/data/FORMAT.md``).

Prices: ``time_s, gpu_model, capacity, usd_per_gpu_hour[, region]``; one row per
change, and a price holds until the next row of the same key
``(gpu_model, capacity, region)``. Spot availability: ``time_s, gpu_model,
available_nodes[, region]``.

Validation rules (every violation is a :class:`~rlsched.errors.MarketError` naming
the file, the 1-based line, counting the header as line 1, and the column):

* an empty file, a header without data rows, or a missing required column;
* a non-numeric or non-finite ``time_s``;
* a missing, non-numeric, zero or negative ``usd_per_gpu_hour``; a missing,
  non-integer or negative ``available_nodes``;
* a ``gpu_model`` the catalogue cannot resolve (any known spelling is accepted and
  stored under its canonical name), and a ``capacity`` other than ``spot`` or
  ``on_demand`` (``on-demand``/``ondemand`` are accepted as spellings);
* two rows of the same key at the same ``time_s`` (which one holds would be
  ambiguous).

Deliberately *not* errors: rows in any order (each key is sorted), gaps between
rows (a value holds until the next row), and a key whose first row comes later than
the file's other keys (its first value is back-filled to the series start; see
:class:`~rlsched.market.series.StepSeries`). Unknown extra columns are ignored.

Each key becomes one :class:`StepSeries`. Keys of one region are one recorded history,
so they wrap around together: their common period is the longest of their own default
periods (last change plus median gap), unless ``period_s`` is given for the whole file.
Wrapping each key on its own would pair, after the shorter key's end, a spot price of
one month with an on-demand price of another (a region's on-demand price changes four
times in a year, its spot price nine: the on-demand series would start over months
before the spot series does). A key with a single value is constant.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlsched.cluster.catalog import CATALOG, resolve_model_name
from rlsched.errors import MarketError
from rlsched.market.series import StepSeries, default_period

__all__ = [
    "AvailabilityRow",
    "AvailabilityTable",
    "Capacity",
    "PriceKey",
    "PriceRow",
    "PriceTable",
    "read_availability",
    "read_prices",
    "write_availability",
    "write_prices",
]

Capacity = Literal["spot", "on_demand"]
#: ``(gpu_model, capacity, region)``; region "" = not given.
PriceKey = tuple[str, str, str]

PRICE_COLUMNS = ("time_s", "gpu_model", "capacity", "usd_per_gpu_hour")
AVAILABILITY_COLUMNS = ("time_s", "gpu_model", "available_nodes")
_CAPACITY_SPELLINGS = {"spot": "spot", "on_demand": "on_demand", "on-demand": "on_demand", "ondemand": "on_demand"}


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One canonical price change."""

    time_s: float
    gpu_model: str
    capacity: str
    usd_per_gpu_hour: float
    region: str = ""

    @property
    def key(self) -> PriceKey:
        return (self.gpu_model, self.capacity, self.region)


@dataclass(frozen=True, slots=True)
class AvailabilityRow:
    """One canonical spot-availability change."""

    time_s: float
    gpu_model: str
    available_nodes: int
    region: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.gpu_model, self.region)


def _region_periods(groups: dict[Any, list[float]], region_of: Callable[[Any], str]) -> dict[Any, float | None]:
    """The wrap-around period of each key: the longest default period of its region's keys."""
    own = {k: default_period(t) for k, t in groups.items()}
    longest: dict[str, float] = {}
    for k, per in own.items():
        if math.isfinite(per):
            r = region_of(k)
            longest[r] = max(longest.get(r, 0.0), per)
    return {k: (longest[region_of(k)] if math.isfinite(own[k]) else None) for k in groups}


@dataclass(slots=True)
class PriceTable:
    """Price series per ``(gpu_model, capacity, region)``.

    Attributes:
        series: one step series per key (USD per GPU-hour over seconds).
        rows: the rows the table was built from, sorted by key then time.
        source: where the rows came from (a path, or a description).
    """

    series: dict[PriceKey, StepSeries]
    rows: list[PriceRow] = field(default_factory=list)
    source: str = ""

    @classmethod
    def from_rows(cls, rows: Iterable[PriceRow], source: str = "", period_s: float | None = None) -> PriceTable:
        """Build a table from rows (any order); raises ValueError on duplicate key/time."""
        ordered = sorted(rows, key=lambda r: (r.key, r.time_s))
        groups: dict[PriceKey, list[PriceRow]] = {}
        for r in ordered:
            groups.setdefault(r.key, []).append(r)
        periods = _region_periods({k: [r.time_s for r in g] for k, g in groups.items()}, lambda k: k[2])
        series = {
            k: StepSeries([r.time_s for r in g], [r.usd_per_gpu_hour for r in g],
                          period=period_s if period_s is not None else periods[k])
            for k, g in groups.items()
        }
        return cls(series=series, rows=ordered, source=source)

    def models(self, capacity: str | None = None) -> list[str]:
        """Canonical GPU models with at least one series (of ``capacity`` if given)."""
        return sorted({m for m, c, _ in self.series if capacity is None or c == capacity})

    def regions(self, model: str, capacity: str) -> list[str]:
        """Regions that price ``model`` in ``capacity``, sorted."""
        return sorted(r for m, c, r in self.series if m == model and c == capacity)

    def get(self, model: str, capacity: str, region: str = "") -> StepSeries | None:
        """The series of one key, or None."""
        return self.series.get((model, capacity, region))

    def __iter__(self) -> Iterator[PriceKey]:
        return iter(sorted(self.series))


@dataclass(slots=True)
class AvailabilityTable:
    """Spot-availability series (nodes) per ``(gpu_model, region)``."""

    series: dict[tuple[str, str], StepSeries]
    rows: list[AvailabilityRow] = field(default_factory=list)
    source: str = ""

    @classmethod
    def from_rows(
        cls, rows: Iterable[AvailabilityRow], source: str = "", period_s: float | None = None
    ) -> AvailabilityTable:
        """Build a table from rows (any order); raises ValueError on duplicate key/time."""
        ordered = sorted(rows, key=lambda r: (r.key, r.time_s))
        groups: dict[tuple[str, str], list[AvailabilityRow]] = {}
        for r in ordered:
            groups.setdefault(r.key, []).append(r)
        periods = _region_periods({k: [r.time_s for r in g] for k, g in groups.items()}, lambda k: k[1])
        series = {
            k: StepSeries([r.time_s for r in g], [float(r.available_nodes) for r in g],
                          period=period_s if period_s is not None else periods[k])
            for k, g in groups.items()
        }
        return cls(series=series, rows=ordered, source=source)

    def get(self, model: str, region: str = "") -> StepSeries | None:
        return self.series.get((model, region))


# ---------------------------------------------------------------------------- reading
def _open_rows(path: str | os.PathLike[str], required: tuple[str, ...]) -> tuple[str, list[str], Iterator[
        tuple[int, dict[str, str]]]]:
    """Open a CSV, check its header, and yield ``(line_number, row)`` for data rows."""
    p = str(path)
    try:
        fh = open(p, newline="", encoding="utf-8-sig")  # noqa: SIM115 - closed by the generator
    except OSError as exc:
        raise MarketError(p, None, None, f"cannot read: {exc.strerror or exc}") from exc
    reader = csv.reader(fh)
    try:
        header = next(reader)
    except StopIteration:
        fh.close()
        raise MarketError(p, None, None, "empty file (expected a header row)") from None
    header = [h.strip() for h in header]
    for col in required:
        if col not in header:
            fh.close()
            raise MarketError(p, 1, col, f"missing required column {col!r}; header has {', '.join(header)}")

    def gen() -> Iterator[tuple[int, dict[str, str]]]:
        with fh:
            for row in reader:
                line = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                yield line, {h: (row[i].strip() if i < len(row) else "") for i, h in enumerate(header)}

    return p, header, gen()


def _float(p: str, line: int, col: str, raw: str) -> float:
    if raw == "":
        raise MarketError(p, line, col, "missing value")
    try:
        x = float(raw)
    except ValueError:
        raise MarketError(p, line, col, f"not a number: {raw!r}") from None
    if not math.isfinite(x):
        raise MarketError(p, line, col, f"not a finite number: {raw!r}")
    return x


def _model(p: str, line: int, raw: str) -> str:
    if raw == "":
        raise MarketError(p, line, "gpu_model", "missing value")
    name = resolve_model_name(raw)
    if name is None:
        raise MarketError(p, line, "gpu_model",
                          f"unknown GPU model {raw!r}; known: {', '.join(CATALOG)}")
    return name


def read_prices(path: str | os.PathLike[str], period_s: float | None = None) -> PriceTable:
    """Read and validate a canonical price CSV.

    Args:
        path: the file.
        period_s: wrap-around period for every key; None = per-key default
            (last change + median gap, see :class:`StepSeries`).

    Raises:
        MarketError: naming file, line and column of the first bad row.
    """
    p, _, rows = _open_rows(path, PRICE_COLUMNS)
    out: list[PriceRow] = []
    seen: dict[tuple[PriceKey, float], int] = {}
    for line, r in rows:
        t = _float(p, line, "time_s", r["time_s"])
        model = _model(p, line, r["gpu_model"])
        cap_raw = r["capacity"]
        cap = _CAPACITY_SPELLINGS.get(cap_raw.lower())
        if cap is None:
            raise MarketError(p, line, "capacity", f"unknown capacity {cap_raw!r}; expected 'spot' or 'on_demand'")
        price = _float(p, line, "usd_per_gpu_hour", r["usd_per_gpu_hour"])
        if price <= 0:
            raise MarketError(p, line, "usd_per_gpu_hour", f"price must be > 0, got {price}")
        row = PriceRow(t, model, cap, price, r.get("region", ""))
        first = seen.get((row.key, t))
        if first is not None:
            raise MarketError(p, line, "time_s",
                              f"duplicate time {t} for {model}/{cap}/{row.region or '-'} (first at line {first})")
        seen[(row.key, t)] = line
        out.append(row)
    if not out:
        raise MarketError(p, None, None, "no data rows after the header")
    return PriceTable.from_rows(out, source=p, period_s=period_s)


def read_availability(path: str | os.PathLike[str], period_s: float | None = None) -> AvailabilityTable:
    """Read and validate a canonical spot-availability CSV.

    Raises:
        MarketError: naming file, line and column of the first bad row.
    """
    p, _, rows = _open_rows(path, AVAILABILITY_COLUMNS)
    out: list[AvailabilityRow] = []
    seen: dict[tuple[tuple[str, str], float], int] = {}
    for line, r in rows:
        t = _float(p, line, "time_s", r["time_s"])
        model = _model(p, line, r["gpu_model"])
        raw = r["available_nodes"]
        x = _float(p, line, "available_nodes", raw)
        if x != int(x) or x < 0:
            raise MarketError(p, line, "available_nodes", f"must be an integer >= 0, got {raw!r}")
        row = AvailabilityRow(t, model, int(x), r.get("region", ""))
        first = seen.get((row.key, t))
        if first is not None:
            raise MarketError(p, line, "time_s",
                              f"duplicate time {t} for {model}/{row.region or '-'} (first at line {first})")
        seen[(row.key, t)] = line
        out.append(row)
    if not out:
        raise MarketError(p, None, None, "no data rows after the header")
    return AvailabilityTable.from_rows(out, source=p, period_s=period_s)


# ---------------------------------------------------------------------------- writing
def _fmt(x: float) -> str:
    return f"{x:.6f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def write_prices(path: str | os.PathLike[str], rows: Iterable[PriceRow] | PriceTable) -> int:
    """Write canonical price rows (sorted by key and time); returns the row count."""
    data = rows.rows if isinstance(rows, PriceTable) else sorted(rows, key=lambda r: (r.key, r.time_s))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([*PRICE_COLUMNS, "region"])
        for r in data:
            w.writerow([_fmt(r.time_s), r.gpu_model, r.capacity, f"{r.usd_per_gpu_hour:.8g}", r.region])
    return len(data)


def write_availability(path: str | os.PathLike[str], rows: Iterable[AvailabilityRow] | AvailabilityTable) -> int:
    """Write canonical availability rows (sorted by key and time); returns the row count."""
    data = rows.rows if isinstance(rows, AvailabilityTable) else sorted(rows, key=lambda r: (r.key, r.time_s))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([*AVAILABILITY_COLUMNS, "region"])
        for r in data:
            w.writerow([_fmt(r.time_s), r.gpu_model, r.available_nodes, r.region])
    return len(data)
