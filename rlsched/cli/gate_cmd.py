"""``rlsched models gate``: judge a registered version on workload families it never saw.

A thin layer over :func:`rlsched.train.registry.gate_version`: it replays the
version and every heuristic on the named families (:mod:`rlsched.train.families`),
prints the per-family table and the gate's checks, and stores the results in the
version's ``family_gate`` tag, which ``rlsched promote`` reads. Exit 0 when the gate
passes, 1 when it fails (the tag is stored either way: a refusal is information).
"""

from __future__ import annotations

from typing import Annotated

import typer

from rlsched.cli.registry_cmd import models_app


@models_app.command("gate")
def gate_cmd(
    name: Annotated[str, typer.Argument(help="Registered model name.")],
    version: Annotated[int, typer.Argument(min=1, help="Version to judge.")],
    families: Annotated[str, typer.Option(
        "--families", help="Comma-separated families or groups (all, traces, generated, spot); "
                           "default: spot for a spot model, else generated.")] = "",
    windows: Annotated[int, typer.Option("--windows", min=1, help="Windows per family.")] = 6,
    max_jobs: Annotated[int, typer.Option("--max-jobs", min=2, help="Jobs per window at most.")] = 1000,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Worker processes.")] = 1,
) -> None:
    """Judge VERSION against the best heuristic on every unseen workload family; store the result for promote."""
    from rlsched.train.generalisation import family_tables, print_progress
    from rlsched.train.registry import gate_version

    report, checks = gate_version(name, version, families=[f.strip() for f in families.split(",") if f.strip()] or None,
                                  windows=windows, max_jobs=max_jobs, processes=jobs, progress=print_progress)
    typer.echo(family_tables(report))
    for fam, why in report.skipped.items():
        typer.echo(f"{fam}: {why}")
    for c in checks:
        typer.echo(f"  {'ok  ' if c.ok else 'FAIL'}  {c.text}")
    if not all(c.ok for c in checks):
        typer.echo(f"gate failed: {name} version {version} would be refused by `rlsched promote`", err=True)
        raise typer.Exit(1)
    typer.echo(f"gate passed: stored in {name} version {version}'s family_gate tag")
