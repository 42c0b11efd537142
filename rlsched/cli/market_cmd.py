"""``rlsched market``: convert public market data to canonical CSVs, and inspect them."""

from __future__ import annotations

import statistics
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rlsched.cli.app import market_app
from rlsched.errors import RlschedError
from rlsched.market.canonical import (
    PriceRow,
    read_availability,
    read_prices,
    write_availability,
    write_prices,
)
from rlsched.market.sources import ConversionMeta, convert_aws, convert_azure, convert_gcp
from rlsched.report.terminal import cell, output_console


class Source(str, Enum):
    """Raw data families ``convert`` understands."""

    gcp = "gcp"
    aws = "aws"
    azure = "azure"


@market_app.command("convert")
def convert(
    source: Annotated[Source, typer.Option("--source", help="Which raw format the inputs are in.")],
    inputs: Annotated[list[Path], typer.Option("--input", help="Raw file (repeatable).", exists=True,
                                               dir_okay=False)],
    out_prices: Annotated[Path, typer.Option("--out-prices", help="Canonical price CSV to write.")],
    out_availability: Annotated[Path | None, typer.Option(
        "--out-availability", help="Canonical availability CSV (0 nodes while spot was not offered).")] = None,
    region: Annotated[str | None, typer.Option(
        "--region", help="Region to keep; 'all' keeps every region; default: one typical region per model.")] = None,
    start: Annotated[str | None, typer.Option("--start", help="Window start (YYYY-MM-DD or ISO); time_s=0 here.")]
    = None,
    end: Annotated[str | None, typer.Option("--end", help="Window end (exclusive).")] = None,
) -> None:
    """Convert GCP / AWS / Azure price data into the canonical price CSV."""
    paths = [str(p) for p in inputs]
    rows: list[PriceRow]
    meta: ConversionMeta
    if source is Source.gcp:
        rows, meta = convert_gcp(paths, region=region, start=start, end=end)
    elif source is Source.aws:
        rows, meta = convert_aws(paths, region=region, start=start, end=end)
    else:
        rows, meta = convert_azure(paths, region=region, start=start, end=end)
    if not rows:
        raise RlschedError(f"no prices left after filtering (region={region!r}, start={start}, end={end})")
    n = write_prices(out_prices, rows)
    extra = ""
    if out_availability is not None:
        k = write_availability(out_availability, meta.availability)
        extra = f", {k} availability rows -> {out_availability}"
    models = ", ".join(f"{m}@{'/'.join(r)}" for m, r in sorted(meta.regions.items()) if r)
    span_d = (meta.end - meta.start).total_seconds() / 86400.0
    typer.echo(f"{source.value}: {n} price rows -> {out_prices} ({models}; {meta.start:%Y-%m-%d}+{span_d:.1f} d)"
               f"{extra}")


@market_app.command("show")
def show(
    file: Annotated[Path, typer.Argument(help="Canonical price or availability CSV.", exists=True, dir_okay=False)],
    plot: Annotated[Path | None, typer.Option("--plot", help="Also plot the series to this PNG.")] = None,
) -> None:
    """Print per-key min/median/max of a canonical market file (and optionally plot it)."""
    with open(file, encoding="utf-8-sig") as fh:
        header = fh.readline()
    is_avail = "available_nodes" in header
    series: dict[str, tuple[list[float], list[float]]] = {}
    if is_avail:
        atab = read_availability(file)
        for ar in atab.rows:
            key = f"{ar.gpu_model} {ar.region or '-'}"
            series.setdefault(key, ([], []))
            series[key][0].append(ar.time_s)
            series[key][1].append(float(ar.available_nodes))
        unit, title = "nodes", f"spot availability: {file}"
    else:
        ptab = read_prices(file)
        for pr in ptab.rows:
            key = f"{pr.gpu_model} {pr.capacity} {pr.region or '-'}"
            series.setdefault(key, ([], []))
            series[key][0].append(pr.time_s)
            series[key][1].append(pr.usd_per_gpu_hour)
        unit, title = "USD/GPU-h", f"prices: {file}"
    table = Table(title=cell(title))
    for col in ("key", "rows", "span (d)", f"min {unit}", f"median {unit}", f"max {unit}"):
        table.add_column(col, justify="left" if col == "key" else "right")
    for key, (ts, vs) in sorted(series.items()):
        # keys are a CSV's model and region names: shown escaped
        table.add_row(cell(key), str(len(vs)), f"{(max(ts) - min(ts)) / 86400:.1f}", f"{min(vs):.4g}",
                      f"{statistics.median(vs):.4g}", f"{max(vs):.4g}")
    output_console().print(table)
    if plot is not None:
        _plot(series, unit, title, plot)
        typer.echo(f"plot -> {plot}")


def _plot(series: dict[str, tuple[list[float], list[float]]], unit: str, title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    for key, (ts, vs) in sorted(series.items()):
        days = [t / 86400.0 for t in ts]
        ax.step(days, vs, where="post", label=key, marker="." if len(days) == 1 else None)
    ax.set_xlabel("days from series start")
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _market_override(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--set``: a number where VALUE is one, a tuple of numbers for ``a,b,c``."""
    from rlsched.market.generator import MarketSpecError

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise MarketSpecError(f"--set {text!r}: expected KEY=VALUE, e.g. spot_ratio=0.4")
    parts = [p.strip() for p in raw.split(",")]
    values: list[object] = []
    for p in parts:
        value: object = p
        for conv in (int, float):
            try:
                value = conv(p)
                break
            except ValueError:
                continue
        values.append(value)
    return key.strip(), (tuple(values) if len(values) > 1 or key.strip() == "levels" else values[0])


@market_app.command("generate")
def generate_cmd(
    family_name: Annotated[str, typer.Option("--family", help="A market family (see `--list`).")] = "",
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Folder to write prices.csv and availability.csv into.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the draw; each seed is another market history.")] = 0,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU model the market sells.")] = "H100-80GB",
    spot_nodes: Annotated[int, typer.Option(
        "--spot-nodes", help="Nodes of the spot pool (per region) that capacity fractions refer to.")] = 8,
    sets: Annotated[
        list[str] | None, typer.Option("--set", help="Override a family parameter, KEY=VALUE (repeatable).")
    ] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the market families and exit.")] = False,
) -> None:
    """Draw a synthetic spot market (price dynamics, correlated capacity, outages, regions) as canonical CSVs.

    Simulate on it with a scenario's `market: {prices: DIR/prices.csv, availability:
    DIR/availability.csv}`; the printed --cluster string has one spot pool per region.
    """
    from rlsched.market.generator import (
        MARKET_FAMILIES,
        MarketSpecError,
        generate_market,
        market_family,
        spot_cluster,
        with_market_overrides,
    )

    if list_ or not family_name:
        for name, spec in MARKET_FAMILIES.items():
            typer.echo(f"{name:24} {spec.description}")
        if not list_:
            raise MarketSpecError("name a market family with --family (the list above), "
                                  "e.g. `rlsched market generate --family mkt-volatile --out DIR`")
        return
    if out is None:
        raise MarketSpecError("--out DIR is required: where to write prices.csv and availability.csv")
    spec = with_market_overrides(market_family(family_name), **dict(_market_override(s) for s in sets or []))
    drawn = generate_market(spec, seed, gpu_model=gpu, spot_nodes=spot_nodes)
    p, a = drawn.write(out)
    typer.echo(f"wrote {len(drawn.prices)} price rows -> {p} and {len(drawn.availability)} availability rows -> {a} "
               f"(family {spec.name}, seed {seed}, mean spot/on-demand {drawn.mean_ratio():.2f}; "
               f"--cluster {spot_cluster(spec, drawn.gpu_model, spot_nodes, spot_nodes)})")
