"""``rlsched validate`` and ``rlsched fmt``: check and format HCL pool specs.

Both are offline and fast: they import the spec layer only (no torch, mlflow or
NVML). Exit codes follow Terraform: ``validate`` 0 valid / 1 invalid; ``fmt``
0 / 1 on invalid syntax, and ``fmt --check`` 3 when a file would change.
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from rlsched.cli.app import app
from rlsched.cli.plan_cmd import ExitOneOnUsageError
from rlsched.report.terminal import escape_control

FMT_WOULD_CHANGE = 3


def _ordered_var_sources(var_files: list[str], var_args: list[str], argv: list[str]) -> list[tuple[str, str]]:
    """``--var`` / ``--var-file`` in command-line order (later wins).

    Click groups repeated options per name and forgets how they interleave, so the
    order is recovered from ``argv``; if that does not match (e.g. under a test
    runner), files come before ``--var`` values.
    """
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        for flag, kind in (("--var-file", "file"), ("--var", "var")):
            if a == flag and i + 1 < len(argv):
                found.append((kind, argv[i + 1]))
                i += 1
                break
            if a.startswith(flag + "="):
                found.append((kind, a[len(flag) + 1:]))
                break
        i += 1
    want = sorted([("file", f) for f in var_files] + [("var", v) for v in var_args])
    if sorted(found) == want:
        return found
    return [("file", f) for f in var_files] + [("var", v) for v in var_args]


def _spec_files(files: list[Path]) -> list[Path]:
    if not files:
        return sorted(Path.cwd().glob("*.hcl"))
    return files


def _summary(spec: object) -> str:
    from rlsched.spec.model import Spec

    assert isinstance(spec, Spec)
    parts = []
    for key, p in spec.pools.items():
        count = p.node_count if p.node_count is not None else len(p.nodes)
        extra = f", mig {p.mig_layout}" if p.mig_layout else ""
        if p.gang != "whole-nodes":  # the default goes unsaid, as MIG-disabled does
            extra += f", gang {p.gang}"
        nodes = f"{count} node{'s' if count != 1 else ''}"
        if {f"pool.{key}.node_count", f"pool.{key}.nodes"} & set(spec.unknown):
            nodes = "? nodes"
        parts.append(f"{p.name} ({nodes} × {p.gpu_model}, {p.capacity}{extra})")  # noqa: RUF001
    n_pools = len(spec.pools)
    text = f"{n_pools} pool{'s' if n_pools != 1 else ''}: " + ("; ".join(parts) if parts else "none")
    for label, items in (("MIG layout", spec.layouts), ("quota", spec.quotas), ("policy", spec.policies)):
        if items:
            word = label if len(items) == 1 else (label[:-1] + "ies" if label.endswith("y") else label + "s")
            text += f"; {len(items)} {word}"
    return text


@app.command("validate", cls=ExitOneOnUsageError)
def validate_cmd(
    files: Annotated[list[Path] | None, typer.Argument(help="Spec files or directories (default: ./*.hcl).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {valid, error_count, warning_count, "
                                          "diagnostics} as JSON.")] = False,
    var: Annotated[list[str] | None, typer.Option("--var", help="Set a variable: NAME=VALUE (repeatable).")] = None,
    var_file: Annotated[list[str] | None, typer.Option("--var-file", help="Read variables from a .rlvars file "
                                                       "(repeatable).")] = None,
) -> None:
    """Check a pool spec: syntax, variables, schema, MIG layouts, references. Exit 0 valid, 1 invalid.

    As with Terraform, the configuration is checked without needing variable values: a required
    variable nobody set is unknown, and what depends on it is checked as far as it can be.
    """
    from rlsched.spec import SpecError, load_spec
    from rlsched.spec.render import render_json, render_text

    sources = _ordered_var_sources(var_file or [], var or [], sys.argv[1:])
    paths = _spec_files(list(files or []))
    if not paths:
        from rlsched.spec.diagnostics import error

        diags = [error("No configuration files", "No *.hcl files in the current directory; name the spec files.")]
        spec = None
    else:
        try:
            spec = load_spec(paths, var_sources=sources, unknown_variables=True)
            diags = list(spec.warnings)
        except SpecError as exc:
            spec, diags = None, exc.diagnostics
    if as_json:
        typer.echo(json.dumps(render_json(diags), indent=2))
    else:
        if diags:
            typer.echo(escape_control(render_text(diags), keep="\n\t"), err=spec is None)
        if spec is not None:
            typer.secho("Success! The configuration is valid.", fg=typer.colors.GREEN)
            typer.echo(_summary(spec))
            unset = [u for u in spec.unknown if u.startswith("var.")]
            if unset:
                typer.echo(f"Checked without values for {', '.join(unset)}: what depends on them is checked by "
                           "plan.")
    if spec is None:
        raise typer.Exit(1)


def _fmt_targets(files: list[Path]) -> list[Path]:
    out: list[Path] = []
    for f in files or [Path.cwd()]:
        if f.is_dir():
            out.extend(sorted([*f.glob("*.hcl"), *f.glob("*.rlvars")]))
        else:
            out.append(f)
    return out


@app.command("fmt", cls=ExitOneOnUsageError)
def fmt_cmd(
    files: Annotated[list[Path] | None, typer.Argument(help="Files or directories (default: .).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Change nothing; exit 3 if a file would change.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Print a unified diff of the changes.")] = False,
) -> None:
    """Rewrite spec files in canonical style (2-space indent, aligned =, comments kept)."""
    from rlsched.spec.diagnostics import error
    from rlsched.spec.fmt import format_source
    from rlsched.spec.render import render_text

    invalid = False
    changed = False
    for path in _fmt_targets(list(files or [])):
        try:
            src = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            typer.echo(escape_control(render_text([error("Failed to read file", f"{path}: {exc}")]), keep="\n\t"),
                       err=True)
            invalid = True
            continue
        out, diags = format_source(src, str(path))
        if out is None:
            typer.echo(escape_control(render_text(diags, {str(path): src}), keep="\n\t"), err=True)
            invalid = True
            continue
        if out == src:
            continue
        changed = True
        typer.echo(str(path))
        if diff:
            typer.echo("".join(difflib.unified_diff(src.splitlines(keepends=True), out.splitlines(keepends=True),
                                                    f"old/{path}", f"new/{path}")), nl=False)
        if not check:
            path.write_text(out, encoding="utf-8")
    if invalid:
        raise typer.Exit(1)
    if check and changed:
        raise typer.Exit(FMT_WOULD_CHANGE)
