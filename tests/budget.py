"""A call that must stay within a CPU-time and a memory budget (the fuzz tests' no-hang, no-blow-up check)."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def within_budget(fn: Callable[[], T], cpu_s: float, memory_bytes: int, what: str = "") -> T:
    """Run ``fn`` and assert it used under ``cpu_s`` seconds of CPU and allocated under ``memory_bytes`` at its peak.

    CPU is measured on a plain call and the memory peak on a second call under ``tracemalloc``:
    tracemalloc's bookkeeping multiplies the CPU time of allocation-heavy code (a spec that builds
    two million-element lists took 1.1 s plain and 13.8 s traced), so one traced call measured
    tracemalloc, not ``fn``, and failed a 10 s budget on a loaded machine. ``fn`` must therefore be
    repeatable (every caller's is a pure load of a file). Both checks run even when ``fn`` raises (a
    slow failure is still slow); the first call's exception, or its result, is what this returns.
    ``what`` prefixes the messages.
    """
    prefix = f"{what} " if what else ""
    t0 = time.process_time()
    error: Exception | None = None
    result: T | None = None
    try:
        result = fn()
    except Exception as exc:  # re-raised below, after both checks
        error = exc
    cpu = time.process_time() - t0
    assert cpu < cpu_s, f"{prefix}took {cpu:.1f} s of CPU"
    tracemalloc.start()
    try:
        fn()
    except Exception:  # the same failure as the first call's, raised from there
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < memory_bytes, f"{prefix}allocated {peak / 2**20:.0f} MiB"
    if error is not None:
        raise error
    return result  # type: ignore[return-value]
