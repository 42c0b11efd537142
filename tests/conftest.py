"""Settings every test runs under, whichever runner started it.

pytest-xdist's workers are started with ``COLUMNS=80`` and ``LINES=24`` in their environment
(execnet sets them), while a plain ``pytest`` run has neither. The CLI sizes its tables by
``$COLUMNS`` (``rlsched.report.terminal.output_console``), so without this a test reading a table
would see whole rows under one runner and dropped columns under the other. Tests of narrow output
set ``COLUMNS`` themselves (``monkeypatch.setenv``).
"""

from __future__ import annotations

import os

for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
