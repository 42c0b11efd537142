"""StepSeries: lookups, exact integrals over wraps, change lists."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.market.series import StepSeries

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def series(draw: st.DrawFn) -> StepSeries:
    n = draw(st.integers(min_value=1, max_value=8))
    gaps = draw(st.lists(st.floats(min_value=1.0, max_value=1000.0), min_size=n, max_size=n))
    times = np.cumsum([0.0, *gaps[:-1]])
    values = draw(st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=n, max_size=n))
    return StepSeries(times, values)


def test_value_at_steps_and_wrap() -> None:
    s = StepSeries([0, 10, 20], [1.0, 2.0, 3.0])  # median gap 10 -> period 30
    assert s.period == 30
    assert s.value_at(0) == 1.0
    assert s.value_at(9.99) == 1.0
    assert s.value_at(10) == 2.0
    assert s.value_at(29) == 3.0
    assert s.value_at(30) == 1.0  # wrapped
    assert s.value_at(45) == 2.0
    assert s.value_at(-1) == 3.0  # periodic before the origin too


def test_backfill_before_first_row() -> None:
    s = StepSeries([5, 15], [4.0, 6.0])  # origin 0: 4.0 holds from 0
    assert s.value_at(0) == 4.0
    assert s.integral(0, 5) == pytest.approx(20.0)


def test_integral_known_answer_with_wraps() -> None:
    s = StepSeries([0, 10, 20], [1.0, 2.0, 3.0])
    assert s.integral(0, 30) == pytest.approx(60.0)
    assert s.integral(5, 65) == pytest.approx(120.0)
    assert s.integral(25, 35) == pytest.approx(5 * 3 + 5 * 1)


def test_changes_include_wraps_and_skip_noops() -> None:
    s = StepSeries([0, 10, 20, 25], [1.0, 2.0, 2.0, 3.0], period=30)
    # 0 is a change: the previous repetition ended at 3.0.
    assert s.changes(0, 30) == [0.0, 10.0, 25.0]
    assert s.changes(1, 61) == [10.0, 25.0, 30.0, 40.0, 55.0, 60.0]
    flat_wrap = StepSeries([0, 10], [1.0, 1.0], period=20)
    assert flat_wrap.changes(-100, 100) == []
    assert s.changes(10, 10) == []


def test_constant_and_errors() -> None:
    c = StepSeries.constant(2.5)
    assert math.isinf(c.period)
    assert c.value_at(1e9) == 2.5
    assert c.integral(-10, 10) == pytest.approx(50.0)
    assert c.changes(0, 1e9) == []
    with pytest.raises(ValueError):
        StepSeries([], [])
    with pytest.raises(ValueError):
        StepSeries([0, 0], [1, 2])
    with pytest.raises(ValueError):
        StepSeries([0, 10], [1, 2], period=5)


@settings(max_examples=200, deadline=None)
@given(series(), finite, finite, finite)
def test_integral_additive(s: StepSeries, a: float, b: float, c: float) -> None:
    total = s.integral(a, c)
    parts = s.integral(a, b) + s.integral(b, c)
    assert total == pytest.approx(parts, rel=1e-9, abs=1e-6 * (1 + abs(a) + abs(b) + abs(c)))


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=0.01, max_value=100), finite, finite)
def test_integral_of_constant(c: float, t0: float, t1: float) -> None:
    s = StepSeries([0.0, 7.0], [c, c])
    assert s.integral(t0, t1) == pytest.approx(c * (t1 - t0), rel=1e-9, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(series(), finite, st.integers(min_value=-5, max_value=5))
def test_wrap_consistency(s: StepSeries, t: float, k: int) -> None:
    if math.isinf(s.period):
        return
    assert s.value_at(t + k * s.period) == s.value_at(t) or abs(t) > 1e5  # float folding at huge t
    one = s.integral(0, s.period)
    assert s.integral(t, t + s.period) == pytest.approx(one, rel=1e-9, abs=1e-6 * (1 + abs(t)))
    assert one == pytest.approx(s.mean() * s.period)


@settings(max_examples=100, deadline=None)
@given(series(), st.floats(min_value=-1e4, max_value=1e4), st.floats(min_value=0, max_value=1e4))
def test_changes_are_where_value_changes(s: StepSeries, t0: float, width: float) -> None:
    ch = s.changes(t0, t0 + width)
    assert all(t0 <= x < t0 + width for x in ch)
    assert ch == sorted(ch)
    for x in ch:
        assert s.value_at(x) != s.value_at(x - 1e-6 * max(1.0, s.period))
