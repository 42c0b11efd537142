"""GPU-demand forecasters: exact on periodic load, adaptive to level shifts, O(1), never peeking."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rlsched.cluster.job import Job
from rlsched.workload import read_philly
from rlsched.workload.forecast import (
    DAY_S,
    FORECAST_KEYS,
    HOUR_S,
    TOTAL,
    DemandForecaster,
    SeasonalNaive,
    SmoothedSeasonal,
    actual_demand,
    evaluate,
    gpu_class,
)

#: Jobs per hour of the day of the synthetic workload: a quiet night, a busy day.
_PER_HOUR = [2, 1, 1, 1, 1, 2, 4, 8, 12, 14, 15, 14, 12, 13, 14, 13, 11, 9, 7, 5, 4, 3, 3, 2]


def _periodic(days: int, *, scale: float = 1.0, start_day: int = 0) -> list[Job]:
    """Deterministic daily pattern: ``_PER_HOUR[h] * scale`` 1-GPU 10-min jobs, evenly spread in hour ``h``."""
    jobs = []
    for d in range(start_day, start_day + days):
        for h, n in enumerate(_PER_HOUR):
            k = round(n * scale)
            for i in range(k):
                t = d * DAY_S + h * HOUR_S + (i + 0.5) * HOUR_S / k
                jobs.append(Job(f"p{d}-{h}-{i}", t, 600.0, 1))
    return jobs


def _poisson(days: int, *, scale: float, start_day: int, seed: int) -> list[Job]:
    """Poisson arrivals around the same daily pattern, mixed sizes (noise that naive copies)."""
    rng = np.random.default_rng(seed)
    jobs = []
    for d in range(start_day, start_day + days):
        for h, n in enumerate(_PER_HOUR):
            for i in range(rng.poisson(n * scale)):
                t = d * DAY_S + h * HOUR_S + rng.uniform(0, HOUR_S)
                g = int(rng.choice([1, 1, 1, 2, 4, 8]))
                jobs.append(Job(f"q{d}-{h}-{i}", t, float(rng.exponential(1800.0)), g))
    return sorted(jobs, key=lambda j: j.submit_time)


def test_gpu_classes_and_actual_demand_definition() -> None:
    frac = Job("f", 0.0, 100.0, 1, 250)
    one = Job("o", 10.0, 10_000.0, 1)  # longer than the horizon: capped at it
    four = Job("g", 20.0, 50.0, 4)
    big = Job("b", 30.0, 100.0, 16)
    cpu = Job("c", 40.0, 100.0, 0)
    late = Job("l", 1000.0, 100.0, 1)  # outside [0, 1000)
    assert [gpu_class(j) for j in (frac, one, four, big, cpu)] == ["fractional", "1", "2-4", "8+", None]
    got = actual_demand([frac, one, four, big, cpu, late], 0.0, 1000.0)
    assert got == pytest.approx(
        {
            "fractional": 0.25 * 100 / 1000,
            "1": 1.0,
            "2-4": 4 * 50 / 1000,
            "8+": 16 * 100 / 1000,
            TOTAL: 0.025 + 1.0 + 0.2 + 1.6,
        }
    )


def test_forecasters_satisfy_the_protocol() -> None:
    assert isinstance(SmoothedSeasonal(), DemandForecaster)
    assert isinstance(SeasonalNaive(), DemandForecaster)


def test_seasonal_profile_is_near_exact_on_a_periodic_series() -> None:
    f = SmoothedSeasonal(shrink_hours=1.0)  # hour of week, shrunk toward the (identical) daily shape
    f.fit(_periodic(14))
    assert f.period_s == 7 * DAY_S
    future = _periodic(1, start_day=14)
    errs: list[float] = []
    for h in range(24):
        now = 14 * DAY_S + h * HOUR_S
        pred = f.predict(now, HOUR_S)
        act = actual_demand(future, now, HOUR_S)
        # exact up to the level's ripple (arrivals are discrete, the profile is not)
        assert pred[TOTAL] == pytest.approx(act[TOTAL], rel=0.08)
        assert pred["1"] == pred[TOTAL]
        assert pred["8+"] == 0.0
        errs.append(abs(pred[TOTAL] - act[TOTAL]) / act[TOTAL])
        for job in future:
            if now <= job.submit_time < now + HOUR_S:
                f.observe(job)
    assert float(np.mean(errs)) < 0.03
    f.fit(_periodic(14))  # a fresh fit: level exactly 1, the profile alone is exact
    # a 6 h window sums six hourly buckets (the 10-min jobs are not capped)
    now = 14 * DAY_S + 7 * HOUR_S
    assert f.predict(now, 6 * HOUR_S)[TOTAL] == pytest.approx(actual_demand(future, now, 6 * HOUR_S)[TOTAL], rel=1e-6)


def test_auto_season_is_weekly_only_with_two_weeks_of_history() -> None:
    f = SmoothedSeasonal()
    f.fit(_periodic(10))
    assert f.period_s == DAY_S
    f.fit(_periodic(15))
    assert f.period_s == 7 * DAY_S


def test_origin_epoch_sets_the_phase() -> None:
    shift = 5 * HOUR_S
    a = SmoothedSeasonal(season="day", shrink_hours=0.0)
    a.fit(_periodic(7))
    # the same wall-clock workload, recorded on a clock that starts 5 h later
    b = SmoothedSeasonal(season="day", shrink_hours=0.0, origin_epoch_s=shift)
    b.fit([Job(j.job_id, j.submit_time - shift, j.duration, j.num_gpus) for j in _periodic(7)])
    for h in range(24):
        t = 7 * DAY_S + h * HOUR_S
        assert b.predict(t - shift, HOUR_S)[TOTAL] == pytest.approx(a.predict(t, HOUR_S)[TOTAL], rel=1e-9)


def test_online_level_correction_reacts_and_is_clipped() -> None:
    f = SmoothedSeasonal(season="day", shrink_hours=0.0, level_floor=0.25, level_ceiling=4.0)
    f.fit(_periodic(14))
    base = f.predict(14 * DAY_S, HOUR_S)[TOTAL]
    assert f.levels()[TOTAL] == pytest.approx(1.0)
    # a day at double the usual load: the level and the forecast follow
    f2 = SmoothedSeasonal(season="day", shrink_hours=0.0)
    f2.fit(_periodic(14))
    for job in _periodic(1, scale=2.0, start_day=14):
        f2.observe(job)
    assert f2.levels()[TOTAL] > 1.6
    assert f2.levels()["1"] > 1.6  # the only class present follows too
    after = f2.predict(15 * DAY_S, HOUR_S)[TOTAL]
    assert after > 1.6 * base
    # then two silent days: the level falls, to the floor and no further
    f2.predict(17 * DAY_S, HOUR_S)
    assert f2.levels()[TOTAL] == pytest.approx(0.25)
    assert f2.levels()["1"] == pytest.approx(0.25)
    # a lasting shift leaves no bias: the start-up prior decays away
    f3 = SmoothedSeasonal(season="day", shrink_hours=0.0, tau_s=6 * HOUR_S)
    f3.fit(_periodic(14))
    for job in _periodic(4, scale=1.5, start_day=14):
        f3.observe(job)
    assert f3.levels()[TOTAL] == pytest.approx(1.5, rel=0.02)


def test_seasonal_beats_naive_after_a_level_shift() -> None:
    # deterministic series, load x1.5 from day 14: naive is wrong for a whole day,
    # the level correction catches up within hours
    kw = {"start": 14 * DAY_S, "end": 16 * DAY_S}
    for h in (HOUR_S, 6 * HOUR_S):
        res = evaluate(
            SmoothedSeasonal(), SeasonalNaive(), _periodic(14), _periodic(2, scale=1.5, start_day=14), h, HOUR_S, **kw
        )
        assert res["improvement"][TOTAL]["mae"] > 0.3
    # noisy (Poisson, mixed sizes) series, x1.6 for a week, 1 h ahead
    train = _poisson(21, scale=1.0, start_day=0, seed=1)
    shifted = _poisson(7, scale=1.6, start_day=21, seed=2)
    kw = {"start": 21 * DAY_S, "end": 28 * DAY_S}
    res = evaluate(SmoothedSeasonal(), SeasonalNaive(), train, shifted, HOUR_S, HOUR_S, **kw)
    assert res["forecaster"][TOTAL]["mae"] < res["baseline"][TOTAL]["mae"]
    assert res["improvement"][TOTAL]["rmse"] > 0
    # and the online level is what does it: the same profile frozen at level 1 is worse
    frozen = evaluate(
        SmoothedSeasonal(level_floor=1.0, level_ceiling=1.0), SeasonalNaive(), train, shifted, HOUR_S, HOUR_S, **kw
    )
    assert res["forecaster"][TOTAL]["mae"] < frozen["forecaster"][TOTAL]["mae"]
    assert set(res["forecaster"]) == set(FORECAST_KEYS)
    assert res["origins"] == 7 * 24


def test_predict_does_constant_work_per_call() -> None:
    f = SmoothedSeasonal(tau_s=6 * HOUR_S)  # a long gap then costs <= 20 * 6 hourly steps
    f.fit(_poisson(21, scale=1.0, start_day=0, seed=3))
    t0 = 21 * DAY_S
    calls = 10_000
    for i in range(calls):  # one simulated day of decision points, 8.64 s apart
        f.predict(t0 + i * DAY_S / calls, HOUR_S)
    assert f.work["horizon_factor"] == 1  # per-horizon duration factor: computed once, then cached
    assert f.work["advance_steps"] <= calls + 24  # one step per call, plus one per hour boundary crossed
    before = dict(f.work)
    for _ in range(100):  # same decision time, nothing new observed: the cached answer
        f.predict(t0 + DAY_S, HOUR_S)
    assert f.work["predict_cached"] - before["predict_cached"] >= 99
    assert f.work["advance_steps"] - before["advance_steps"] <= 1
    # a long gap costs a bounded number of steps (older evidence is negligible)
    before_steps = f.work["advance_steps"]
    f.predict(t0 + 365 * DAY_S, HOUR_S)
    assert f.work["advance_steps"] - before_steps <= 20 * 6 + 2
    # the answer is a fresh dict: a caller mutating it cannot corrupt the cache
    got = f.predict(t0 + 365 * DAY_S, HOUR_S)
    got[TOTAL] = -1.0
    assert f.predict(t0 + 365 * DAY_S, HOUR_S)[TOTAL] >= 0.0


class _Spy:
    """Records what it was told and when, and checks the no-peeking contract."""

    def __init__(self, eval_jobs: Sequence[Job]) -> None:
        self.eval_times = sorted(j.submit_time for j in eval_jobs)
        self.fitted: list[Job] = []
        self.seen: list[float] = []
        self.predicts = 0

    def fit(self, jobs: Sequence[Job]) -> None:
        self.fitted = list(jobs)

    def observe(self, job: Job) -> None:
        assert not self.seen or job.submit_time >= self.seen[-1]
        self.seen.append(job.submit_time)

    def predict(self, now: float, horizon_s: float) -> dict[str, float]:
        # everything before ``now`` has been fed, nothing at or after it
        assert all(t < now for t in self.seen)
        assert len(self.seen) == sum(1 for t in self.eval_times if t < now)
        self.predicts += 1
        return dict.fromkeys(FORECAST_KEYS, 0.0)


def test_rolling_origin_evaluation_never_peeks() -> None:
    train = _poisson(3, scale=1.0, start_day=0, seed=4)
    ev = _poisson(2, scale=1.0, start_day=3, seed=5)
    a, b = _Spy(ev), _Spy(ev)
    res = evaluate(a, b, train, ev, 2 * HOUR_S, 30 * 60.0, start=3 * DAY_S, end=5 * DAY_S)
    assert a.fitted == train and b.fitted == train
    assert a.predicts == b.predicts == res["origins"] == int((2 * DAY_S - 2 * HOUR_S) / 1800) + 1
    assert a.seen[-1] < 5 * DAY_S - 2 * HOUR_S + 1800  # never fed past the last scored window


def test_seasonal_naive_copies_yesterday_and_censors_at_now() -> None:
    n = SeasonalNaive(DAY_S)
    n.fit([Job("a", 100.0, 50.0, 2), Job("b", 200.0, 1e6, 1)])
    got = n.predict(DAY_S, HOUR_S)  # window [0, 1 h) of yesterday
    assert got["2-4"] == pytest.approx(2 * 50 / HOUR_S)
    assert got["1"] == pytest.approx(1.0)  # known to run >= 1 h by now: capped at H
    short = SeasonalNaive(600.0)  # a season shorter than the horizon: only what is visible by now
    short.fit([Job("c", 0.0, 1e6, 1)])
    assert short.predict(600.0, HOUR_S)["1"] == pytest.approx(600.0 / HOUR_S)
    assert SeasonalNaive().predict(0.0, HOUR_S) == dict.fromkeys(FORECAST_KEYS, 0.0)


def test_errors() -> None:
    with pytest.raises(RuntimeError):
        SmoothedSeasonal().predict(0.0, HOUR_S)
    with pytest.raises(ValueError):
        SmoothedSeasonal().fit([Job("c", 0.0, 1.0, 0)])
    f = SmoothedSeasonal()
    f.fit(_periodic(1))
    with pytest.raises(ValueError):
        f.predict(0.0, 0.0)
    with pytest.raises(ValueError):
        SmoothedSeasonal(season="month")


def test_fits_and_scores_the_real_philly_slice(data_dir: Path) -> None:
    jobs = read_philly(str(data_dir / "philly_slice.csv")).jobs
    f = SmoothedSeasonal()
    f.fit(jobs)
    end = max(j.submit_time for j in jobs)
    pred = f.predict(end, HOUR_S)
    assert set(pred) == set(FORECAST_KEYS)
    assert all(math.isfinite(v) and v >= 0 for v in pred.values())
    assert pred[TOTAL] == pytest.approx(sum(v for k, v in pred.items() if k != TOTAL))
    assert pred[TOTAL] > 0
    cut = 0.6 * end
    res = evaluate(
        SmoothedSeasonal(),
        SeasonalNaive(),
        [j for j in jobs if j.submit_time < cut],
        [j for j in jobs if j.submit_time >= cut],
        HOUR_S,
        HOUR_S,
        start=cut,
        end=end,
    )
    assert res["origins"] > 0
    assert all(math.isfinite(v) for v in res["forecaster"][TOTAL].values())


# --- persistence and copies ------------------------------------------------------------------------
def test_smoothed_seasonal_json_round_trip_and_fresh_copies() -> None:
    import json

    from rlsched.workload.forecast import forecaster_from_dict, fresh_forecaster

    train = _poisson(21, scale=1.0, start_day=0, seed=3)
    f = SmoothedSeasonal(tau_s=6 * HOUR_S)
    f.fit(train, start=0.0, end=21 * DAY_S)
    assert f.fit_range == (0.0, 21 * DAY_S, len(train))
    g = forecaster_from_dict(json.loads(json.dumps(f.to_dict())))
    assert isinstance(g, SmoothedSeasonal) and g.params() == f.params() and g.fit_range == f.fit_range
    online = _poisson(2, scale=1.5, start_day=21, seed=4)
    for a, b in ((f, g), (fresh_forecaster(f), fresh_forecaster(g))):
        for j in online:
            a.observe(j)
            b.observe(j)
        for h in (HOUR_S, 6 * HOUR_S):
            pa, pb = a.predict(23 * DAY_S + 100.0, h), b.predict(23 * DAY_S + 100.0, h)
            assert pa == pytest.approx(pb, rel=1e-12)
    # copies do not share online state: a fresh copy has not seen what ``f`` observed above
    c = fresh_forecaster(f)
    assert c.levels() != f.levels() or c._t is None
    # a shifted copy predicts on a re-based clock
    s = f.shifted(5 * DAY_S + 3 * HOUR_S)
    ref = fresh_forecaster(f)
    assert s.predict(0.0, HOUR_S) == pytest.approx(ref.predict(5 * DAY_S + 3 * HOUR_S, HOUR_S))
    assert s.fit_range is not None and s.fit_range[0] == -(5 * DAY_S + 3 * HOUR_S)


def test_seasonal_naive_json_round_trip_and_shift() -> None:
    from rlsched.workload.forecast import forecaster_from_dict

    train = _poisson(3, scale=1.0, start_day=0, seed=5)
    f = SeasonalNaive(DAY_S)
    f.fit(train)
    g = forecaster_from_dict(f.to_dict())
    assert isinstance(g, SeasonalNaive) and g.fit_range == f.fit_range
    assert g.predict(3 * DAY_S + 10.0, HOUR_S) == f.predict(3 * DAY_S + 10.0, HOUR_S)
    s = f.shifted(2 * DAY_S)
    assert s.predict(DAY_S + 10.0, HOUR_S) == f.predict(3 * DAY_S + 10.0, HOUR_S)
    with pytest.raises(ValueError, match="unknown forecaster model"):
        forecaster_from_dict({"model": "prophet"})
    with pytest.raises(ValueError, match="not a smoothed-seasonal"):
        forecaster_from_dict({"model": "smoothed-seasonal", "params": {}})


def test_evaluate_without_refitting_uses_the_given_state() -> None:
    from rlsched.workload.forecast import fresh_forecaster

    train, ev = _periodic(14), _periodic(3, start_day=14)
    f = SmoothedSeasonal()
    f.fit(train)
    b = SeasonalNaive()
    b.fit(train)
    fitted = evaluate(fresh_forecaster(f), b.shifted(0.0), [], ev, HOUR_S, HOUR_S, fit=False)
    refit = evaluate(SmoothedSeasonal(), SeasonalNaive(), train, ev, HOUR_S, HOUR_S)
    assert fitted["forecaster"][TOTAL]["mae"] == pytest.approx(refit["forecaster"][TOTAL]["mae"])
    assert fitted["baseline"][TOTAL]["mae"] == pytest.approx(refit["baseline"][TOTAL]["mae"])
