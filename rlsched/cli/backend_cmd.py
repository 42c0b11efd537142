"""``rlsched inventory init|show`` and ``rlsched export``: GPU backends from the CLI.

``inventory init`` writes a simulated fleet file, so that ``plan``/``apply`` can be
tried end to end without a GPU; ``inventory show`` prints what a backend reports;
``export`` writes the live fleet as rlsched HCL or mig-parted YAML.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rlsched.cli.app import SectionedGroup, app
from rlsched.errors import RlschedError
from rlsched.report.terminal import cell, output_console
from rlsched.runtime.backend import GpuInfo, NodeInfo

inventory_app = typer.Typer(cls=SectionedGroup, rich_markup_mode=None,
                   help="Create and inspect GPU inventories (simulated fleets or this machine).",
                            no_args_is_help=True)
app.add_typer(inventory_app, name="inventory")

BackendOpt = Annotated[str | None, typer.Option(
    "--backend", help="sim:PATH.json (simulated fleet), nvml (this machine) or ray:auto / ray:HOST:PORT "
                      "(every node of a Ray cluster); default: $RLSCHED_BACKEND.")]


class ExportFormat(str, Enum):
    """Formats ``rlsched export`` writes."""

    hcl = "hcl"
    mig_parted = "mig-parted"


@inventory_app.command("init")
def init(
    nodes: Annotated[str, typer.Option(
        "--nodes", help="Node groups NODESxGPUSxMODEL[:MIG], comma-separated, "
                        "e.g. 4x8xH100-80GB,2x8xA100-80GB:balanced.")],
    out: Annotated[Path, typer.Option("--out", help="Fleet JSON file to write.")],
    mig: Annotated[str | None, typer.Option(
        "--mig", help="MIG layout for MIG-capable groups without their own: all-1g, all-2g, all-3g, balanced, "
                      "mixed-4-3, all-7g, profiles joined by '+', or disabled (default).")] = None,
    hostname_prefix: Annotated[str, typer.Option("--hostname-prefix", help="Hostnames are PREFIX-<family>-NN.")]
    = "gpu",
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing fleet file.")] = False,
) -> None:
    """Write a fresh simulated fleet: idle, healthy nodes with deterministic UUIDs."""
    from rlsched.runtime.sim_backend import build_fleet, write_json_atomic

    if out.exists() and not force:
        raise RlschedError(f"{out} exists; pass --force to overwrite it (plans and state made against it go stale)")
    data = build_fleet(nodes, mig=mig, hostname_prefix=hostname_prefix)
    write_json_atomic(out, data)
    n_gpus = sum(len(n["gpus"]) for n in data["nodes"])
    typer.echo(f"wrote {out}: {len(data['nodes'])} nodes, {n_gpus} GPUs. Use it with --backend sim:{out}")


def _mig_text(g: GpuInfo) -> str:
    cur = "on" if g.mig_current else "off"
    if g.mig_pending != g.mig_current:
        return f"{cur} -> {'on' if g.mig_pending else 'off'} (pending reset)"
    return cur


def _layout_text(g: GpuInfo) -> str:
    if not g.mig_current:
        return "-"
    counts = g.layout_counts()
    if not counts:
        return "(no instances)"
    return " ".join(f"{p}x{c}" if c > 1 else p for p, c in sorted(counts.items()))


def _node_json(n: NodeInfo) -> dict[str, object]:
    d = asdict(n)
    d["labels"] = dict(n.labels)
    d["fingerprint"] = n.fingerprint()
    return d


@inventory_app.command("show")
def show(
    backend: BackendOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the inventory as JSON.")] = False,
) -> None:
    """Print every node and GPU a backend reports (MIG mode, layout, processes)."""
    from rlsched.runtime.select import get_backend

    be = get_backend(backend)
    nodes = be.inventory()
    if as_json:
        typer.echo(json.dumps({"backend": be.name, "nodes": [_node_json(n) for n in nodes]}, indent=2))
        return
    table = Table(title=f"inventory: {be.name}")
    for col in ("node", "gpu", "model", "name", "memory", "MIG", "layout", "procs", "status"):
        table.add_column(col, justify="right" if col in ("gpu", "memory", "procs") else "left")
    for n in nodes:
        host = cell(n.hostname)  # a fleet file or a node names itself: never raw to the terminal
        if not n.reachable:
            table.add_row(host, "?", "?", "?", "?", "?", "?", "?", "unreachable")
            continue
        if not n.gpus:
            table.add_row(host, "-", "", "", "", "", "", "", "no GPUs")
        for g in n.gpus:
            status = []
            if not g.healthy:
                status.append("UNHEALTHY")
            if n.cordoned:
                status.append("cordoned")
            table.add_row(host, str(g.index), cell(g.model or "?"), cell(g.name), f"{g.memory_mib} MiB",
                          _mig_text(g), cell(_layout_text(g)), str(g.processes), ", ".join(status) or "ok")
    output_console().print(table)
    n_gpus = sum(len(n.gpus) for n in nodes)
    unreachable = sum(1 for n in nodes if not n.reachable)
    typer.echo(f"{len(nodes)} nodes, {n_gpus} GPUs" + (f", {unreachable} unreachable" if unreachable else ""))


@app.command("export")
def export(
    backend: BackendOpt = None,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="hcl (pools and mig_layouts) or mig-parted (YAML).")]
    = ExportFormat.hcl,
    out: Annotated[Path | None, typer.Option("--out", help="File to write (default: stdout).")] = None,
) -> None:
    """Write the live fleet as rlsched HCL or as a mig-parted config."""
    from rlsched.posix import atomic_write
    from rlsched.runtime.export import export_fleet
    from rlsched.runtime.select import get_backend

    be = get_backend(backend)
    result = export_fleet(be.inventory(), fmt.value, source=be.name)
    for w in result.warnings:
        typer.echo(f"warning: {w}", err=True)
    if out is None:
        typer.echo(result.text, nl=False)
    else:
        atomic_write(out, result.text, mode=0o644)
        typer.echo(f"wrote {out} ({fmt.value}, {len(result.assignments)} nodes)", err=True)
