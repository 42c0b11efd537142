"""Piecewise-constant time series that wrap around: the shape of every market signal.

A price or an availability count holds from one change to the next, so a market
signal is a step function. Runs are often longer than the recorded series (a year of
jobs against three months of AWS spot prices), and FORMAT.md says a shorter series
wraps around. :class:`StepSeries` therefore is periodic over the whole real line:

* ``origin`` is the series' start (0 in canonical files: times are seconds from the
  series' own start). Before the first change the first value holds (back-filled),
  because a key whose first row comes late simply had no recorded change before it.
* ``period`` is the length of one repetition. By default it is the last change time
  minus the origin plus the median gap between changes: the last value is held for
  one typical step before the series starts again, instead of for zero time (which
  would drop it) or for ever (which would stop the wrap). A series with a single
  value is constant and has an infinite period. An explicit ``period`` may be given
  (it must exceed the last change time minus the origin).

Every query maps ``t`` to ``origin + (t - origin) mod period``, so ``value_at``,
``integral`` and ``changes`` agree with one another on every repetition, including
times before the origin. Lookups use :func:`bisect` on Python lists for scalars (a
simulator asks one time at a time and NumPy's per-call overhead dominates there) and
a precomputed cumulative integral so that the cost of any interval is O(log n).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["StepSeries", "default_period"]


def default_period(times: Sequence[float] | npt.ArrayLike, origin: float | None = None) -> float:
    """The wrap-around period of a series changing at ``times`` when none is given.

    The last change minus the origin (``min(0, first change)`` by default) plus the median
    gap between changes, so the last value holds for one typical step; a single change
    means a constant series (infinite period).
    """
    t = np.sort(np.asarray(times, dtype=np.float64).ravel())
    if t.size <= 1:
        return math.inf
    o = float(min(0.0, t[0]) if origin is None else origin)
    return float(t[-1] - o) + float(np.median(np.diff(t)))


class StepSeries:
    """A right-continuous step function of time, periodic with ``period``.

    Args:
        times: change times in seconds, strictly increasing after sorting.
        values: the value that holds from each change time on.
        period: length of one repetition; None = last change - origin + median gap
            (infinite for a one-value series).
        origin: start of the series; None = ``min(0, first change time)``, because
            canonical files count seconds from the series' start, so a key whose
            first row comes late still starts (back-filled) at 0.

    Raises:
        ValueError: empty input, mismatched lengths, duplicate or non-finite times,
            or a period too short to hold every change.
    """

    __slots__ = (
        "_change_offsets",
        "_cum_list",
        "_offsets_list",
        "_period_integral",
        "_vals",
        "_vals_list",
        "origin",
        "period",
        "times",
        "values",
    )

    def __init__(
        self,
        times: Sequence[float] | npt.ArrayLike,
        values: Sequence[float] | npt.ArrayLike,
        period: float | None = None,
        origin: float | None = None,
    ) -> None:
        t = np.asarray(times, dtype=np.float64).ravel()
        v = np.asarray(values, dtype=np.float64).ravel()
        if t.size == 0:
            raise ValueError("a step series needs at least one point")
        if t.size != v.size:
            raise ValueError(f"{t.size} times but {v.size} values")
        if not (np.all(np.isfinite(t)) and np.all(np.isfinite(v))):
            raise ValueError("times and values must be finite")
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        if t.size > 1 and np.any(np.diff(t) <= 0):
            dup = float(t[np.flatnonzero(np.diff(t) <= 0)[0]])
            raise ValueError(f"duplicate change time {dup}")
        self.times: npt.NDArray[np.float64] = t
        self.values: npt.NDArray[np.float64] = v
        self.origin = float(min(0.0, t[0]) if origin is None else origin)
        if self.origin > t[0]:
            raise ValueError(f"origin {self.origin} is after the first change {t[0]}")
        span = float(t[-1] - self.origin)
        if period is None:
            period = default_period(t, self.origin)
        if not period > span:
            raise ValueError(f"period {period} must exceed the last change offset {span}")
        self.period = float(period)

        # Knots of one repetition, starting exactly at the origin (back-fill).
        if t[0] > self.origin:
            knots = np.concatenate(([self.origin], t))
            vals = np.concatenate(([v[0]], v))
        else:
            knots, vals = t.copy(), v.copy()
        self._vals = vals
        self._offsets_list: list[float] = (knots - self.origin).tolist()
        self._vals_list: list[float] = vals.tolist()
        if math.isfinite(self.period):
            widths = np.diff(np.concatenate((knots, [self.origin + self.period])))
        else:
            widths = np.diff(knots)
        seg = vals[: widths.size] * widths
        cum = np.concatenate(([0.0], np.cumsum(seg)))
        self._cum_list: list[float] = cum.tolist()
        self._period_integral = float(cum[-1]) if math.isfinite(self.period) else math.inf

        # Offsets (from the origin) within one repetition where the value really changes.
        offs = [k - self.origin for i, k in enumerate(knots.tolist()) if i > 0
                and self._vals_list[i] != self._vals_list[i - 1]]
        if math.isfinite(self.period) and self._vals_list[0] != self._vals_list[-1]:
            offs.insert(0, 0.0)
        self._change_offsets: list[float] = offs

    # ------------------------------------------------------------------ helpers
    @classmethod
    def constant(cls, value: float) -> StepSeries:
        """A series that is ``value`` at every time."""
        return cls([0.0], [value])

    def __len__(self) -> int:
        return int(self.times.size)

    def __repr__(self) -> str:
        return f"StepSeries(n={len(self)}, origin={self.origin}, period={self.period})"

    def _fold(self, t: float) -> tuple[int, float]:
        """Repetition index and offset in ``[0, period)`` of time ``t``."""
        rel = t - self.origin
        if not math.isfinite(self.period):
            return 0, rel
        n = math.floor(rel / self.period)
        r = rel - n * self.period
        # Folding loses a few ulps; snap onto a knot (or the period end) just above, so
        # that a change time reported by ``changes`` reads the new value.
        eps = 1e-12 * max(1.0, abs(rel), self.period)
        if r >= self.period - eps:
            return n + 1, 0.0
        if r < 0.0:
            r = 0.0
        offs = self._offsets_list
        j = bisect_right(offs, r)
        if j < len(offs) and offs[j] - r <= eps:
            r = offs[j]
        return n, r

    def _primitive_offset(self, r: float) -> float:
        """Integral from the origin to ``origin + r`` for ``r`` within one repetition."""
        if r <= 0.0:
            # Only reachable with an infinite period: before the origin the first value holds.
            return self._vals_list[0] * r if r else 0.0
        i = bisect_right(self._offsets_list, r) - 1
        return self._cum_list[i] + self._vals_list[i] * (r - self._offsets_list[i])

    def _primitive(self, t: float) -> float:
        n, r = self._fold(t)
        base = n * self._period_integral if n else 0.0
        return base + self._primitive_offset(r)

    # ------------------------------------------------------------------ queries
    def value_at(self, t: float) -> float:
        """The value holding at time ``t`` (wrapped into one repetition)."""
        _, r = self._fold(t)
        i = bisect_right(self._offsets_list, r) - 1
        return self._vals_list[max(i, 0)]

    def integral(self, t0: float, t1: float) -> float:
        """Exact integral of the series over ``[t0, t1]`` (negative if ``t1 < t0``).

        For a price in USD per GPU-hour and times in seconds, divide by 3600 to get USD.
        """
        if t1 == t0:
            return 0.0
        return self._primitive(t1) - self._primitive(t0)

    def changes(self, t0: float, t1: float) -> list[float]:
        """Times in ``[t0, t1)`` where the value changes, including wrapped repetitions.

        Steps that repeat the previous value are not changes; the wrap from the last
        value back to the first is one when the two differ.
        """
        if t1 <= t0 or not self._change_offsets:
            return []
        offs = self._change_offsets
        if not math.isfinite(self.period):
            return [self.origin + o for o in offs if t0 <= self.origin + o < t1]
        n0, _ = self._fold(t0)
        n1, _ = self._fold(t1)
        out: list[float] = []
        for n in range(n0, n1 + 1):
            base = self.origin + n * self.period
            for o in offs:
                x = base + o
                if x >= t1:
                    break
                if x >= t0:
                    out.append(x)
        return out

    def mean(self) -> float:
        """Time-average of the value over one repetition (the only value if constant)."""
        if not math.isfinite(self.period):
            return float(self._vals_list[-1]) if len(self._vals_list) == 1 else float(np.mean(self._vals))
        return self._period_integral / self.period
