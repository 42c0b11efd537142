"""``rlsched advise``: what the service's own history says about every policy (the digital twin, on demand).

A thin layer over :mod:`rlsched.service.twin`: it reads the last ``--days`` of the service's store
(read-only: the service may be running), replays those jobs on the declared pools under the served policy,
every heuristic and the block's candidate models, and prints per policy the counterfactual mean JCT, wait,
cost and deadline misses against the served policy, with what really happened to the same jobs.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rlsched.cli.app import app
from rlsched.errors import RlschedError


def spec_paths(state_dir: Path, spec: list[Path] | None) -> list[Path]:
    """``--spec``, else the spec the service in ``state_dir`` runs (its ``server.json``)."""
    if spec:
        return spec
    from rlsched.service.client import read_server_info

    raw = read_server_info(state_dir) or {}
    paths = [Path(p) for p in raw.get("spec", [])]
    if not paths:
        raise RlschedError(f"{state_dir}: no running service says which spec it serves; name it with --spec FILE")
    return paths


@app.command("advise", rich_help_panel="Serve")
def advise(
    state_dir: Annotated[Path, typer.Option("--state-dir", help="The service's state dir (its jobs.db).")],
    spec: Annotated[list[Path] | None, typer.Option(
        "--spec", help="Pool spec (default: the one the running service serves).")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Policy block (default as rlsched serve).")] = None,
    days: Annotated[float | None, typer.Option(
        "--days", min=0.001, help="Days of history to replay (default: the block's twin.days, else 7).")] = None,
    backend: Annotated[str | None, typer.Option(
        "--backend", help="Size the pools from this backend's inventory (sim:FLEET.json or nvml; default "
                          "$RLSCHED_BACKEND, else the spec's sizes).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Replay the service's recent history under every policy and compare them with the served one."""
    from rlsched.service.config import ServiceConfig
    from rlsched.service.served_policy import load_spec_policy
    from rlsched.service.twin import advise_table, run_twin
    from rlsched.workload.history import db_path_of, read_history

    db = db_path_of(state_dir)
    paths = spec_paths(state_dir, spec)
    config = ServiceConfig(spec_paths=paths, state_dir=state_dir)
    loaded, decl = load_spec_policy(config, paths, policy)
    nodes = []
    chosen = backend or os.environ.get("RLSCHED_BACKEND")
    if chosen:
        from rlsched.runtime.select import get_backend

        nodes = list(get_backend(chosen).inventory())
    window = days if days is not None else (decl.twin.days if decl.twin is not None else 7.0)
    history = read_history(db, since_s=window * 86400.0)
    result = run_twin(history, loaded, decl, days=window, nodes=nodes, spec_paths=paths)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2, default=str))
        return
    table = Table(title=f"Digital twin: {result.jobs} jobs of the last {window:g} days replayed "
                        f"({result.wall_s:.1f} s)")
    for col in ("policy", "mean JCT s", "mean wait s", "cost $", "misses", "vs served"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for row in advise_table(result):
        table.add_row(*row)
    console = Console()
    console.print(table)
    err = result.simulator_error()
    if math.isfinite(err):
        console.print(f"simulator error on this cluster: the served policy's replay gives a mean JCT {err:+.1%} "
                      f"from what really happened")
    for label, why in result.failed.items():
        console.print(f"{label}: not replayed ({why})")
    best = result.best()
    if best == result.served:
        console.print(f"best: {best}, the served policy")
    else:
        console.print(f"best: {best}, {1 - result.vs_served(best):.1%} lower mean JCT than {result.served} "
                      f"(policy {{ adapt = \"switch\" }} serves it after two such replays in a row)")
