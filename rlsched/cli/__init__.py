"""Command-line entry point: ``rlsched``."""

from __future__ import annotations

import sys

from rlsched.errors import RlschedError


def main() -> None:
    """Run the CLI; user errors become one line on stderr and exit status 1."""
    from rlsched.cli import commands  # noqa: F401  (registers every command)
    from rlsched.cli.app import app

    try:
        app(standalone_mode=False)
    except RlschedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # click usage errors etc.
        import click

        if isinstance(exc, click.exceptions.Abort):
            print("aborted", file=sys.stderr)
            sys.exit(1)
        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
