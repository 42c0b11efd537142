"""A call that must stay within a CPU-time and a memory budget (the fuzz tests' no-hang, no-blow-up check)."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def within_budget(fn: Callable[[], T], cpu_s: float, memory_bytes: int, what: str = "") -> T:
    """Run ``fn`` and assert it used under ``cpu_s`` seconds of CPU and allocated under ``memory_bytes`` at its peak.

    The checks run even when ``fn`` raises (a slow failure is still slow); ``what`` prefixes the messages.
    """
    tracemalloc.start()
    t0 = time.process_time()
    try:
        return fn()
    finally:
        cpu = time.process_time() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        prefix = f"{what} " if what else ""
        assert cpu < cpu_s, f"{prefix}took {cpu:.1f} s of CPU"
        assert peak < memory_bytes, f"{prefix}allocated {peak / 2**20:.0f} MiB"
