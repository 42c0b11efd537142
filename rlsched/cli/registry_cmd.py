"""``rlsched promote`` and ``rlsched models list | register``: the MLflow model registry.

Thin layers over :mod:`rlsched.train.registry`. The registry is wherever
``$MLFLOW_TRACKING_URI`` points, else the local ``./mlruns.db``. ``promote`` exits
0 when the version is (now) the champion and 1 when the promotion rule refused it,
printing which comparison failed; a server that is down is a one-line error
(exit 1), never a traceback. ``--force`` skips the rule but must say why: the
reason goes into the version's tags and the audit file.

MLflow is imported only inside the commands, so registering these commands costs
nothing for ``rlsched validate/plan/simulate``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from rlsched.cli.app import SectionedGroup, app
from rlsched.cli.train_cmd import mlflow_log_level
from rlsched.report.terminal import cell, fit_columns, output_console

models_app = typer.Typer(cls=SectionedGroup, rich_markup_mode=None,
                   help="The MLflow model registry of trained policies.", no_args_is_help=True)
app.add_typer(models_app, name="models")


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command("promote")
def promote_cmd(
    name: Annotated[str, typer.Argument(help="Registered model name.")],
    version: Annotated[int, typer.Argument(min=1, help="Version to make the champion.")],
    force: Annotated[bool, typer.Option("--force", help="Skip the promotion rule (audited; needs --reason).")] = False,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (recorded in the tags and audit file).")] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="Who promotes; default $RLSCHED_ACTOR or login.")] = None,
    audit_file: Annotated[Path | None, typer.Option(
        "--audit-file", help="JSON-lines audit log; default $RLSCHED_AUDIT_FILE or ./rlsched-audit.jsonl.")] = None,
) -> None:
    """Move alias 'champion' to VERSION if it beats weighted-priority and the current champion."""
    if force and not (reason and reason.strip()):
        raise typer.BadParameter("a forced promotion is audited and needs --reason TEXT", param_hint="--reason")
    mlflow_log_level(verbose=False)
    from rlsched.train.registry import promote

    res = promote(name, version, force=force, actor=actor, reason=reason, audit_path=audit_file)
    if res.promoted:
        typer.echo(res.reason)
        for c in res.checks:
            typer.echo(f"  ok  {c.text}")
        return
    _err(res.reason.replace("refused to promote", "refused: not promoting", 1))
    for c in res.checks:
        _err(f"  {'ok  ' if c.ok else 'FAIL'}  {c.text}")
    _err("(use --force --reason TEXT to override; it is audited)")
    raise typer.Exit(1)


def _hours(tags: dict[str, str], key: str) -> str:
    try:
        return f"{float(tags[key]) / 3600:.2f}"
    except (KeyError, ValueError):
        return "-"


def _money(tags: dict[str, str], key: str) -> str:
    try:
        return f"{float(tags[key]):,.0f}"
    except (KeyError, ValueError):
        return "-"


def _ratio(tags: dict[str, str], num: str, den: str) -> str:
    try:
        d = float(tags[den])
        return f"{float(tags[num]) / d:.3f}" if d else "-"
    except (KeyError, ValueError):
        return "-"


#: ``models list`` columns: (header, justify); on a narrow terminal they go in ``_LIST_DROP_ORDER``.
_LIST_COLUMNS = ("model", "version", "aliases", "created (UTC)", "mean JCT h", "cost USD", "JCT vs WP",
                 "cost vs WP", "signature", "commit", "promoted")
_LIST_DROP_ORDER = ("signature", "promoted", "commit", "created (UTC)", "cost USD", "mean JCT h", "cost vs WP")
_RIGHT = {"version", "mean JCT h", "cost USD", "JCT vs WP", "cost vs WP"}


def _versions_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> Table:
    """The registered versions with only ``columns``; every registry string is escaped (tags are free text)."""
    table = Table(title="registered policies")
    for col in columns:
        table.add_column(col, justify="right" if col in _RIGHT else "left",
                         no_wrap=col not in ("aliases", "promoted"), overflow="fold")
    for r in rows:
        t: dict[str, Any] = r["tags"]
        promoted = ""
        if t.get("promoted_by"):
            forced = " FORCED" if t.get("forced") == "true" else ""
            promoted = f"{t['promoted_by']} {t.get('promoted_at', '')}{forced}"
        values = {
            "model": r["name"], "version": str(r["version"]), "aliases": ", ".join(r["aliases"]) or "-",
            "created (UTC)": (r["created"] or "-").replace("+00:00", ""),
            "mean JCT h": _hours(t, "eval_mean_jct_s"), "cost USD": _money(t, "eval_cost_usd"),
            "JCT vs WP": _ratio(t, "eval_mean_jct_s", "eval_baseline_mean_jct_s"),
            "cost vs WP": _ratio(t, "eval_cost_usd", "eval_baseline_cost_usd"),
            "signature": str(t.get("observation_signature", "-")), "commit": str(t.get("git_commit", "-"))[:10],
            "promoted": promoted or "-",
        }
        table.add_row(*(cell(values[c]) for c in columns))
    return table


@models_app.command("list")
def list_cmd(
    name: Annotated[str | None, typer.Argument(help="Only this registered model.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON instead of a table.")] = False,
) -> None:
    """Registered versions with their aliases and headline evaluation metrics.

    The table fits the terminal ($COLUMNS): on a narrow one the signature, promotion, commit and creation
    columns go first. "cost vs WP" is "-" where weighted-priority paid nothing (no ratio).
    """
    mlflow_log_level(verbose=False)
    from rlsched.train.registry import list_versions

    rows = list_versions(name)
    if as_json:
        typer.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    if not rows:
        typer.echo("no registered models" + (f" named {name!r}" if name else ""))
        return
    console = output_console()
    shown, hidden = fit_columns(lambda cols: _versions_table(rows, cols), _LIST_COLUMNS, _LIST_DROP_ORDER,
                                console.width)
    console.print(_versions_table(rows, shown))
    if hidden:
        typer.echo(f"not shown, to fit the terminal: {', '.join(hidden)} (--json has them)")


@models_app.command("register")
def register_cmd(
    folder: Annotated[Path, typer.Argument(help="Model folder (policy.pt, codec.json, card.json).")],
    name: Annotated[str, typer.Option("--name", help="Registered model name.")],
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Extra version tag KEY=VALUE (repeatable).")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="MLflow run to log into (default: a new run).")] = None,
) -> None:
    """Register a model folder as a new version (alias 'challenger'): for a model trained without a server."""
    tags: dict[str, str] = {}
    for item in tag or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--tag")
        tags[key] = value
    mlflow_log_level(verbose=False)
    from rlsched.train.registry import register_policy

    version = register_policy(folder, name=name, run_id=run_id, tags=tags)
    typer.echo(f"registered {name} version {version} (alias challenger)")
