"""``rlsched retrain``: the weekly fine-tune on the cluster's own history (see :mod:`rlsched.train.retrain`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from rlsched.cli.app import app
from rlsched.errors import RlschedError


def _fleet(state_dir: Path, spec: list[Path] | None, backend: str | None) -> str:
    """The served pools as a ``--cluster`` string: the spec (``--spec``, else the running service's), sized by
    the backend's inventory when one is named."""
    from rlsched.cli.advise_cmd import spec_paths
    from rlsched.cluster import format_cluster
    from rlsched.service.config import ServiceConfig
    from rlsched.service.served_policy import load_spec_policy
    from rlsched.service.twin import live_pools

    paths = spec_paths(state_dir, spec)
    loaded, _decl = load_spec_policy(ServiceConfig(spec_paths=paths, state_dir=state_dir), paths, None)
    nodes = []
    chosen = backend or os.environ.get("RLSCHED_BACKEND")
    if chosen:
        from rlsched.runtime.select import get_backend

        nodes = list(get_backend(chosen).inventory())
    return format_cluster(live_pools(loaded, nodes, 0.0))


@app.command("retrain", rich_help_panel="Train")
def retrain_cmd(
    state_dir: Annotated[Path, typer.Option("--state-dir", help="The service's state dir (its jobs.db).")],
    source: Annotated[str, typer.Option("--from", help="Model to fine-tune: models:/NAME@ALIAS or a folder.")],
    days: Annotated[float, typer.Option("--days", min=0.001, help="Days of history to train and evaluate on.")] = 7.0,
    steps: Annotated[int, typer.Option("--steps", min=1, help="PPO steps of the fine-tune.")] = 2048,
    eval_fraction: Annotated[float, typer.Option(
        "--eval-fraction", min=0.01, max=0.9, help="Later share of the history kept for evaluation.")] = 0.25,
    generated: Annotated[int, typer.Option(
        "--generated", min=0, help="Generated families mixed into training (so it does not forget).")] = 4,
    work_dir: Annotated[Path | None, typer.Option(
        "--work-dir", help="Where the trace, experiment, run and model go (default: STATE_DIR/retrain/DATE).")]
    = None,
    spec: Annotated[list[Path] | None, typer.Option(
        "--spec", help="Pool spec (default: the one the running service serves).")] = None,
    backend: Annotated[str | None, typer.Option(
        "--backend", help="Size the pools from this backend's inventory (default $RLSCHED_BACKEND).")] = None,
    fleet: Annotated[str | None, typer.Option(
        "--fleet", help="The pools as a --cluster string (instead of --spec/--backend).")] = None,
    registered_model: Annotated[str, typer.Option(
        "--registered-model", help="Registered model name (default: the source's).")] = "",
) -> None:
    """Export the service's history, fine-tune a model on it, gate it, and register a challenger if it passes.

    Training uses the history's earlier part mixed with generated families, starts from --from's weights, and
    is evaluated on the later part (the cluster's own later days). The gate is `rlsched promote`'s. Exit 0:
    registered (alias challenger); 1: refused by the gate (the reasons are printed) or an error.
    """
    import time

    from rlsched.train.retrain import RetrainOptions, retrain

    if not os.environ.get("MLFLOW_TRACKING_URI"):
        raise RlschedError("set MLFLOW_TRACKING_URI: a retrained model that passes is registered there")
    where = work_dir or state_dir / "retrain" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    opts = RetrainOptions(state_dir=state_dir, source=source, fleet=fleet or _fleet(state_dir, spec, backend),
                          work_dir=where, days=days, steps=steps, eval_fraction=eval_fraction, generated=generated,
                          registered_model=registered_model)
    typer.echo(f"fleet {opts.fleet}")
    result = retrain(opts, log=typer.echo)
    typer.echo("promotion gate:")
    for c in result.checks:
        typer.echo(f"  {'ok  ' if c.ok else 'FAIL'}  {c.text}")
    if result.version is None:
        failed = "; ".join(c.text for c in result.checks if not c.ok)
        typer.echo(f"refused: not registered ({failed}); model folder {result.model}", err=True)
        raise typer.Exit(1)
    typer.echo(f"registered version {result.version} (alias challenger) from {result.jobs} jobs in "
               f"{result.wall_s:.0f} s; promote it with `rlsched promote NAME {result.version}`")
