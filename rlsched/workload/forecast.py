"""Short-horizon GPU-demand forecasts per request-size class, for autoscaling and the RL observation.

An elastic pool must be grown *before* the jobs that need it arrive (nodes take
minutes to provision), so the engine publishes ``ClusterState.demand_forecast``
and the PPO policy and autoscalers read it. This module produces that forecast.

**What is forecast.** For a class ``c`` and a window ``[now, now + H)``::

    D_c(now, H) = (1 / H) * sum_{j : now <= j.submit_time < now + H, class(j) = c}  g_j * min(d_j, H)

where ``g_j = job.gpu_demand`` (whole GPUs, or ``gpu_milli / 1000`` for a fraction
of one GPU) and ``d_j = job.duration``. It is in GPU-seconds per second, i.e. the
number of GPUs that the window's *new arrivals* keep busy on average, each counted
for at most one horizon after it arrives. Why this shape:

* Only new arrivals: jobs already queued or running are in the state, exactly;
  forecasting them again would double-count.
* Capped at ``H``: a 10-day job arriving in the next hour needs its GPUs for the
  whole provisioning horizon, not for 10 days of it; without the cap one rare
  long job would dominate every window it falls into.
* Per second (divided by ``H``): the value is directly comparable with a pool's
  GPU count whatever the horizon.

**Why request-size classes, not pools or GPU models.** Pools differ by model and
sharing, but the public traces almost never name a model (Philly: never; openb
default: never), so a per-model forecast would be a single "any" series. What the
traces do carry, and what decides which pool can serve a job (a MIG/time-sliced
pool for a fraction, a pool with 8-GPU nodes for a gang), is the request size. The
classes are :data:`GPU_CLASSES`: ``"fractional"`` (part of one GPU), ``"1"``,
``"2-4"`` and ``"8+"`` (more than 4 GPUs: 5-7 GPU requests do not occur in the
traces and are gangs just the same), plus ``"*"`` = the sum over the classes.
CPU-only jobs (``num_gpus == 0``) are ignored.

**No oracle at run time.** ``observe`` gets the arriving :class:`Job`, whose
``duration`` is the trace's ground truth that a real scheduler does not know at
arrival. :class:`SmoothedSeasonal` never reads it online (only arrival times and
sizes); :class:`SeasonalNaive` only uses what had been observed by ``now``
(``min(d, now - submit)``). Durations of the *training* jobs are history and are
used freely by ``fit``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rlsched.cluster.job import Job

HOUR_S = 3600.0
DAY_S = 86400.0
WEEK_S = 7 * DAY_S
#: Request-size classes, in order of size.
GPU_CLASSES: tuple[str, ...] = ("fractional", "1", "2-4", "8+")
#: Key of the total over all classes.
TOTAL = "*"
#: Every key a forecast dict carries.
FORECAST_KEYS: tuple[str, ...] = (*GPU_CLASSES, TOTAL)
# 1970-01-05 00:00 was a Monday: hour-of-week bucket 0 is Monday 00:00-01:00 on the
# clock of ``origin_epoch_s`` (the traces' naive local timestamps).
_MONDAY_S = 4 * DAY_S
_MAX_HORIZON_CACHE = 64


def gpu_class(job: Job) -> str | None:
    """Request-size class of ``job`` (one of :data:`GPU_CLASSES`), or None for a CPU-only job."""
    if job.num_gpus <= 0:
        return None
    if job.fractional:
        return "fractional"
    if job.num_gpus == 1:
        return "1"
    if job.num_gpus <= 4:
        return "2-4"
    return "8+"


def _shrunk(arrived: np.ndarray, exposure: np.ndarray, prior: np.ndarray | float, pseudo_s: float) -> np.ndarray:
    """Rates ``(arrived + pseudo_s * prior) / (exposure + pseudo_s)``; ``prior`` where nothing was seen."""
    prior_arr = np.broadcast_to(np.asarray(prior, dtype=float), arrived.shape)
    den = exposure + pseudo_s
    safe = np.where(den > 0, den, 1.0)
    return np.where(den > 0, (arrived + pseudo_s * prior_arr) / safe, prior_arr)


def _zeros() -> dict[str, float]:
    return dict.fromkeys(FORECAST_KEYS, 0.0)


@runtime_checkable
class DemandForecaster(Protocol):
    """Forecasts :math:`D_c(now, H)` (see the module docstring) per class and in total.

    The life cycle is ``fit`` once on training windows, then, during a replay,
    ``observe`` each arrival as it happens and ``predict`` at decision points.
    Times are seconds on the trace clock. ``predict`` must not be given a ``now``
    earlier than an arrival already observed (forecasts are for the future of what
    has been seen).
    """

    def fit(self, jobs: Sequence[Job]) -> None:
        """Learn from historical jobs (durations included); resets any online state."""
        ...

    def observe(self, job: Job) -> None:
        """Record one arrival at ``job.submit_time`` (its duration is not to be trusted as known)."""
        ...

    def predict(self, now: float, horizon_s: float) -> dict[str, float]:
        """Expected demand over ``[now, now + horizon_s)`` for every key of :data:`FORECAST_KEYS`."""
        ...


def _check_horizon(horizon_s: float) -> None:
    if not horizon_s > 0:
        raise ValueError(f"horizon must be > 0 s, got {horizon_s}")


class SeasonalNaive:
    """Baseline: the demand observed in the same window one season earlier.

    ``predict(now, H)`` returns ``D_c(now - season, H)`` computed from the jobs seen
    so far (training plus observed), where each job's duration is cut at what was
    observable at ``now`` (``min(d, H, now - submit)``), so the baseline has no more
    information than a real system would. Windows before the first known job are
    zero. This is the standard yardstick: a forecaster that cannot beat "same
    time yesterday / last week" adds nothing.

    Args:
        season_s: the season length, one day (default) or one week (``WEEK_S``).
    """

    def __init__(self, season_s: float = DAY_S) -> None:
        if not season_s > 0:
            raise ValueError(f"season must be > 0 s, got {season_s}")
        self.season_s = season_s
        self._t: list[float] = []
        self._jobs: list[tuple[str, float, float]] = []  # (class, gpus, duration), parallel to _t
        #: ``(first, last submission, GPU jobs)`` of the data given to :meth:`fit` (None before).
        self.fit_range: tuple[float, float, int] | None = None

    def fit(self, jobs: Sequence[Job]) -> None:
        """Remember the training jobs as history (online state is reset)."""
        self._t = []
        self._jobs = []
        for job in sorted(jobs, key=lambda j: j.submit_time):
            self.observe(job)
        self.fit_range = (self._t[0], self._t[-1], len(self._t)) if self._t else None

    def shifted(self, offset_s: float = 0.0) -> SeasonalNaive:
        """An independent copy whose clock runs ``offset_s`` behind: ``copy.predict(t) == self.predict(t + offset_s)``.

        For replaying a window whose times were re-based (``offset_s`` = how far into
        the fitting clock the window's time 0 lies). Online observations made so far
        are copied too (call it on a freshly fitted or loaded forecaster).
        """
        out = SeasonalNaive(self.season_s)
        out._t = [t - offset_s for t in self._t]
        out._jobs = list(self._jobs)
        if self.fit_range is not None:
            a, b, n = self.fit_range
            out.fit_range = (a - offset_s, b - offset_s, n)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state (parameters and history); :func:`forecaster_from_dict` reads it back."""
        return {
            "model": "seasonal-naive", "season_s": self.season_s,
            "fit_range": list(self.fit_range) if self.fit_range else None,
            "t": list(self._t), "class": [c for c, _, _ in self._jobs],
            "gpus": [g for _, g, _ in self._jobs], "duration": [d for _, _, d in self._jobs],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SeasonalNaive:
        """Inverse of :meth:`to_dict` (ValueError on a malformed dict)."""
        try:
            out = cls(float(d["season_s"]))
            t = [float(x) for x in d["t"]]
            recs = [(str(c), float(g), float(u)) for c, g, u in zip(d["class"], d["gpus"], d["duration"], strict=True)]
            if len(t) != len(recs) or any(c not in GPU_CLASSES for c, _, _ in recs):
                raise ValueError("history columns disagree or name an unknown class")
            fr = d.get("fit_range")
            out.fit_range = (float(fr[0]), float(fr[1]), int(fr[2])) if fr else None
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a seasonal-naive forecaster: {exc}") from None
        out._t, out._jobs = t, recs
        return out

    def observe(self, job: Job) -> None:
        """Add one arrival to the history (in order; a late one is inserted in place)."""
        cls = gpu_class(job)
        if cls is None:
            return
        rec = (cls, job.gpu_demand, job.duration)
        if not self._t or job.submit_time >= self._t[-1]:
            self._t.append(job.submit_time)
            self._jobs.append(rec)
        else:
            i = bisect.bisect_right(self._t, job.submit_time)
            self._t.insert(i, job.submit_time)
            self._jobs.insert(i, rec)

    def predict(self, now: float, horizon_s: float) -> dict[str, float]:
        """Demand of ``[now - season, now - season + H)``, censored at ``now`` (see the class doc)."""
        _check_horizon(horizon_s)
        lo = now - self.season_s
        hi = min(lo + horizon_s, now)
        out = _zeros()
        i = bisect.bisect_left(self._t, lo)
        j = bisect.bisect_left(self._t, hi)
        for k in range(i, j):
            cls, gpus, dur = self._jobs[k]
            out[cls] += gpus * min(dur, horizon_s, now - self._t[k])
        total = 0.0
        for cls in GPU_CLASSES:
            out[cls] /= horizon_s
            total += out[cls]
        out[TOTAL] = total
        return out


class SmoothedSeasonal:
    """Seasonal arrival profile times an online level correction: the forecaster rlsched uses.

    Model, per class ``c``::

        D_c(now, H) = level_c(now) * m_c(H) * (1 / H) * integral_{now}^{now+H} r_c(s) ds

    * ``r_c`` is the GPU-arrival rate (GPUs requested per second) in each hour of the
      week, fitted on the training jobs; hour of the day instead when the training
      span is shorter than two weeks (fewer than two samples per hour-of-week bucket
      would be noise). Each bucket is shrunk by ``shrink_hours`` of pseudo-exposure
      toward a smoother estimate, so a bucket seen once or twice is not trusted fully:
      an hour-of-week bucket toward the same hour of the day (the daily shape is
      seen seven times as often), an hour-of-day bucket toward the class's mean rate.
    * ``m_c(H)`` is the GPU-weighted mean of ``min(duration, H)`` of the class's
      training jobs: durations are not known online, and pooling them over all hours
      is far less noisy than per-bucket estimates of a heavy-tailed quantity.
    * ``level_c`` corrects the profile for the current regime (a busier month, a
      deadline rush): the ratio of observed GPU arrivals to the profile's expectation,
      both exponentially weighted with time constant ``tau_s``. It starts at 1 with
      ``prior_weight * tau_s`` of mean-rate pseudo-evidence that decays away (no lasting
      bias after a real shift). A class's level is shrunk toward the total's level by
      ``class_prior_weight * tau_s`` of pseudo-evidence (a sparse class like ``"8+"``
      has too few arrivals for its own ratio: one 64-GPU job would swing it), and both are clipped to
      ``[level_floor, level_ceiling]`` because a ratio of small counts is unstable.

    ``predict`` is O(1): the profile integral is two look-ups in prefix sums over the
    bucket cycle (precomputed at fit), ``m_c(H)`` is cached per horizon, and the level
    state advances incrementally (one step per hour bucket crossed since the last
    call, bounded by ``20 * tau_s``). The last answer is cached and reused while
    neither ``now``, ``H`` nor the observations change. ``work`` counts the
    expensive steps (tests use it instead of timing).

    A class absent from the training jobs is forecast at 0 whatever arrives online:
    it has no profile to scale. Fit on windows that contain every class that matters.

    Args:
        origin_epoch_s: Unix time (naive local clock) of trace time 0, so that hour
            buckets line up with the wall clock: Philly's trace time 0 is
            ``2017-09-04 10:30:41``, not midnight. 0 (the default) treats trace time 0
            as Thursday 1970-01-01 00:00; any constant phase only relabels buckets.
        season: ``"auto"`` (week if the training span is at least two weeks, else
            day), ``"week"`` or ``"day"``.
        tau_s: time constant of the level correction.
        prior_weight: start-up pseudo-evidence of the level (at level 1), in units of
            ``tau_s`` at the mean rate; it decays like real evidence.
        class_prior_weight: lasting pseudo-evidence (same units) pulling each class's
            level toward the total's level. The defaults (12 h, 1.0, 0.25) were picked
            on Philly's *training* part only, never on the windows they are scored on
            (BENCHMARKS.md, "Design notes moved from docstrings").
        level_floor: lowest level multiplier.
        level_ceiling: highest level multiplier.
        shrink_hours: pseudo-exposure (hours at the smoother rate) added to each bucket.
    """

    def __init__(
        self,
        *,
        origin_epoch_s: float = 0.0,
        season: str = "auto",
        tau_s: float = 12 * HOUR_S,
        prior_weight: float = 1.0,
        class_prior_weight: float = 0.25,
        level_floor: float = 0.25,
        level_ceiling: float = 4.0,
        shrink_hours: float = 1.0,
    ) -> None:
        if season not in ("auto", "week", "day"):
            raise ValueError(f"season must be 'auto', 'week' or 'day', got {season!r}")
        if not tau_s > 0 or min(prior_weight, class_prior_weight, shrink_hours) < 0:
            raise ValueError("tau_s must be > 0; prior weights and shrink_hours >= 0")
        if not 0 < level_floor <= 1 <= level_ceiling:
            raise ValueError(f"need 0 < level_floor <= 1 <= level_ceiling, got {level_floor}, {level_ceiling}")
        self.origin_epoch_s = origin_epoch_s
        self.season = season
        self.tau_s = tau_s
        self.prior_weight = prior_weight
        self.class_prior_weight = class_prior_weight
        self.level_floor = level_floor
        self.level_ceiling = level_ceiling
        self.shrink_hours = shrink_hours
        #: counts of the non-O(1)-per-call steps: horizon-factor computations (one per
        #: distinct horizon) and level-advance steps (one per hour bucket crossed).
        self.work: dict[str, int] = {"horizon_factor": 0, "advance_steps": 0, "predict_cached": 0}
        self.period_s = 0.0
        self._fitted = False
        self._phase = 0.0
        self._nb = 0
        self._rate: dict[str, list[float]] = {}
        self._cum: dict[str, list[float]] = {}
        self._cycle: dict[str, float] = {}
        self._mean_rate: dict[str, float] = {}
        self._dur: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._hcache: dict[float, dict[str, float]] = {}
        #: ``(start, end, GPU jobs)`` of the span :meth:`fit` learned from (None before).
        self.fit_range: tuple[float, float, int] | None = None
        self._reset_online()

    # --- fitting ----------------------------------------------------------------------
    def fit(self, jobs: Sequence[Job], *, start: float | None = None, end: float | None = None) -> None:
        """Fit the hourly profile and duration factors on ``jobs``; resets the online level.

        A bucket's rate is its GPU arrivals divided by its exposure, the seconds of the
        training span that fell in it. The span is ``[start, end)`` when given (the
        window the jobs were cut from: quiet edges then count as observed quiet),
        otherwise the whole wall-clock hours from the first to the last submission.

        Args:
            jobs: training jobs (CPU-only ones are ignored).
            start: start of the training window, if known.
            end: end of the training window, if known.

        Raises:
            ValueError: no GPU job in ``jobs``.
        """
        gjobs = [(j, c) for j in jobs if (c := gpu_class(j)) is not None]
        if not gjobs:
            raise ValueError("cannot fit a demand forecast on no GPU jobs")
        self._phase = self.origin_epoch_s - _MONDAY_S
        first = min(j.submit_time for j, _ in gjobs) if start is None else start
        last = max(j.submit_time for j, _ in gjobs) if end is None else end
        # Whole wall-clock hours: a span cut mid-hour would give its edge buckets a
        # sliver of exposure and so an inflated rate.
        t0 = first - self._x(first) % HOUR_S
        t1 = last - self._x(last) % HOUR_S + HOUR_S if end is None else max(last, t0 + HOUR_S)
        span = t1 - t0
        weekly = self.season == "week" or (self.season == "auto" and span >= 2 * WEEK_S)
        self.period_s = WEEK_S if weekly else DAY_S
        self._nb = nb = int(self.period_s // HOUR_S)

        exposure = np.zeros(nb)
        t = t0
        while t < t1:  # one step per hour boundary of the span: O(span / 1 h), once
            x = self._x(t)
            b = int((x % self.period_s) // HOUR_S)
            nxt = min(t + (HOUR_S - x % HOUR_S), t1)
            exposure[b] += nxt - t
            t = nxt

        buckets = np.array([int((self._x(j.submit_time) % self.period_s) // HOUR_S) for j, _ in gjobs])
        self._rate, self._cum, self._cycle, self._mean_rate, self._dur = {}, {}, {}, {}, {}
        total_rate = np.zeros(nb)
        for cls in GPU_CLASSES:
            idx = [i for i, (_, c) in enumerate(gjobs) if c == cls]
            gpus = np.array([gjobs[i][0].gpu_demand for i in idx], dtype=float)
            durs = np.array([gjobs[i][0].duration for i in idx], dtype=float)
            arrived = np.bincount(buckets[idx], weights=gpus, minlength=nb) if idx else np.zeros(nb)
            mean = float(gpus.sum()) / span
            rate = _shrunk(arrived, exposure, mean, self.shrink_hours * HOUR_S)
            if nb > 24:  # hour of week: shrink toward the hour-of-day profile, not flat
                a_day, e_day = arrived.reshape(-1, 24).sum(axis=0), exposure.reshape(-1, 24).sum(axis=0)
                daily = _shrunk(a_day, e_day, mean, 0.0)  # seven times the data: trusted as is
                rate = _shrunk(arrived, exposure, np.tile(daily, nb // 24), self.shrink_hours * HOUR_S)
            self._set_profile(cls, rate, mean)
            self._dur[cls] = (gpus, durs)
            total_rate += rate
        self._set_profile(TOTAL, total_rate, sum(self._mean_rate[c] for c in GPU_CLASSES))
        self._hcache = {}
        self._fitted = True
        self.fit_range = (float(first), float(last), len(gjobs))
        self._reset_online()

    # --- copies and persistence -------------------------------------------------------
    _PARAMS = ("origin_epoch_s", "season", "tau_s", "prior_weight", "class_prior_weight", "level_floor",
               "level_ceiling", "shrink_hours")

    def params(self) -> dict[str, Any]:
        """Constructor arguments."""
        return {k: getattr(self, k) for k in self._PARAMS}

    def shifted(self, offset_s: float = 0.0) -> SmoothedSeasonal:
        """A fresh copy (online level reset) whose clock runs ``offset_s`` behind.

        ``copy.predict(t)`` uses the profile at ``t + offset_s`` of this one's clock:
        for a replay whose times were re-based to a window start ``offset_s`` seconds
        into the fitting clock. The fitted profile is shared read-only; the online
        state is the copy's own, so copies can run in parallel engines.
        """
        self._need_fit()
        out = SmoothedSeasonal(**{**self.params(), "origin_epoch_s": self.origin_epoch_s + offset_s})
        out.period_s, out._nb, out._phase = self.period_s, self._nb, self._phase + offset_s
        out._rate, out._cum, out._cycle = self._rate, self._cum, self._cycle
        out._mean_rate, out._dur, out._hcache = self._mean_rate, self._dur, dict(self._hcache)
        if self.fit_range is not None:
            a, b, n = self.fit_range
            out.fit_range = (a - offset_s, b - offset_s, n)
        out._fitted = True
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fitted state; :func:`forecaster_from_dict` reads it back (online level not kept)."""
        self._need_fit()
        return {
            "model": "smoothed-seasonal", "params": self.params(), "period_s": self.period_s, "phase_s": self._phase,
            "fit_range": list(self.fit_range) if self.fit_range else None,
            "rate": self._rate, "mean_rate": self._mean_rate,
            "durations": {c: {"gpus": self._dur[c][0].tolist(), "duration": self._dur[c][1].tolist()}
                          for c in GPU_CLASSES},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SmoothedSeasonal:
        """Inverse of :meth:`to_dict` (ValueError on a malformed dict)."""
        try:
            out = cls(**{k: d["params"][k] for k in cls._PARAMS})
            out.period_s = float(d["period_s"])
            out._nb = int(out.period_s // HOUR_S)
            out._phase = float(d["phase_s"])
            for key in FORECAST_KEYS:
                rate = np.array([float(x) for x in d["rate"][key]])
                if len(rate) != out._nb:
                    raise ValueError(f"profile {key!r} has {len(rate)} buckets, expected {out._nb}")
                out._set_profile(key, rate, float(d["mean_rate"][key]))
            out._dur = {c: (np.array(d["durations"][c]["gpus"], dtype=float),
                            np.array(d["durations"][c]["duration"], dtype=float)) for c in GPU_CLASSES}
            fr = d.get("fit_range")
            out.fit_range = (float(fr[0]), float(fr[1]), int(fr[2])) if fr else None
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"not a smoothed-seasonal forecaster: missing or bad {exc}") from None
        out._fitted = True
        return out

    def _set_profile(self, key: str, rate: np.ndarray, mean: float) -> None:
        self._rate[key] = [float(r) for r in rate]
        cum = np.concatenate(([0.0], np.cumsum(rate * HOUR_S)))
        self._cum[key] = [float(c) for c in cum]
        self._cycle[key] = float(cum[-1])
        self._mean_rate[key] = mean

    def _x(self, t: float) -> float:
        """Seconds since a Monday 00:00 on the wall clock."""
        return t + self._phase

    def _horizon_factor(self, horizon_s: float) -> dict[str, float]:
        """``m_c(H)`` per class (cached: O(training jobs) once per distinct horizon)."""
        got = self._hcache.get(horizon_s)
        if got is not None:
            return got
        self.work["horizon_factor"] += 1
        out: dict[str, float] = {}
        for cls in GPU_CLASSES:
            gpus, durs = self._dur[cls]
            g = float(gpus.sum())
            out[cls] = float(gpus @ np.minimum(durs, horizon_s)) / g if g > 0 else 0.0
        if len(self._hcache) >= _MAX_HORIZON_CACHE:
            self._hcache.clear()
        self._hcache[horizon_s] = out
        return out

    # --- online level -----------------------------------------------------------------
    def _reset_online(self) -> None:
        self._t: float | None = None
        self._obs = dict.fromkeys(FORECAST_KEYS, 0.0)  # decayed observed GPU arrivals
        self._exp = dict.fromkeys(FORECAST_KEYS, 0.0)  # decayed profile expectation
        self._version = 0
        self._levels: dict[str, float] | None = None
        self._last_key: tuple[float, float, int] | None = None
        self._last: dict[str, float] = {}

    def _advance(self, t: float) -> None:
        """Decay the level state to time ``t``, integrating the profile over the gap."""
        tau = self.tau_s
        if self._t is None or t - self._t > 20 * tau:  # (older evidence would weigh < e^-20)
            self._start_level(t)
            return
        if t <= self._t:
            return
        cur = self._t
        obs, exp_, rate = self._obs, self._exp, self._rate
        while cur < t:
            x = self._x(cur)
            b = int((x % self.period_s) // HOUR_S)
            nxt = min(cur + (HOUR_S - x % HOUR_S), t)
            decay = math.exp(-(nxt - cur) / tau)
            gain = tau * (1.0 - decay)
            for key in FORECAST_KEYS:
                obs[key] *= decay
                exp_[key] = exp_[key] * decay + rate[key][b] * gain
            self.work["advance_steps"] += 1
            cur = nxt
        self._t = t
        self._version += 1
        self._levels = None

    def _start_level(self, t: float) -> None:
        """Start the level at 1 with ``prior_weight * tau_s`` of mean-rate pseudo-evidence.

        The pseudo-evidence decays like real evidence, so it only steadies the first
        few ``tau_s`` and leaves no bias on a lasting level shift.
        """
        k = self.prior_weight * self.tau_s
        self._obs = {key: k * self._mean_rate[key] for key in FORECAST_KEYS}
        self._exp = dict(self._obs)
        self._t = t
        self._version += 1
        self._levels = None

    def levels(self) -> dict[str, float]:
        """Current level multipliers per key (1.0 = the profile as fitted)."""
        if self._levels is not None:
            return self._levels
        lo, hi = self.level_floor, self.level_ceiling
        den = self._exp[TOTAL]
        lt = self._obs[TOTAL] / den if den > 0 else 1.0
        lt = min(max(lt, lo), hi)
        out = {TOTAL: lt}
        for cls in GPU_CLASSES:
            k = self.class_prior_weight * self._mean_rate[cls] * self.tau_s
            den = self._exp[cls] + k
            lc = (self._obs[cls] + k * lt) / den if den > 0 else lt
            out[cls] = min(max(lc, lo), hi)
        self._levels = out
        return out

    def observe(self, job: Job) -> None:
        """Count one arrival (time and size only, never its duration) toward the level."""
        self._need_fit()
        cls = gpu_class(job)
        if cls is None:
            return
        self._advance(job.submit_time)
        assert self._t is not None
        g = job.gpu_demand
        if job.submit_time < self._t:  # a late report: weigh it as if counted on time
            g *= math.exp(-(self._t - job.submit_time) / self.tau_s)
        self._obs[cls] += g
        self._obs[TOTAL] += g
        self._version += 1
        self._levels = None

    # --- forecast ---------------------------------------------------------------------
    def _integral(self, t: float) -> tuple[float, int, float]:
        x = self._x(t)
        cycles = math.floor(x / self.period_s)
        within = x - cycles * self.period_s
        b = min(int(within // HOUR_S), self._nb - 1)
        return float(cycles), b, within - b * HOUR_S

    def predict(self, now: float, horizon_s: float) -> dict[str, float]:
        """Forecast ``D_c(now, H)`` per class and in total (``"*"`` = sum of the classes).

        Raises:
            RuntimeError: not fitted.
            ValueError: ``horizon_s <= 0``.
        """
        self._need_fit()
        key = (now, horizon_s, self._version)
        if key == self._last_key:
            self.work["predict_cached"] += 1
            return dict(self._last)
        _check_horizon(horizon_s)
        self._advance(now)
        key = (now, horizon_s, self._version)
        lv = self.levels()
        m = self._horizon_factor(horizon_s)
        c0, b0, r0 = self._integral(now)
        c1, b1, r1 = self._integral(now + horizon_s)
        out: dict[str, float] = {}
        total = 0.0
        for cls in GPU_CLASSES:
            cum, rate, cyc = self._cum[cls], self._rate[cls], self._cycle[cls]
            area = (c1 - c0) * cyc + (cum[b1] + rate[b1] * r1) - (cum[b0] + rate[b0] * r0)
            v = lv[cls] * m[cls] * max(area, 0.0) / horizon_s
            out[cls] = v
            total += v
        out[TOTAL] = total
        self._last_key = key
        self._last = out
        return dict(out)

    def profile(self, key: str = TOTAL) -> list[float]:
        """Fitted GPU-arrival rate (GPUs/s) per hour bucket of the season, for reports."""
        self._need_fit()
        return list(self._rate[key])

    def _need_fit(self) -> None:
        if not self._fitted:
            raise RuntimeError("SmoothedSeasonal.fit must be called before observe/predict")


# --- persistence --------------------------------------------------------------------------
#: Names accepted by :func:`make_forecaster` (and in experiment files).
FORECASTER_MODELS: tuple[str, ...] = ("smoothed-seasonal", "seasonal-naive")


def make_forecaster(model: str, **params: Any) -> SmoothedSeasonal | SeasonalNaive:
    """An unfitted forecaster by name (``smoothed-seasonal`` or ``seasonal-naive``)."""
    if model == "smoothed-seasonal":
        return SmoothedSeasonal(**params)
    if model == "seasonal-naive":
        return SeasonalNaive(**params)
    raise ValueError(f"unknown forecaster {model!r} (known: {', '.join(FORECASTER_MODELS)})")


def fresh_forecaster(forecaster: DemandForecaster, offset_s: float = 0.0) -> DemandForecaster:
    """An independent copy of a fitted forecaster for one replay, its clock ``offset_s`` behind.

    Forecasters are stateful (``observe`` changes them), so every engine needs its own
    copy: sharing one between replays would leak one episode's arrivals into the next.
    ``offset_s`` is where the replay's time 0 lies on the clock the forecaster was
    fitted on (re-based windows, day-shifted episodes); forecasters without a
    ``shifted`` method are deep-copied and must be given ``offset_s == 0``.
    """
    shifted = getattr(forecaster, "shifted", None)
    if shifted is not None:
        return shifted(offset_s)
    if offset_s:
        raise ValueError(f"{type(forecaster).__name__} cannot shift its clock")
    import copy

    return copy.deepcopy(forecaster)


def forecaster_from_dict(d: dict[str, Any]) -> SmoothedSeasonal | SeasonalNaive:
    """A fitted forecaster from :meth:`SmoothedSeasonal.to_dict` / :meth:`SeasonalNaive.to_dict` output."""
    if not isinstance(d, dict):
        raise ValueError("a forecaster is a mapping")
    model = d.get("model")
    if model == "smoothed-seasonal":
        return SmoothedSeasonal.from_dict(d)
    if model == "seasonal-naive":
        return SeasonalNaive.from_dict(d)
    raise ValueError(f"unknown forecaster model {model!r} (known: {', '.join(FORECASTER_MODELS)})")


# --- evaluation -------------------------------------------------------------------------
def actual_demand(jobs: Sequence[Job], start: float, horizon_s: float) -> dict[str, float]:
    """The realised ``D_c(start, H)`` of ``jobs`` (the target every forecaster is scored on)."""
    _check_horizon(horizon_s)
    out = _zeros()
    for j in jobs:
        if start <= j.submit_time < start + horizon_s and (cls := gpu_class(j)) is not None:
            out[cls] += j.gpu_demand * min(j.duration, horizon_s)
    for cls in GPU_CLASSES:
        out[cls] /= horizon_s
    out[TOTAL] = sum(out[c] for c in GPU_CLASSES)
    return out


def _metrics(pred: np.ndarray, act: np.ndarray) -> dict[str, float]:
    err = pred - act
    den = np.abs(pred) + np.abs(act)
    smape = np.where(den > 0, 2.0 * np.abs(err) / np.where(den > 0, den, 1.0), 0.0)
    return {
        "mae": float(np.mean(np.abs(err))) if err.size else math.nan,
        "rmse": float(np.sqrt(np.mean(err * err))) if err.size else math.nan,
        "smape": float(np.mean(smape)) if err.size else math.nan,
    }


def evaluate(
    forecaster: DemandForecaster,
    baseline: DemandForecaster,
    jobs_train: Sequence[Job],
    jobs_eval: Sequence[Job],
    horizon_s: float,
    step_s: float,
    *,
    start: float | None = None,
    end: float | None = None,
    fit: bool = True,
) -> dict[str, Any]:
    """Rolling-origin evaluation of ``forecaster`` against ``baseline``.

    Both are fitted on ``jobs_train``. Then for origins ``t = start, start + step, ...``
    while ``t + H <= end``: both predict ``[t, t + H)``, are scored against
    :func:`actual_demand`, and only *then* are the evaluation arrivals of
    ``[t, t + step)`` fed to ``observe``, in submission order. So a prediction at ``t``
    has seen exactly the arrivals before ``t``: no peeking. Windows must end by
    ``end`` because a window running past the data would look artificially empty.

    Args:
        forecaster: the candidate.
        baseline: the yardstick (e.g. :class:`SeasonalNaive`).
        jobs_train: history to fit on (should end before ``start``).
        jobs_eval: the evaluation jobs.
        horizon_s: forecast horizon ``H``.
        step_s: spacing of the origins (windows overlap when ``step_s < H``).
        start: first origin; default the first evaluation submission.
        end: end of the evaluation data; default the last evaluation submission.
        fit: fit both on ``jobs_train`` first (default); False when both come fitted
            (e.g. fresh copies of forecasters fitted elsewhere, their clocks already on
            the evaluation jobs' clock; ``jobs_train`` is then ignored).

    Returns:
        ``{"horizon_s", "step_s", "origins", "mean_actual": {key: float},
        "forecaster": {key: {"mae", "rmse", "smape"}}, "baseline": {...},
        "improvement": {key: {"mae", "rmse", "smape"}}}`` for every key of
        :data:`FORECAST_KEYS`. Demands are in GPUs (GPU-s/s); sMAPE is a fraction in
        [0, 2] (a term with forecast and actual both 0 counts 0); an improvement is
        ``1 - forecaster / baseline`` (positive = the forecaster is better; NaN when the
        baseline's error is 0).

    Raises:
        ValueError: non-positive ``horizon_s`` or ``step_s``, or no evaluation job.
    """
    _check_horizon(horizon_s)
    if not step_s > 0:
        raise ValueError(f"step must be > 0 s, got {step_s}")
    ev = sorted(jobs_eval, key=lambda j: j.submit_time)
    if not ev:
        raise ValueError("no evaluation jobs")
    if fit:
        forecaster.fit(jobs_train)
        baseline.fit(jobs_train)
    t = ev[0].submit_time if start is None else start
    stop = ev[-1].submit_time if end is None else end
    times = [j.submit_time for j in ev]
    # Prefix sums of capped work per class turn each window's actual into two bisects.
    prefix: dict[str, list[float]] = {}
    for cls in GPU_CLASSES:
        acc, p = 0.0, [0.0]
        for j in ev:
            if gpu_class(j) == cls:
                acc += j.gpu_demand * min(j.duration, horizon_s)
            p.append(acc)
        prefix[cls] = p
    pf: dict[str, list[float]] = {k: [] for k in FORECAST_KEYS}
    pb: dict[str, list[float]] = {k: [] for k in FORECAST_KEYS}
    pa: dict[str, list[float]] = {k: [] for k in FORECAST_KEYS}
    fed = bisect.bisect_left(times, t)
    for job in ev[:fed]:  # evaluation jobs before the first origin are history
        forecaster.observe(job)
        baseline.observe(job)
    while t + horizon_s <= stop:
        f = forecaster.predict(t, horizon_s)
        b = baseline.predict(t, horizon_s)
        i, k = bisect.bisect_left(times, t), bisect.bisect_left(times, t + horizon_s)
        total = 0.0
        for cls in GPU_CLASSES:
            a = (prefix[cls][k] - prefix[cls][i]) / horizon_s
            pa[cls].append(a)
            total += a
        pa[TOTAL].append(total)
        for key in FORECAST_KEYS:
            pf[key].append(f.get(key, 0.0))
            pb[key].append(b.get(key, 0.0))
        nxt = bisect.bisect_left(times, t + step_s)
        for job in ev[fed:nxt]:
            forecaster.observe(job)
            baseline.observe(job)
        fed = nxt
        t += step_s
    res_f: dict[str, dict[str, float]] = {}
    res_b: dict[str, dict[str, float]] = {}
    imp: dict[str, dict[str, float]] = {}
    mean_actual: dict[str, float] = {}
    for key in FORECAST_KEYS:
        act = np.array(pa[key])
        res_f[key] = _metrics(np.array(pf[key]), act)
        res_b[key] = _metrics(np.array(pb[key]), act)
        imp[key] = {m: (1.0 - res_f[key][m] / res_b[key][m]) if res_b[key][m] > 0 else math.nan for m in res_f[key]}
        mean_actual[key] = float(act.mean()) if act.size else math.nan
    return {
        "horizon_s": horizon_s,
        "step_s": step_s,
        "origins": len(pa[TOTAL]),
        "mean_actual": mean_actual,
        "forecaster": res_f,
        "baseline": res_b,
        "improvement": imp,
    }


__all__ = [
    "DAY_S",
    "FORECASTER_MODELS",
    "FORECAST_KEYS",
    "GPU_CLASSES",
    "HOUR_S",
    "TOTAL",
    "WEEK_S",
    "DemandForecaster",
    "SeasonalNaive",
    "SmoothedSeasonal",
    "actual_demand",
    "evaluate",
    "forecaster_from_dict",
    "fresh_forecaster",
    "gpu_class",
    "make_forecaster",
]
