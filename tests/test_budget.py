"""The fuzz tests' budget helper fails what it should, and measures the call rather than tracemalloc."""

from __future__ import annotations

import time

import pytest

from tests.budget import within_budget


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_call_over_its_cpu_budget_fails_even_when_it_raises() -> None:
    def slow_failure() -> None:
        _spin(0.3)
        raise ValueError("bad input")

    with pytest.raises(AssertionError, match="s of CPU"):
        within_budget(slow_failure, 0.1, 2**30)


def test_a_call_over_its_memory_budget_fails() -> None:
    with pytest.raises(AssertionError, match="allocated"):
        within_budget(lambda: [0] * 4_000_000, 10.0, 2**20)


def test_the_result_or_the_error_comes_back() -> None:
    assert within_budget(lambda: 42, 10.0, 2**20) == 42
    with pytest.raises(KeyError):
        within_budget(lambda: {}["missing"], 10.0, 2**20)


def test_allocation_heavy_code_is_not_charged_tracemalloc_s_overhead() -> None:
    """Many small allocations: cheap plain, several times dearer traced; the CPU budget sees the plain call."""
    def churn() -> int:
        return sum(len([i, i + 1]) for i in range(600_000))

    t0 = time.process_time()
    churn()
    plain = time.process_time() - t0
    # traced it costs about 13x plain here (0.05 s vs 0.63 s per 300k), so one traced call would fail this
    assert within_budget(churn, max(3 * plain, 0.2), 2**30) == 1_200_000
