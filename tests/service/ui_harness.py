"""Driving the dashboard in a real browser: Debian's ``chromium`` through Playwright, never a downloaded browser.

:func:`find_chromium` looks for the system browser (``$RLSCHED_CHROMIUM``, then ``chromium``,
``chromium-browser``, ``google-chrome`` on ``PATH``); :func:`open_browser` starts it headless with Playwright
pointed at that executable. The browser tests and ``benchmarks/screenshots.py`` share both.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Names the system browser goes by, in the order they are tried.
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The system Chromium's path, or None."""
    explicit = os.environ.get("RLSCHED_CHROMIUM", "").strip()
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def why_no_browser() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if find_chromium() is None:
        return ("no system Chromium found (apt-get install chromium, or set RLSCHED_CHROMIUM); "
                ".ci/run installs it")
    return None


@contextmanager
def open_browser() -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``) from the system's executable."""
    from playwright.sync_api import sync_playwright

    path = find_chromium()
    if path is None:
        raise RuntimeError(why_no_browser() or "no browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True,
                                     args=["--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield browser
        finally:
            browser.close()
