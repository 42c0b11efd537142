"""Preemption models: Kaplan-Meier, hazard conversion, seeded sampling."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rlsched.market.preemption import (
    ExponentialPreemption,
    KaplanMeierPreemption,
    advisor_estimates,
    bucket_midpoint_pct,
    hazard_from_monthly_pct,
    kaplan_meier,
    read_lifetimes,
)


def test_kaplan_meier_known_answer() -> None:
    # Classic textbook sample: 1, 2+, 3, 4+, 5 (+ = censored).
    km = kaplan_meier([1, 2, 3, 4, 5], [True, False, True, False, True])
    np.testing.assert_allclose(km.times, [1, 3, 5])
    # S(1) = 4/5; S(3) = 4/5 * (1 - 1/3) = 8/15; S(5) = 0.
    np.testing.assert_allclose(km.survival, [0.8, 8 / 15, 0.0])
    assert km.t_max == 5


def test_kaplan_meier_censoring_not_counted_as_event() -> None:
    km = kaplan_meier([10, 10, 20], [True, False, False])
    # Ties: the censored unit at 10 is still at risk at 10 -> S = 1 - 1/3.
    np.testing.assert_allclose(km.survival, [2 / 3])
    assert km.end_survival == pytest.approx(2 / 3)


def test_km_sampling_inverse_transform_and_tail() -> None:
    km = kaplan_meier([3600.0, 7200.0, 10800.0, 14400.0], [True, True, False, False])
    model = KaplanMeierPreemption(km)
    rng = np.random.default_rng(0)
    draws = np.array([model.sample_lifetime(rng) for _ in range(20000)], dtype=float)
    # P(L = 3600) = 1/4, P(L = 7200) = 1/4, rest goes to the tail beyond t_max = 14400.
    assert np.mean(draws == 3600.0) == pytest.approx(0.25, abs=0.02)
    assert np.mean(draws == 7200.0) == pytest.approx(0.25, abs=0.02)
    assert np.all(draws[draws > 7200.0] > 14400.0)
    tail_rate = -math.log(0.5) / 14400.0
    assert model.tail_rate_per_s == pytest.approx(tail_rate)
    assert np.mean(draws) == pytest.approx(model.mean_lifetime_s, rel=0.05)
    assert model.rate_per_hour == pytest.approx(3600.0 / model.mean_lifetime_s)


def test_hazard_conversion() -> None:
    assert hazard_from_monthly_pct(0.0) == 0.0
    # 50% per month -> ln 2 / 730 per hour.
    assert hazard_from_monthly_pct(50.0) == pytest.approx(math.log(2) / 730.0)
    assert bucket_midpoint_pct("5-10%", 11) == pytest.approx(8.0)
    assert bucket_midpoint_pct("<5%", 5) == pytest.approx(2.5)
    assert bucket_midpoint_pct(">20%", 100) == pytest.approx(60.0)
    assert bucket_midpoint_pct(">20%", 100, open_bucket_upper_pct=30) == pytest.approx(25.0)
    with pytest.raises(ValueError):
        hazard_from_monthly_pct(100.0)


def test_exponential_sampling_deterministic_and_mean() -> None:
    m = ExponentialPreemption(0.05)
    a = [m.sample_lifetime(np.random.default_rng(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    rng = np.random.default_rng(1)
    draws = np.array([m.sample_lifetime(rng) for _ in range(40000)], dtype=float)
    assert draws.mean() / 3600.0 == pytest.approx(1 / 0.05, rel=0.03)
    assert ExponentialPreemption(0.0).sample_lifetime(rng) is None


def test_advisor_estimates_on_slice(data_dir: Path) -> None:
    est = advisor_estimates(data_dir / "spot_advisor_slice.csv")
    assert {"K80", "V100-16GB", "T4", "A10", "L4", "A100-40GB", "H100-80GB"} <= set(est)
    # p2/p3 are all in the ">20%" bucket: midpoint 60% per month.
    assert est["V100-16GB"].hazard_per_hour == pytest.approx(hazard_from_monthly_pct(60.0))
    assert est["V100-16GB"].families == ("p3",)
    only = advisor_estimates(data_dir / "spot_advisor_slice.csv", region="us-east-1")
    assert all(e.rows <= est[m].rows for m, e in only.items())


def test_lifetimes_reader(data_dir: Path) -> None:
    d, e = read_lifetimes(data_dir / "lifetimes_slice.csv")
    assert d.size == e.size > 100
    assert (~e).sum() >= 10  # every censored row was kept
    dk, _ = read_lifetimes(data_dir / "lifetimes_slice.csv", gpu_model="K80")
    assert 0 < dk.size < d.size
    km = KaplanMeierPreemption(kaplan_meier(d, e))
    assert 0 < km.rate_per_hour < 10
