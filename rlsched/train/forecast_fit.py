"""The demand forecaster of a training run: fitted on the training windows only, scored on the evaluation ones.

``rlsched train`` fits one forecaster per training scenario entry (the
experiment's ``forecast:`` block) on the jobs of that entry's *training window*
(at the trace's own load: load factors rescale time, so they would bend the daily
profile). Every world then gets it on its own clock:

* training worlds of the entry: offset 0 (their time 0 is the training window's);
* evaluation worlds of the entry: shifted by ``(window start - training start)``
  hours, so the hour-of-day/-week profile stays aligned with the trace clock;
* holdout worlds: the forecaster of a training entry with the same scenario
  (shifted likewise), else the first entry's with offset 0 (an unseen trace whose
  phase is unknown: the online level correction is all that adapts).

Load-rescaled worlds compress or stretch time, so their forecast is only
approximately phased; the online level absorbs the change of volume. Each replay
(training episode, evaluation run of the policy and of every heuristic) gets a
*fresh copy* of its world's forecaster: forecasters learn online from the
arrivals they observe, and sharing one object would leak one replay into the next.

The forecaster's error against a seasonal-naive forecast (same window one day
earlier, fitted on the same training jobs) is measured on the evaluation windows
with :func:`rlsched.workload.forecast.evaluate` (rolling origin, no peeking).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlsched.cluster.job import Job
from rlsched.learned.ppo import FORECASTER_FILE
from rlsched.posix import atomic_write
from rlsched.train.config import Experiment, ExperimentError, ScenarioEntry
from rlsched.train.worlds import World, _cut, load_entry
from rlsched.workload.forecast import (
    DAY_S,
    TOTAL,
    DemandForecaster,
    SeasonalNaive,
    evaluate,
    fresh_forecaster,
    make_forecaster,
)

#: Name of the yardstick the forecaster is scored against.
BASELINE = "seasonal-naive"
_METRICS = ("mae", "rmse", "smape")


def training_jobs(entry: ScenarioEntry) -> tuple[list[Job], float]:
    """The jobs of ``entry``'s training window (times re-based to its start) and the window's length in seconds."""
    assert entry.train_window_h is not None
    a, b = entry.train_window_h
    return list(_cut(load_entry(entry), a, b, None, None).jobs), (b - a) * 3600.0


def fit_forecasters(exp: Experiment) -> dict[str, DemandForecaster]:
    """One fitted forecaster per training scenario entry (empty when ``forecast.model`` is ``none``)."""
    fp = exp.forecast
    if not fp.enabled:
        return {}
    out: dict[str, DemandForecaster] = {}
    for entry in exp.scenarios:
        jobs, span = training_jobs(entry)
        f = make_forecaster(fp.model, **fp.model_params())
        try:
            if isinstance(f, SeasonalNaive):
                f.fit(jobs)
            else:
                f.fit(jobs, start=0.0, end=span)
        except ValueError as exc:
            raise ExperimentError(f"scenario {entry.name}: cannot fit the demand forecaster ({exc})") from None
        out[entry.name] = f
    return out


def _source(exp: Experiment, world: World, holdout: bool) -> tuple[str, float]:
    """(training entry whose forecaster serves ``world``, clock offset in seconds)."""
    entries = {e.name: e for e in exp.scenarios}
    if not holdout and world.entry in entries:
        e = entries[world.entry]
    else:
        spec = next((h.scenario for h in exp.holdout if h.name == world.entry), None)
        e = next((t for t in exp.scenarios if t.scenario == spec), None)  # type: ignore[assignment]
        if e is None:
            return exp.scenarios[0].name, 0.0
    assert e.train_window_h is not None
    return e.name, (world.start_h - e.train_window_h[0]) * 3600.0


def attach(exp: Experiment, worlds: list[World], fitted: dict[str, DemandForecaster], *,
           holdout: bool = False) -> list[World]:
    """``worlds`` with their forecaster (each on its own clock; unchanged when none was fitted)."""
    if not fitted:
        return worlds
    out = []
    for w in worlds:
        name, offset = _source(exp, w, holdout)
        out.append(replace(w, forecaster=fresh_forecaster(fitted[name], offset),
                           forecast_horizon_s=float(exp.forecast.horizon_s)))
    return out


def forecast_error(exp: Experiment, eval_worlds: list[World], fitted: dict[str, DemandForecaster]) -> dict[str, Any]:
    """The forecaster's error against seasonal-naive on every distinct evaluation window.

    Cluster variants of one window replay the same jobs, so each (entry, window, load)
    is scored once. A window shorter than the horizon has no origin and is listed
    with ``origins: 0``.

    Returns:
        ``{"model", "baseline", "horizon_s", "step_s", "windows": {label: evaluate(...) result},
        "mean": {"model": {metric}, "baseline": {metric}, "improvement": {metric}}}`` where
        ``mean`` is over all origins of all windows, for the total demand (``"*"``).
    """
    fp = exp.forecast
    horizon, step = float(fp.horizon_s), float(fp.eval_step_s)
    windows: dict[str, Any] = {}
    seen: set[tuple[str, float, float, float | None]] = set()
    sums = {side: dict.fromkeys(_METRICS, 0.0) for side in ("model", "baseline")}
    n = 0
    train_cache: dict[str, list[Job]] = {}
    for w in attach(exp, eval_worlds, fitted):
        key = (w.entry, w.start_h, w.end_h, w.load)
        if key in seen or w.forecaster is None:
            continue
        seen.add(key)
        name, offset = _source(exp, w, False)
        if name not in train_cache:
            train_cache[name] = training_jobs(next(e for e in exp.scenarios if e.name == name))[0]
        naive = SeasonalNaive(DAY_S)
        naive.fit(train_cache[name])
        label = f"{w.entry}/eval[{w.start_h:g}-{w.end_h:g}h]" + (f"@{w.load:g}" if w.load is not None else "")
        jobs = [j for j in w.scenario.jobs if j.num_gpus > 0]
        if not jobs:
            windows[label] = {"origins": 0}
            continue
        res = evaluate(fresh_forecaster(w.forecaster), naive.shifted(offset), [], jobs, horizon, step, fit=False)
        windows[label] = res
        k = int(res["origins"])
        if k:
            n += k
            for m in _METRICS:
                # RMSE is pooled as a root of the mean of squares, the others as means.
                sq = m == "rmse"
                sums["model"][m] += k * (res["forecaster"][TOTAL][m] ** 2 if sq else res["forecaster"][TOTAL][m])
                sums["baseline"][m] += k * (res["baseline"][TOTAL][m] ** 2 if sq else res["baseline"][TOTAL][m])
    mean: dict[str, dict[str, float]] = {"model": {}, "baseline": {}, "improvement": {}}
    for m in _METRICS:
        for side in ("model", "baseline"):
            v = sums[side][m] / n if n else math.nan
            mean[side][m] = math.sqrt(v) if m == "rmse" and n else v
        b = mean["baseline"][m]
        mean["improvement"][m] = 1.0 - mean["model"][m] / b if n and b > 0 else math.nan
    return {"model": fp.model, "baseline": BASELINE, "horizon_s": horizon, "step_s": step, "origins": n,
            "windows": windows, "mean": mean}


def error_metrics(report: dict[str, Any]) -> dict[str, float]:
    """MLflow metrics: ``forecast/<model>/<metric>``, ``forecast/seasonal-naive/..``, ``forecast/improvement/..``."""
    out: dict[str, float] = {}
    mean = report["mean"]
    for m in _METRICS:
        for side, name in (("baseline", BASELINE), ("model", report["model"])):
            v = mean[side][m]
            if math.isfinite(v):
                out[f"forecast/{name}/{m}"] = float(v)
        v = mean["improvement"][m]
        if math.isfinite(v):
            out[f"forecast/improvement/{m}"] = float(v)
    out["forecast/origins"] = float(report["origins"])
    return out


def error_markdown(report: dict[str, Any]) -> str:
    """The error report as markdown (terminal, MODEL_CARD.md)."""
    h = report["horizon_s"] / 3600.0
    lines = [
        f"### Demand forecast on the evaluation windows ({report['model']} vs {BASELINE}, "
        f"horizon {h:g} h, origin every {report['step_s'] / 3600.0:g} h)",
        "",
        "Total GPU demand (average busy GPUs of the horizon's arrivals); gain = 1 - model / seasonal-naive.",
        "",
        "| window | origins | mean actual | MAE model / naive | RMSE model / naive | sMAPE model / naive |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, r in report["windows"].items():
        if not r.get("origins"):
            lines.append(f"| {label} | 0 | - | - | - | - |")
            continue
        f, b = r["forecaster"][TOTAL], r["baseline"][TOTAL]
        lines.append(f"| {label} | {r['origins']} | {r['mean_actual'][TOTAL]:.2f} | {f['mae']:.2f} / {b['mae']:.2f} "
                     f"| {f['rmse']:.2f} / {b['rmse']:.2f} | {f['smape']:.3f} / {b['smape']:.3f} |")
    mean = report["mean"]
    if report["origins"]:
        g = mean["improvement"]
        lines.append(f"| **all** | {report['origins']} | | {mean['model']['mae']:.2f} / {mean['baseline']['mae']:.2f} "
                     f"| {mean['model']['rmse']:.2f} / {mean['baseline']['rmse']:.2f} "
                     f"| {mean['model']['smape']:.3f} / {mean['baseline']['smape']:.3f} |")
        lines += ["", f"Gain over seasonal-naive: MAE {g['mae']:+.1%}, RMSE {g['rmse']:+.1%}, "
                      f"sMAPE {g['smape']:+.1%}."]
    else:
        lines += ["", "No evaluation window is longer than the horizon: no error could be measured."]
    return "\n".join(lines) + "\n"


def save_forecaster(folder: Path, forecaster: DemandForecaster, horizon_s: float, fitted_on: str) -> Path:
    """Write ``forecaster.json`` (the fitted state, its horizon and what it was fitted on) into a model folder."""
    to_dict = getattr(forecaster, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"{type(forecaster).__name__} cannot be saved (no to_dict)")
    doc = {"format": 1, "horizon_s": horizon_s, "fitted_on": fitted_on, "forecaster": to_dict()}
    path = folder / FORECASTER_FILE
    atomic_write(path, json.dumps(doc) + "\n")
    return path

