"""Shared fixtures of the market tests."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "market"


@pytest.fixture()
def data_dir() -> Path:
    """Directory of the small public-data slices (see its README.md)."""
    return DATA
