"""The one Typer application; each command module registers itself on it.

Commands are thin layers over the library: they parse options, call into the
package, and render. Every :class:`rlsched.errors.RlschedError` becomes a one-line
``error: ...`` on stderr and exit status 1 (see :func:`rlsched.cli.main`).

``rlsched --help`` lists every command, grouped by what it is for (:data:`HELP_SECTIONS`),
each with its whole first sentence. ``--version`` prints the installed version;
``--install-completion`` / ``--show-completion`` set up shell completion (bash, zsh, fish,
PowerShell).
"""

from __future__ import annotations

from importlib import metadata
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

#: Sections of ``rlsched --help``, in order, and the top-level commands each holds. A
#: command's own ``rich_help_panel`` wins; a command in neither is listed under "Other".
HELP_SECTIONS: dict[str, tuple[str, ...]] = {
    "Simulate": ("simulate", "policies", "trace", "market"),
    "Train": ("train", "promote", "models"),
    "Declare pools (HCL, Terraform-style)": ("validate", "fmt", "plan", "apply", "state", "force-unlock",
                                             "inventory", "export"),
    "Serve": ("serve", "stop", "submit", "status", "cancel", "logs", "audit"),
}
OTHER_SECTION = "Other"
_SHORT_HELP_LIMIT = 300  # a whole first sentence; the formatter wraps it


def section_of(name: str, cmd: Any) -> str:
    """The ``--help`` section a top-level command is listed in."""
    panel = getattr(cmd, "rich_help_panel", None)
    if panel:
        return str(panel)
    return next((s for s, names in HELP_SECTIONS.items() if name in names), OTHER_SECTION)


class SectionedGroup(TyperGroup):
    """A command group whose help lists commands in sections, with untruncated one-line summaries (a
    sub-group such as ``trace`` lists its commands under one "Commands" heading)."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {s: [] for s in HELP_SECTIONS}
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            sections.setdefault(section_of(name, cmd), []).append(
                (name, cmd.get_short_help_str(_SHORT_HELP_LIMIT)))
        if set(sections) - set(HELP_SECTIONS) == {OTHER_SECTION} and not any(sections[s] for s in HELP_SECTIONS):
            sections = {"Commands": sections[OTHER_SECTION]}  # a sub-group (trace, models...): one plain list
        for title, rows in sections.items():
            if rows:
                order = HELP_SECTIONS.get(title, ())
                # the order of HELP_SECTIONS, then the order of registration (sort is stable)
                rows.sort(key=lambda r: order.index(r[0]) if r[0] in order else len(order))
                with formatter.section(title):
                    formatter.write_dl(rows)


app = typer.Typer(
    cls=SectionedGroup,
    rich_markup_mode=None,
    name="rlsched",
    help="Adaptive GPU-pool scheduler: simulate, learn, plan and serve.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
trace_app = typer.Typer(cls=SectionedGroup, rich_markup_mode=None,
                   help="Read and convert job traces.", no_args_is_help=True)
market_app = typer.Typer(cls=SectionedGroup, rich_markup_mode=None,
                   help="Read and convert spot/on-demand market data.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")
app.add_typer(market_app, name="market")


def version() -> str:
    """The installed rlsched version (``unknown`` when the package metadata is missing)."""
    try:
        return metadata.version("rlsched")
    except metadata.PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"rlsched {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """Adaptive GPU-pool scheduler: simulate, learn, plan and serve."""
