"""The one Typer application; each command module registers itself on it.

Commands are thin layers over the library: they parse options, call into the
package, and render. Every :class:`rlsched.errors.RlschedError` becomes a one-line
``error: ...`` on stderr and exit status 1 (see :func:`rlsched.cli.main`).
"""

from __future__ import annotations

import typer

app = typer.Typer(
    rich_markup_mode=None,
    name="rlsched",
    help="Adaptive GPU-pool scheduler: simulate, learn, plan and serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
trace_app = typer.Typer(rich_markup_mode=None,
                   help="Read and convert job traces.", no_args_is_help=True)
market_app = typer.Typer(rich_markup_mode=None,
                   help="Read and convert spot/on-demand market data.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")
app.add_typer(market_app, name="market")
