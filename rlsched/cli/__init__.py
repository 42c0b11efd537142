"""Command-line entry point: ``rlsched``."""

from __future__ import annotations

import sys

from rlsched.errors import RlschedError


def main() -> None:
    """Run the CLI; user errors become one line on stderr and exit status 1.

    Usage errors (unknown option, missing value) are reported by click itself
    with exit status 2; anything else reaching here is a bug and keeps its traceback. An error's
    text may quote a job, a file or a server, so its control characters are shown escaped.
    """
    from rlsched.cli import commands  # noqa: F401  (registers every command)
    from rlsched.cli.app import app
    from rlsched.report.terminal import escape_control

    try:
        app()
    except RlschedError as exc:
        print(f"error: {escape_control(exc, keep=chr(10))}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
