"""``rlsched train EXPERIMENT.yaml`` (heavy imports happen only when it runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rlsched.cli.app import app

_console = Console(width=max(Console().width, 140))


def mlflow_log_level(verbose: bool) -> None:
    """Keep MLflow's INFO lines ("Creating initial MLflow database tables...") out of the output unless
    ``verbose``; a ``$MLFLOW_LOGGING_LEVEL`` the user set wins. Call before MLflow is imported: it reads
    the variable once, when it configures its loggers."""
    import logging
    import os

    if verbose:
        os.environ["MLFLOW_LOGGING_LEVEL"] = "INFO"
    else:
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.getLogger("mlflow").setLevel(os.environ["MLFLOW_LOGGING_LEVEL"].upper())
    logging.getLogger("alembic").setLevel(logging.INFO if verbose else logging.WARNING)


@app.command("train")
def train_cmd(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML (see experiments/README.md).")],
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")] = False,
    run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="Checkpoints and logs (default: runs/<experiment name>).")] = None,
    no_track: Annotated[bool, typer.Option("--no-track", help="Do not log to MLflow.")] = False,
    total_steps: Annotated[int | None, typer.Option("--total-steps", help="Override total_steps.")] = None,
    output: Annotated[Path | None, typer.Option("--output", help="Override the model folder.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Also show MLflow's own INFO log lines (database setup, run URLs).")] = False,
    ray: Annotated[str | None, typer.Option(
        "--ray", metavar="ADDRESS",
        help="Run the rollout environments as actors, and the final evaluation's and the gate's replays as "
             "tasks, on this Ray cluster: auto (this machine's, or a local head) or HOST:PORT of a head's "
             "GCS.")] = None,
) -> None:
    """Train a MaskablePPO policy, evaluate it against every heuristic, export and register it."""
    mlflow_log_level(verbose)
    from dataclasses import replace

    from rlsched.train.config import load_experiment
    from rlsched.train.trainer import train

    exp = load_experiment(experiment)
    if ray is not None:  # train() connects first: a bad or unreachable address fails in seconds, one line
        exp = replace(exp, ray=ray)
    if total_steps is not None:
        exp = replace(exp, total_steps=total_steps)
    if output is not None:
        exp = replace(exp, output=str(output))
    rd = run_dir or Path("runs") / exp.name
    result = train(exp, run_dir=rd, resume=resume, log=_console.print, quiet=quiet, track=not no_track)
    _console.print(f"done: {result.steps:,} steps in {result.wall_s:.0f} s -> {result.model_dir}")
