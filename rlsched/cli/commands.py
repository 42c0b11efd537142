"""Import every command module so that it registers on the app."""

from rlsched.cli import market_cmd, simulate_cmd, trace_cmd  # noqa: F401
