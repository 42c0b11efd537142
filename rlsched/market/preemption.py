"""How long a spot node lives before the market takes it back.

Two evidence sources, two models:

* **AWS Spot Advisor** buckets (``aws_spot_advisor_gpu_interruption.csv``) give, per
  instance type and region, the share of instances interrupted per month as a
  bucket (<5%, 5-10%, 10-15%, 15-20%, >20%). We take the bucket midpoint ``p``
  (lower bound from the label, upper bound from ``interruption_upper_pct``; the
  open ">20%" bucket's file upper bound is 100, so its midpoint is 60% unless
  ``open_bucket_upper_pct`` caps it) and turn it into a constant hourly hazard
  assuming exponential lifetimes: ``P(reclaimed within a month) = p`` gives
  ``lambda = -ln(1 - p) / 730`` (730 h = one average month). Per GPU model we take
  the median over every row of the families that carry that GPU (all sizes and
  regions), or over one region's rows when a region is given. Families and snapshot:
  the latest snapshot that lists a family is used.
* **Observed lifetimes** (``spot_instance_lifetimes_2020.csv``, AWS and GCP, 2020):
  right-censored (instances still running when logging stopped). A Kaplan-Meier
  estimator gives the survival curve without biasing towards short lives; lifetimes
  are sampled by inverse transform from it, and beyond the last observed time the
  curve continues with an exponential tail whose rate is the average hazard over the
  observed range, ``-ln S(t_max) / t_max``.

Both implement :class:`PreemptionModel`; lifetimes are in seconds.
"""

from __future__ import annotations

import csv
import math
import os
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from rlsched.cluster.catalog import resolve_model_name
from rlsched.errors import MarketError

__all__ = [
    "AWS_FAMILY_MODELS",
    "HOURS_PER_MONTH",
    "AdvisorEstimate",
    "ExponentialPreemption",
    "KaplanMeier",
    "KaplanMeierPreemption",
    "PreemptionModel",
    "advisor_estimates",
    "bucket_midpoint_pct",
    "hazard_from_monthly_pct",
    "kaplan_meier",
    "lifetime_models",
    "read_lifetimes",
    "read_preemption_table",
    "write_preemption_table",
]

#: Hours in an average month (8760 / 12), the Spot Advisor's "per month".
HOURS_PER_MONTH = 730.0

#: AWS instance family -> the catalogue GPU it carries. Families in the Spot Advisor
#: file without a catalogue GPU (g2/g3 GRID K520/M60, g4ad Radeon, g5g T4G on Arm,
#: g6e L40S, gr6, inf/trn/dl accelerators) are left out on purpose.
AWS_FAMILY_MODELS: dict[str, str] = {
    "p2": "K80",
    "p3": "V100-16GB",
    "p3dn": "V100-32GB",
    "g4dn": "T4",
    "g5": "A10",
    "g6": "L4",
    "p4d": "A100-40GB",
    "p4de": "A100-80GB",
    "p5": "H100-80GB",
    "p5e": "H200-141GB",
    "p5en": "H200-141GB",
}


@runtime_checkable
class PreemptionModel(Protocol):
    """A distribution of spot-node lifetimes."""

    @property
    def rate_per_hour(self) -> float:
        """Mean reclaim hazard per node-hour (1 / mean lifetime in hours)."""
        ...

    def sample_lifetime(self, rng: np.random.Generator) -> float | None:
        """Seconds until reclaim of a node started now; None = never reclaimed."""
        ...


# ------------------------------------------------------------------------ exponential
def hazard_from_monthly_pct(pct: float) -> float:
    """Hourly hazard of an exponential lifetime with ``pct`` % reclaimed per month."""
    if not 0.0 <= pct < 100.0:
        raise ValueError(f"monthly interruption share must be in [0, 100), got {pct}")
    return -math.log1p(-pct / 100.0) / HOURS_PER_MONTH


def bucket_midpoint_pct(label: str, upper_pct: float, open_bucket_upper_pct: float | None = None) -> float:
    """Midpoint (in %) of a Spot Advisor bucket such as ``"5-10%"``, ``"<5%"`` or ``">20%"``.

    The lower bound comes from the label; the upper from ``upper_pct`` (the file's
    ``interruption_upper_pct``), capped by ``open_bucket_upper_pct`` for ``>`` buckets.
    """
    s = label.strip()
    nums = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", s)]
    if s.startswith("<"):
        lo = 0.0
    elif nums:
        lo = nums[0]
    else:
        raise ValueError(f"cannot read bucket label {label!r}")
    hi = float(upper_pct)
    if s.startswith(">") and open_bucket_upper_pct is not None:
        hi = min(hi, open_bucket_upper_pct)
    return (lo + hi) / 2.0


@dataclass(frozen=True, slots=True)
class ExponentialPreemption:
    """Memoryless lifetimes with a constant hazard (0 = never reclaimed)."""

    hazard_per_hour: float

    @property
    def rate_per_hour(self) -> float:
        return self.hazard_per_hour

    def sample_lifetime(self, rng: np.random.Generator) -> float | None:
        if self.hazard_per_hour <= 0.0:
            return None
        return float(rng.exponential(3600.0 / self.hazard_per_hour))


@dataclass(frozen=True, slots=True)
class AdvisorEstimate:
    """Spot Advisor figures for one GPU model.

    Attributes:
        gpu_model: canonical catalogue name.
        hazard_per_hour: median hourly hazard over the rows used.
        savings_pct: median ``savings_vs_ondemand_pct`` over the same rows.
        rows: how many instance-type x region rows went into the medians.
        families: the AWS families used.
        snapshot: the advisor snapshot date used.
    """

    gpu_model: str
    hazard_per_hour: float
    savings_pct: float
    rows: int
    families: tuple[str, ...]
    snapshot: str

    def model(self) -> ExponentialPreemption:
        return ExponentialPreemption(self.hazard_per_hour)


def advisor_estimates(
    path: str | os.PathLike[str],
    region: str | None = None,
    open_bucket_upper_pct: float | None = None,
) -> dict[str, AdvisorEstimate]:
    """Per-GPU-model hazard and savings from the Spot Advisor GPU file.

    Args:
        path: ``aws_spot_advisor_gpu_interruption.csv``.
        region: only this AWS region's rows; None = median over all regions.
        open_bucket_upper_pct: cap on the ">20%" bucket's upper bound (None = the file's).

    Raises:
        MarketError: when the file lacks a needed column.
    """
    p = str(path)
    with open(p, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        need = ("snapshot", "region", "instance_type", "savings_vs_ondemand_pct", "interruption_label",
                "interruption_upper_pct")
        for c in need:
            if c not in (reader.fieldnames or []):
                raise MarketError(p, 1, c, "missing required column")
        rows = [r for r in reader if region is None or r["region"] == region]
    by_family: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_family.setdefault(r["instance_type"].split(".")[0], []).append(r)
    per_model: dict[str, list[tuple[str, dict[str, str]]]] = {}
    snapshots: dict[str, str] = {}
    for fam, frs in by_family.items():
        model = AWS_FAMILY_MODELS.get(fam)
        if model is None:
            continue
        latest = max(r["snapshot"] for r in frs)
        per_model.setdefault(model, []).extend((fam, r) for r in frs if r["snapshot"] == latest)
        snapshots[model] = max(snapshots.get(model, ""), latest)
    out: dict[str, AdvisorEstimate] = {}
    for model, items in per_model.items():
        hz = [hazard_from_monthly_pct(bucket_midpoint_pct(r["interruption_label"], float(r["interruption_upper_pct"]),
                                                          open_bucket_upper_pct)) for _, r in items]
        sv = [float(r["savings_vs_ondemand_pct"]) for _, r in items]
        out[model] = AdvisorEstimate(model, float(statistics.median(hz)), float(statistics.median(sv)), len(items),
                                     tuple(sorted({f for f, _ in items})), snapshots[model])
    return out


# ------------------------------------------------------------------------ Kaplan-Meier
@dataclass(frozen=True, slots=True)
class KaplanMeier:
    """A Kaplan-Meier survival curve.

    Attributes:
        times: distinct event (reclaim) times, increasing, seconds.
        survival: ``S(t)`` just after each event time.
        t_max: the largest observed time, event or censored.
        n: number of observations.
    """

    times: npt.NDArray[np.float64]
    survival: npt.NDArray[np.float64]
    t_max: float
    n: int

    @property
    def end_survival(self) -> float:
        """``S(t_max)``: the share still alive at the end of observation."""
        return float(self.survival[-1]) if self.survival.size else 1.0


def kaplan_meier(durations: Sequence[float] | npt.ArrayLike, observed: Sequence[bool] | npt.ArrayLike) -> KaplanMeier:
    """Kaplan-Meier estimate from lifetimes and event flags (False = right-censored).

    At tied times, events are counted before censorings (the usual convention: a
    unit censored at ``t`` was still at risk at ``t``).
    """
    d = np.asarray(durations, dtype=np.float64)
    e = np.asarray(observed, dtype=bool)
    if d.size == 0 or d.size != e.size:
        raise ValueError("need equally many durations and event flags, at least one")
    if np.any(d < 0) or not np.all(np.isfinite(d)):
        raise ValueError("durations must be finite and >= 0")
    event_times = np.unique(d[e])
    surv = np.empty(event_times.size)
    s = 1.0
    for i, t in enumerate(event_times):
        at_risk = int(np.count_nonzero(d >= t))
        deaths = int(np.count_nonzero((d == t) & e))
        s *= 1.0 - deaths / at_risk
        surv[i] = s
    return KaplanMeier(event_times, surv, float(d.max()), int(d.size))


@dataclass(frozen=True, slots=True)
class KaplanMeierPreemption:
    """Lifetimes drawn from a Kaplan-Meier curve with an exponential tail."""

    km: KaplanMeier

    @property
    def tail_rate_per_s(self) -> float:
        """Hazard of the tail beyond ``t_max``: the average hazard over the observed range."""
        s_end = self.km.end_survival
        if s_end <= 0.0:
            return math.inf
        if s_end >= 1.0 or self.km.t_max <= 0.0:
            return 0.0
        return -math.log(s_end) / self.km.t_max

    @property
    def mean_lifetime_s(self) -> float:
        """Restricted mean up to ``t_max`` plus the tail's expected contribution."""
        km = self.km
        edges = np.concatenate(([0.0], km.times, [km.t_max]))
        levels = np.concatenate(([1.0], km.survival))
        widths = np.clip(np.diff(edges), 0.0, None)
        mean = float(np.sum(levels * widths))
        rate = self.tail_rate_per_s
        if km.end_survival > 0.0:
            mean += km.end_survival / rate if rate > 0 else math.inf
        return mean

    @property
    def rate_per_hour(self) -> float:
        m = self.mean_lifetime_s
        return 0.0 if not math.isfinite(m) or m <= 0 else 3600.0 / m

    def sample_lifetime(self, rng: np.random.Generator) -> float | None:
        """Inverse transform: the first event time where ``S`` falls to ``u`` or below."""
        u = float(rng.random())
        km = self.km
        # survival is non-increasing; find first index with survival <= u.
        idx = int(np.searchsorted(-km.survival, -u, side="left"))
        if idx < km.times.size:
            return float(km.times[idx])
        rate = self.tail_rate_per_s
        if rate <= 0.0:
            return None
        # Memoryless tail conditioned on surviving past t_max.
        return km.t_max + float(rng.exponential(1.0 / rate))


def _lifetime_model_name(raw: str) -> str | None:
    return resolve_model_name(re.sub(r"^nvidia-tesla-", "", raw.strip().lower()))


def read_lifetimes(
    path: str | os.PathLike[str], gpu_model: str | None = None, provider: str | None = None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Lifetimes (seconds) and event flags from ``spot_instance_lifetimes_2020.csv``.

    ``end_reason`` containing ``censored`` marks a right-censored row. Filters by
    canonical GPU model and provider (``aws``/``gcp``) when given.
    """
    p = str(path)
    want = None if gpu_model is None else resolve_model_name(gpu_model)
    durs: list[float] = []
    events: list[bool] = []
    with open(p, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        for c in ("gpu_type", "end_reason", "lifetime_hours"):
            if c not in (reader.fieldnames or []):
                raise MarketError(p, 1, c, "missing required column")
        for r in reader:
            if provider is not None and r.get("provider", "") != provider:
                continue
            if want is not None and _lifetime_model_name(r["gpu_type"]) != want:
                continue
            try:
                hours = float(r["lifetime_hours"])
            except ValueError:
                raise MarketError(p, reader.line_num, "lifetime_hours", f"not a number: {r['lifetime_hours']!r}") \
                    from None
            durs.append(hours * 3600.0)
            events.append("censored" not in r["end_reason"])
    return np.asarray(durs, dtype=np.float64), np.asarray(events, dtype=bool)


def lifetime_models(path: str | os.PathLike[str]) -> tuple[dict[str, KaplanMeierPreemption], KaplanMeierPreemption]:
    """Per-model KM models (models with >= 20 observations) and a pooled one."""
    durs, events = read_lifetimes(path)
    pooled = KaplanMeierPreemption(kaplan_meier(durs, events))
    models: dict[str, KaplanMeierPreemption] = {}
    p = str(path)
    with open(p, newline="", encoding="utf-8") as fh:
        names = {_lifetime_model_name(r["gpu_type"]) for r in csv.DictReader(fh)}
    for name in sorted(n for n in names if n):
        d, e = read_lifetimes(path, gpu_model=name)
        if d.size >= 20:
            models[name] = KaplanMeierPreemption(kaplan_meier(d, e))
    return models, pooled


# ------------------------------------------------------------------------ bundled table
#: Columns of the compact preemption table bundled with the package.
PREEMPTION_COLUMNS = ("kind", "gpu_model", "time_s", "survival", "rate_per_hour", "source")


def write_preemption_table(
    path: str | os.PathLike[str],
    hazards: dict[str, tuple[float, str]],
    km_models: dict[str, KaplanMeierPreemption],
) -> None:
    """Write hazards (``kind=hazard``) and KM curves (``kind=km``; gpu_model ``*`` = pooled).

    A KM curve is written as its event rows plus one ``kind=km_end`` row holding
    ``t_max`` and the number of observations (in ``rate_per_hour``'s place: see README).
    """
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(PREEMPTION_COLUMNS)
        for model, (rate, source) in sorted(hazards.items()):
            w.writerow(["hazard", model, "", "", f"{rate:.8g}", source])
        for model, km in sorted(km_models.items()):
            for t, s in zip(km.km.times.tolist(), km.km.survival.tolist(), strict=True):
                w.writerow(["km", model, f"{t:.6g}", f"{s:.6g}", "", ""])
            w.writerow(["km_end", model, f"{km.km.t_max:.6g}", f"{km.km.end_survival:.6g}", km.km.n,
                        "spot_instance_lifetimes_2020.csv"])


def read_preemption_table(
    path: str | os.PathLike[str],
) -> tuple[dict[str, ExponentialPreemption], dict[str, KaplanMeierPreemption]]:
    """Read the table :func:`write_preemption_table` writes.

    Returns:
        ``(hazard models per GPU model, KM models per GPU model or "*")``.
    """
    p = str(path)
    hazards: dict[str, ExponentialPreemption] = {}
    pts: dict[str, list[tuple[float, float]]] = {}
    ends: dict[str, tuple[float, int]] = {}
    with open(p, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        for r in reader:
            try:
                if r["kind"] == "hazard":
                    hazards[r["gpu_model"]] = ExponentialPreemption(float(r["rate_per_hour"]))
                elif r["kind"] == "km":
                    pts.setdefault(r["gpu_model"], []).append((float(r["time_s"]), float(r["survival"])))
                elif r["kind"] == "km_end":
                    ends[r["gpu_model"]] = (float(r["time_s"]), int(float(r["rate_per_hour"])))
                else:
                    raise MarketError(p, reader.line_num, "kind", f"unknown kind {r['kind']!r}")
            except (KeyError, ValueError) as exc:
                raise MarketError(p, reader.line_num, None, f"bad preemption row: {exc}") from None
    kms: dict[str, KaplanMeierPreemption] = {}
    for model, (t_max, n) in ends.items():
        rows = sorted(pts.get(model, []))
        kms[model] = KaplanMeierPreemption(KaplanMeier(
            np.array([t for t, _ in rows], dtype=np.float64), np.array([s for _, s in rows], dtype=np.float64),
            t_max, n))
    return hazards, kms
