"""The served model's demand forecaster, fed by the service's own submissions.

A policy trained with a demand forecaster (``forecaster.json`` in its model
folder, see :func:`rlsched.learned.ppo.load_model_forecast`) reads the
forecast total in its observation (``ClusterState.demand_forecast["*"]``); in
the simulator the engine feeds a fresh copy of it every arrival and publishes
``predict(now, horizon)`` before each decision point. The service builds a fresh
:class:`~rlsched.cluster.model.ClusterState` every pass, so :class:`LiveForecast`
keeps that forecaster alive across passes and does the same:

* a fresh copy (``ModelForecast.new()``) per served model: a model reload gets a
  new copy; at creation it is warmed up with the jobs the store shows submitted
  in the last :data:`WARMUP_S` (its level then reflects recent demand, as it
  would had it been running all along, instead of the training prior);
* every job the service accepted is observed once, in submission order (the
  store's ``seq``), as a :class:`~rlsched.cluster.job.Job` submitted at its
  ``submitted_at`` - its duration is never read (forecasters only use arrival
  times and sizes online);
* before each policy pass ``predict(now, horizon_s)`` goes into
  ``state.demand_forecast`` / ``state.demand_forecast_horizon_s``.

**Time base.** The simulator's clock is trace time (seconds since the trace
window's start) and the forecaster is fitted on that same clock; its
``origin_epoch_s`` (``SmoothedSeasonal``; 0 by default) says which *naive local*
wall-clock instant trace time 0 was, which aligns its hour-of-day (and
hour-of-week) buckets with the wall clock: trace time ``t`` is the local wall
time ``origin_epoch_s + t``. The service's clock is Unix time (UTC), so a
service instant ``u`` is handed to the forecaster as::

    t = u + utcoffset_local(u) - origin_epoch_s        (see forecast_time)

i.e. the local wall-clock time of ``u``, with the trace's convention of naive
local timestamps: the forecaster sees 09:00 local at the same phase of its daily
profile as 09:00 of the training trace (and the same weekday for a weekly
profile). With ``origin_epoch_s == 0`` the training trace's time 0 is taken as
midnight (Thursday 1970-01-01), so its profile is assumed to start at midnight.
The offset is the local time zone's at each instant, like the traces' local
timestamps; a daylight-saving change moves the clock by an hour, which the
forecaster absorbs (a jump back only delays its level updates). Forecasters
without ``origin_epoch_s`` (seasonal-naive) use the same mapping with origin 0.
Only differences and day/week phases of this clock matter to the forecasters.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from rlsched.cluster.model import ClusterState

#: Submissions of this long before a forecaster is created are replayed into it (its level's
#: time constant is 12 h by default; evidence older than a few time constants weighs nothing).
WARMUP_S = 48 * 3600.0


def forecast_time(unix_s: float, origin_epoch_s: float = 0.0) -> float:
    """A service (Unix, UTC) time on a demand forecaster's clock (see the module doc)."""
    return unix_s + float(time.localtime(unix_s).tm_gmtoff) - origin_epoch_s


def served_forecast(scheduler: Any) -> Any:
    """The :class:`~rlsched.learned.ppo.ModelForecast` of the model a scheduler serves, or None.

    ``scheduler`` may be a :class:`~rlsched.runtime.fallback.FallbackScheduler` (its
    loaded primary is looked at) or a scheduler itself. Heuristics, models without
    ``forecaster.json`` and primaries not loaded yet give None.
    """
    primary = getattr(scheduler, "primary", scheduler)
    model = getattr(primary, "model", None)
    if model is None:
        return None  # not a model-backed scheduler: no need to import the policy package
    from rlsched.learned.ppo import policy_forecast

    return policy_forecast(primary)


class LiveForecast:
    """One served model's forecaster, its observations and its predictions (see the module doc).

    Args:
        source: the model's :class:`~rlsched.learned.ppo.ModelForecast`.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self.forecaster = source.new()
        self.horizon_s = float(source.horizon_s)
        self.origin_epoch_s = float(getattr(self.forecaster, "origin_epoch_s", 0.0) or 0.0)
        #: highest store ``seq`` observed so far
        self.seq = -1
        self.observed = 0

    def clock(self, unix_s: float) -> float:
        """``unix_s`` on the forecaster's clock."""
        return forecast_time(unix_s, self.origin_epoch_s)

    def observe(self, records: Iterable[Any], since: float | None = None) -> int:
        """Observe the job records not seen yet (``seq`` above the last observed), in submission order.

        Args:
            records: :class:`~rlsched.runtime.store.JobRecord` s (any states; seen ones are skipped).
            since: skip records submitted before this Unix time (the warm-up window).

        Returns:
            how many were observed.
        """
        new = sorted((r for r in records if r.seq > self.seq and (since is None or r.submitted_at >= since)),
                     key=lambda r: r.seq)
        for rec in new:
            self.forecaster.observe(rec.to_job(submit_time=self.clock(rec.submitted_at)))
            self.seq = rec.seq
        self.observed += len(new)
        return len(new)

    def predict(self, now: float) -> dict[str, float]:
        """``predict(now, horizon_s)`` on the forecaster's clock."""
        return dict(self.forecaster.predict(self.clock(now), self.horizon_s))

    def publish(self, state: ClusterState, now: float) -> None:
        """Put the forecast for ``now`` into ``state`` (what the engine does before a decision point)."""
        state.demand_forecast = self.predict(now)
        state.demand_forecast_horizon_s = self.horizon_s
