"""Settings every test runs under, whichever runner started it.

The CLI sizes its tables by ``$COLUMNS`` (``rlsched.report.terminal.output_console``), and a test
process may carry a ``COLUMNS`` it never chose: pytest-xdist's workers get ``COLUMNS=80`` from
execnet, and GNU readline, which pytest imports, exports ``COLUMNS``/``LINES`` into the C-level
environment (not ``os.environ``) where every subprocess inherits them. Tests reading a table would
then see dropped columns under one runner and whole rows under another. So each test starts with
neither; tests of narrow output set ``COLUMNS`` themselves (``monkeypatch.setenv``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

_NAMES = ("COLUMNS", "LINES")


def _unset() -> None:
    for name in _NAMES:
        os.environ.pop(name, None)
        os.unsetenv(name)  # readline's copy lives only in the C environment: os.environ.pop misses it


_unset()


@pytest.fixture(autouse=True)
def _no_terminal_size_in_env() -> Iterator[None]:
    _unset()
    yield
