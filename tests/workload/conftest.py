"""Shared fixtures of the workload tests: where the real-data slices live."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.fixture
def data_dir() -> Path:
    """``tests/data``: small verbatim slices of the public traces (see its README)."""
    return DATA
