"""Converters from the raw public market data into canonical price rows.

Each converter returns ``(price_rows, metadata)``; the metadata records the window,
the region chosen per model, notes on what was assumed, and availability rows
derived from whether spot capacity was offered at all (see below).

Shared rules:

* **Per GPU-hour.** Whole-VM prices are divided by the VM's GPU count.
* **Several VM shapes / zones -> one series.** A model's price in a region is an
  aggregate over the VM shapes (and, for AWS, availability zones) that sell it, re-
  evaluated at every change of any of them: the median over shapes for GCP and Azure
  (robust to one shape's odd vCPU share or a one-day spike), the mean over AZs and
  shapes for AWS (a node may land in any AZ of the region). Only real changes of the
  aggregate become rows.
* **Window.** ``start``/``end`` (UTC dates or datetimes) cut the raw history;
  ``time_s`` counts seconds from ``start`` and the price in force at ``start`` (the
  last change at or before it) is emitted at ``time_s = 0``. Defaults: the first and
  last raw timestamp.
* **Region.** ``region=None`` picks, per GPU model, one *typical* region: among the
  regions that have both capacities (when any do), the one whose median price (spot
  if it has spot prices, else on-demand) is nearest the median over those regions,
  ties to the cheaper. Not the cheapest: the cheapest regions of the GCP history are
  artefacts (e.g. a2 A100 at $0.81/GPU-h in northamerica-northeast2, a partial
  price), and a simulation should see an ordinary market. The chosen region is
  written in the ``region`` column and the metadata. ``region="all"`` keeps every region as its
  own key (several markets for one model); any other value keeps that region only.
* **Availability.** None of these sources publishes spot capacity. Where spot was
  *not offered* for a while (GCP before spot pricing started in 2023-05, blank Azure
  cells), the metadata's availability rows say 0 nodes; while offered they say
  ``offered_nodes`` (a large number standing for "not the limit"). Use them only to
  block spot capacity that did not exist.
"""

from __future__ import annotations

import csv
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from rlsched.cluster.catalog import resolve_model_name
from rlsched.errors import MarketError, RlschedError
from rlsched.market.canonical import AvailabilityRow, PriceRow

__all__ = [
    "AWS_ONDEMAND_LIST_USD_PER_GPU_HOUR",
    "ConversionMeta",
    "convert_aws",
    "convert_azure",
    "convert_gcp",
    "parse_when",
]

#: Documented AWS on-demand list prices (us-east-1, Linux, per instance-hour) of the
#: one-GPU instances of the 2020 spot history, as published on aws.amazon.com/ec2/pricing
#: at the time: p2.xlarge (1x K80) $0.90, p3.2xlarge (1x V100-16GB) $3.06.
AWS_ONDEMAND_LIST_USD_PER_GPU_HOUR: dict[str, float] = {"K80": 0.90, "V100-16GB": 3.06}

DEFAULT_OFFERED_NODES = 1_000_000

Point = tuple[datetime, float | None]


@dataclass(slots=True)
class ConversionMeta:
    """What a converter did.

    Attributes:
        source: ``gcp``, ``aws`` or ``azure``.
        start / end: the window (UTC) that ``time_s`` counts from / stops at.
        regions: canonical model -> regions kept.
        notes: assumptions a reader of the output should know.
        availability: derived spot-availability rows (offered or not; see module doc).
    """

    source: str
    start: datetime
    end: datetime
    regions: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    availability: list[AvailabilityRow] = field(default_factory=list)


def parse_when(raw: str | datetime | None) -> datetime | None:
    """A UTC datetime from ``YYYY-MM-DD``, an ISO timestamp (``Z`` allowed) or a datetime."""
    if raw is None or isinstance(raw, datetime):
        if isinstance(raw, datetime) and raw.tzinfo is None:
            return raw.replace(tzinfo=timezone.utc)
        return raw
    s = raw.strip().replace("Z", "+00:00")
    try:
        d = datetime.fromisoformat(s)
    except ValueError:
        try:
            d = datetime.strptime(raw.strip(), "%m/%d/%Y")
        except ValueError:
            raise RlschedError(f"cannot read date {raw!r} (use YYYY-MM-DD or an ISO timestamp)") from None
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


# ------------------------------------------------------------------------- shared core
def _combine(events: Iterable[tuple[datetime, str, float | None]], agg: Callable[[list[float]], float]) -> list[Point]:
    """Aggregate several sub-series (shapes/zones) into one changepoint list."""
    state: dict[str, float | None] = {}
    out: list[Point] = []
    evs = sorted(events, key=lambda e: e[0])
    i = 0
    while i < len(evs):
        t = evs[i][0]
        while i < len(evs) and evs[i][0] == t:
            state[evs[i][1]] = evs[i][2]
            i += 1
        live = [v for v in state.values() if v is not None]
        # Rounded to 1e-7 USD so that float noise between shapes is not a change.
        val = round(agg(live), 7) if live else None
        if not out or out[-1][1] != val:
            out.append((t, val))
    return out


def _window(points: Sequence[Point], start: datetime, end: datetime) -> list[tuple[float, float | None]]:
    """Points inside ``[start, end)`` as seconds from ``start``; the one in force at start at 0."""
    out: list[tuple[float, float | None]] = []
    before: float | None = None
    have_before = False
    for t, v in points:
        if t <= start:
            before, have_before = v, True
        elif t < end:
            out.append(((t - start).total_seconds(), v))
    if have_before:
        out.insert(0, (0.0, before))
    # Drop repeats created by the cut.
    dedup: list[tuple[float, float | None]] = []
    for tv in out:
        if not dedup or dedup[-1][1] != tv[1]:
            dedup.append(tv)
    return dedup


def _median_price(points: Sequence[tuple[float, float | None]]) -> float | None:
    vals = [v for _, v in points if v is not None]
    return float(statistics.median(vals)) if vals else None


def _select_regions(
    series: dict[tuple[str, str, str], list[tuple[float, float | None]]], region: str | None
) -> dict[str, list[str]]:
    """Regions kept per model (see module doc)."""
    by_model: dict[str, set[str]] = {}
    for m, _, r in series:
        by_model.setdefault(m, set()).add(r)
    chosen: dict[str, list[str]] = {}
    for m, regions in sorted(by_model.items()):
        if region == "all":
            chosen[m] = sorted(regions)
            continue
        if region is not None:
            if region in regions:
                chosen[m] = [region]
            continue

        def has(r: str, cap: str, m: str = m) -> bool:
            return _median_price(series.get((m, cap, r), [])) is not None

        both = [r for r in regions if has(r, "spot") and has(r, "on_demand")]
        pool = both or sorted(regions)

        def med(r: str, m: str = m) -> float:
            cap = "spot" if has(r, "spot") else "on_demand"
            v = _median_price(series.get((m, cap, r), []))
            return v if v is not None else float("inf")

        typical = statistics.median([med(r) for r in pool])

        def score(r: str, typical: float = typical) -> tuple[float, float, str]:
            return (abs(med(r) - typical), med(r), r)

        chosen[m] = [min(pool, key=score)]

    return chosen


def _emit(
    series: dict[tuple[str, str, str], list[tuple[float, float | None]]],
    chosen: dict[str, list[str]],
    offered_nodes: int,
) -> tuple[list[PriceRow], list[AvailabilityRow]]:
    prices: list[PriceRow] = []
    avail: list[AvailabilityRow] = []
    for (m, cap, r), pts in sorted(series.items()):
        if r not in chosen.get(m, []):
            continue
        for t, v in pts:
            if v is not None and v > 0:
                prices.append(PriceRow(t, m, cap, v, r))
        if cap == "spot":
            gaps = any(v is None for _, v in pts) or (pts and pts[0][0] > 0)
            if gaps:
                if pts[0][0] > 0:
                    avail.append(AvailabilityRow(0.0, m, 0, r))
                last: int | None = None
                for t, v in pts:
                    n = 0 if v is None else offered_nodes
                    if n != last:
                        avail.append(AvailabilityRow(t, m, n, r))
                        last = n
    # Remove keys whose window holds no price at all (e.g. spot never offered).
    return prices, avail


def _csv_rows(path: str, required: Sequence[str]) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    try:
        fh = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115
    except OSError as exc:
        raise MarketError(path, None, None, f"cannot read: {exc.strerror or exc}") from exc
    with fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        if not header:
            raise MarketError(path, None, None, "empty file (expected a header row)")
        for c in required:
            if c not in header:
                raise MarketError(path, 1, c, f"missing required column {c!r}")
        rows = [(reader.line_num, r) for r in reader]
    return header, rows


def _model_or_error(path: str, line: int, col: str, raw: str) -> str:
    m = resolve_model_name(raw)
    if m is None:
        raise MarketError(path, line, col, f"unknown GPU model {raw!r}")
    return m


def _num(path: str, line: int, col: str, raw: str) -> float | None:
    s = raw.strip().lstrip("$").replace(",", "")
    if s == "":
        return None
    try:
        return float(s)
    except ValueError:
        raise MarketError(path, line, col, f"not a number: {raw!r}") from None


def _bounds(
    times: Iterable[datetime], start: str | datetime | None, end: str | datetime | None
) -> tuple[datetime, datetime]:
    ts = list(times)
    if not ts:
        raise RlschedError("no rows to convert")
    s = parse_when(start) or min(ts)
    e = parse_when(end) or max(ts)
    if e <= s:
        if end is None:
            e = s + timedelta(seconds=1)
        else:
            raise RlschedError(f"end {e.isoformat()} is not after start {s.isoformat()}")
    return s, e


# ------------------------------------------------------------------------- GCP
def convert_gcp(
    paths: Sequence[str | os.PathLike[str]],
    region: str | None = None,
    start: str | datetime | None = None,
    end: str | datetime | None = None,
    offered_nodes: int = DEFAULT_OFFERED_NODES,
) -> tuple[list[PriceRow], ConversionMeta]:
    """Canonical rows from GCP ``gcp_gpu_vm_price_changepoints_*.csv`` files.

    Each raw row is the full state of one ``(instance_type, region)`` at a change;
    ``hour_ondemand_usd`` / ``hour_spot_usd`` are whole-VM prices (blank spot = not
    offered then). Per GPU-hour = VM price / ``gpu_count``; shapes are combined by the
    median. ``a2-ultragpu-*`` shapes are A100-80GB whatever their ``gpu_model`` label
    says (the history files some of them under ``a100``). ``h100-80gb-mega``
    (a3-megagpu) is the same GPU as ``h100-80gb`` and is merged into H100-80GB as one
    more shape.
    """
    need = ("snapshot_utc", "instance_type", "gpu_model", "gpu_count", "region", "hour_ondemand_usd",
            "hour_spot_usd")
    events: dict[tuple[str, str, str], list[tuple[datetime, str, float | None]]] = {}
    times: list[datetime] = []
    for raw_path in paths:
        p = str(raw_path)
        _, rows = _csv_rows(p, need)
        for line, r in rows:
            t = parse_when(r["snapshot_utc"])
            assert t is not None
            model = _model_or_error(p, line, "gpu_model", r["gpu_model"])
            if r["instance_type"].startswith("a2-ultragpu"):
                # a2-ultragpu VMs carry A100 80GB; the history labels some of them "a100".
                model = "A100-80GB"
            n = _num(p, line, "gpu_count", r["gpu_count"])
            if n is None or n <= 0:
                raise MarketError(p, line, "gpu_count", f"must be > 0, got {r['gpu_count']!r}")
            od = _num(p, line, "hour_ondemand_usd", r["hour_ondemand_usd"])
            sp = _num(p, line, "hour_spot_usd", r["hour_spot_usd"])
            reg = r["region"]
            times.append(t)
            events.setdefault((model, "on_demand", reg), []).append(
                (t, r["instance_type"], None if od is None or od <= 0 else od / n))
            events.setdefault((model, "spot", reg), []).append(
                (t, r["instance_type"], None if sp is None or sp <= 0 else sp / n))
    s, e = _bounds(times, start, end)
    series = {k: _window(_combine(ev, statistics.median), s, e) for k, ev in events.items()}
    series = {k: v for k, v in series.items() if _median_price(v) is not None}
    chosen = _select_regions(series, region)
    prices, avail = _emit(series, chosen, offered_nodes)
    meta = ConversionMeta("gcp", s, e, chosen, [
        "GCP list prices (Cyclenerd/google-cloud-pricing-cost-calculator history); whole-VM price / gpu_count, "
        "median over VM shapes; vCPU/RAM of the VM are included in the per-GPU price.",
    ], avail)
    return prices, meta


# ------------------------------------------------------------------------- AWS
def convert_aws(
    paths: Sequence[str | os.PathLike[str]],
    region: str | None = None,
    start: str | datetime | None = None,
    end: str | datetime | None = None,
    per_az: bool = False,
) -> tuple[list[PriceRow], ConversionMeta]:
    """Canonical rows from the 2020 AWS p2/p3 spot price history.

    Spot per GPU-hour = ``spot_price_usd_per_hour / gpu_count``, averaged over the
    region's AZs and instance sizes at each change (``per_az=True`` keeps each AZ as
    its own region key instead). On-demand is a constant at ``time_s = 0`` from
    :data:`AWS_ONDEMAND_LIST_USD_PER_GPU_HOUR` (us-east-1 list prices, used for every
    region: a documented approximation).
    """
    need = ("timestamp_utc", "region", "availability_zone", "instance_type", "gpu_model", "gpu_count",
            "spot_price_usd_per_hour")
    events: dict[tuple[str, str, str], list[tuple[datetime, str, float | None]]] = {}
    times: list[datetime] = []
    for raw_path in paths:
        p = str(raw_path)
        _, rows = _csv_rows(p, need)
        for line, r in rows:
            t = parse_when(r["timestamp_utc"])
            assert t is not None
            model = _model_or_error(p, line, "gpu_model", r["gpu_model"])
            n = _num(p, line, "gpu_count", r["gpu_count"])
            if n is None or n <= 0:
                raise MarketError(p, line, "gpu_count", f"must be > 0, got {r['gpu_count']!r}")
            price = _num(p, line, "spot_price_usd_per_hour", r["spot_price_usd_per_hour"])
            if price is None or price <= 0:
                raise MarketError(p, line, "spot_price_usd_per_hour", f"price must be > 0, got {price}")
            reg = r["availability_zone"] if per_az else r["region"]
            sub = f"{r['availability_zone']}/{r['instance_type']}"
            times.append(t)
            events.setdefault((model, "spot", reg), []).append((t, sub, price / n))
    s, e = _bounds(times, start, end)
    series = {k: _window(_combine(ev, statistics.fmean), s, e) for k, ev in events.items()}
    series = {k: v for k, v in series.items() if _median_price(v) is not None}
    notes = ["AWS spot price history 2019-12..2020-03 (stanford-futuredata/training_on_a_dime, MIT); "
             "spot / gpu_count averaged over AZs and sizes."]
    for (m, _, reg) in list(series):
        od = AWS_ONDEMAND_LIST_USD_PER_GPU_HOUR.get(m)
        if od is not None:
            series[(m, "on_demand", reg)] = [(0.0, od)]
    notes.append("on_demand = documented us-east-1 list price (p2.xlarge $0.90 K80, p3.2xlarge $3.06 V100), "
                 "constant, applied to every region.")
    chosen = _select_regions(series, region)
    prices, avail = _emit(series, chosen, DEFAULT_OFFERED_NODES)
    return prices, ConversionMeta("aws", s, e, chosen, notes, avail)


# ------------------------------------------------------------------------- Azure
def _azure_mapping(path: str) -> dict[str, tuple[str, int]]:
    _, rows = _csv_rows(path, ("Instance", "GPU type", "# GPUs"))
    out: dict[str, tuple[str, int]] = {}
    for line, r in rows:
        model = _model_or_error(path, line, "GPU type", r["GPU type"])
        n = _num(path, line, "# GPUs", r["# GPUs"])
        if n is None or n <= 0:
            raise MarketError(path, line, "# GPUs", "must be > 0")
        out[r["Instance"].strip()] = (model, int(n))
    return out


def convert_azure(
    paths: Sequence[str | os.PathLike[str]],
    region: str | None = None,
    start: str | datetime | None = None,
    end: str | datetime | None = None,
    mapping: str | os.PathLike[str] | None = None,
    offered_nodes: int = DEFAULT_OFFERED_NODES,
) -> tuple[list[PriceRow], ConversionMeta]:
    """Canonical spot rows from Azure low-priority daily price files.

    ``paths`` are ``azure_lowpri_price_<region>.csv`` files (a ``Date`` column, one
    column per VM size, ``$`` prices, blank = not offered) and may include
    ``azure_instance_mapping.csv`` (else ``mapping``, else the file of that name next
    to the first price file). Region = the file name after ``azure_lowpri_price_``
    with ``_`` as ``-``. Each daily price holds from 00:00 UTC. Only spot (low-
    priority) prices exist in this data: no on-demand rows are produced.
    """
    price_files: list[str] = []
    map_path = str(mapping) if mapping is not None else None
    for raw_path in paths:
        p = str(raw_path)
        with open(p, encoding="utf-8-sig") as fh:
            head = fh.readline()
        if head.startswith("Instance"):
            map_path = p
        else:
            price_files.append(p)
    if not price_files:
        raise RlschedError("no Azure price files among the inputs")
    if map_path is None:
        map_path = str(Path(price_files[0]).with_name("azure_instance_mapping.csv"))
    sizes = _azure_mapping(map_path)
    events: dict[tuple[str, str, str], list[tuple[datetime, str, float | None]]] = {}
    times: list[datetime] = []
    for p in price_files:
        stem = Path(p).stem
        reg = stem.removeprefix("azure_lowpri_price_").replace("_", "-")
        header, rows = _csv_rows(p, ("Date",))
        for line, r in rows:
            t = parse_when(r["Date"])
            assert t is not None
            times.append(t)
            for col in header:
                if col == "Date":
                    continue
                if col.strip() not in sizes:
                    raise MarketError(p, 1, col, f"VM size {col!r} is not in {map_path}")
                model, n = sizes[col.strip()]
                v = _num(p, line, col, r.get(col) or "")
                events.setdefault((model, "spot", reg), []).append((t, col, None if v is None or v <= 0 else v / n))
    s, e = _bounds(times, start, end)
    if end is None:
        e = max(e, max(times) + timedelta(days=1))
    series = {k: _window(_combine(ev, statistics.median), s, e) for k, ev in events.items()}
    series = {k: v for k, v in series.items() if _median_price(v) is not None}
    chosen = _select_regions(series, region)
    prices, avail = _emit(series, chosen, offered_nodes)
    return prices, ConversionMeta("azure", s, e, chosen, [
        "Azure low-priority daily prices, Feb-Mar 2020 (training_on_a_dime, MIT); VM price / GPUs, "
        "median over VM sizes; no on-demand prices in this data.",
    ], avail)
