"""Sampling tests: each arrival process and length model against its analytic mean and variance.

Tolerances are stated per test; each is checked on three seeds.
"""
import math

import numpy as np
import pytest
from scipy import stats

from workloads.arrivals import (Batch, ClosedLoop, Diurnal, GammaRenewal, MMPP2, Piecewise, Poisson,
                                WeibullRenewal, parse_arrival)
from workloads.lengths import parse_length, sample_pair

SEEDS = [0, 1, 2]


def _gaps(proc, seed, duration):
    t = proc.sample(np.random.default_rng(seed), duration)
    assert np.all(np.diff(t) >= 0) and t.min() >= 0 and t.max() < duration
    return t, np.diff(t)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("proc", [Poisson(5.0), GammaRenewal(5.0, 2.0), GammaRenewal(5.0, 0.5),
                                  WeibullRenewal(5.0, 0.7), WeibullRenewal(5.0, 2.0)],
                         ids=["poisson", "gamma-cv2", "gamma-cv0.5", "weibull-0.7", "weibull-2"])
def test_renewal_gap_mean_and_variance(proc, seed):
    """Renewal: mean gap 1/rate within 3 %, gap variance within 10 % (~50,000 gaps)."""
    _, g = _gaps(proc, seed, 10_000.0)
    assert g.mean() == pytest.approx(1 / proc.mean_rate, rel=0.03)
    assert g.var() == pytest.approx(proc.gap_var, rel=0.10)


def test_cv_properties_are_analytic():
    assert Poisson(2).cv == 1.0
    assert GammaRenewal(3, 2.5).cv == 2.5
    assert WeibullRenewal(1, 1.0).cv == pytest.approx(1.0)  # Weibull shape 1 is exponential
    assert WeibullRenewal(1, 0.5).cv == pytest.approx(math.sqrt(5))  # Gamma(5)/Gamma(3)^2 - 1 = 5
    # MMPP-2 with equal rates is Poisson
    assert MMPP2(rate_on=3, rate_off=3, mean_on_s=1, mean_off_s=2).cv == pytest.approx(1.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_mmpp2_rate_and_cv(seed):
    """MMPP-2: long-run rate within 5 %, stationary inter-arrival CV within 10 % (20,000 s)."""
    p = MMPP2(rate_on=10.0, rate_off=1.0, mean_on_s=5.0, mean_off_s=20.0)
    assert p.mean_rate == pytest.approx((10 * 5 + 1 * 20) / 25)
    t, g = _gaps(p, seed, 20_000.0)
    assert t.size / 20_000 == pytest.approx(p.mean_rate, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(p.cv, rel=0.10)


@pytest.mark.parametrize("seed", SEEDS)
def test_piecewise_counts_per_segment(seed):
    """Piecewise: count in each segment within 4 Poisson sigmas of rate x length."""
    p = Piecewise(times=(0, 100, 300), rates=(2.0, 10.0, 0.5), period_s=400.0)
    t = p.sample(np.random.default_rng(seed), 800.0)
    for lo, hi, r in [(0, 100, 2.0), (100, 300, 10.0), (300, 400, 0.5), (500, 700, 10.0)]:
        n = ((t >= lo) & (t < hi)).sum()
        mu = r * (hi - lo)
        assert abs(n - mu) < 4 * math.sqrt(mu) + 1
    assert p.mean_rate == pytest.approx((200 + 2000 + 50) / 400)
    assert p.expected_count(800.0) == pytest.approx(2 * 2250, rel=1e-3)


@pytest.mark.parametrize("seed", SEEDS)
def test_diurnal_count_and_shape(seed):
    """Diurnal: total within 4 sigma of the integral; peak half busier than trough half."""
    d = Diurnal(rate=5.0, amplitude=0.8, period_s=1000.0, phase=-math.pi / 2)
    t = d.sample(np.random.default_rng(seed), 3000.0)
    mu = d.expected_count(3000.0)
    assert mu == pytest.approx(15_000)
    assert abs(t.size - mu) < 4 * math.sqrt(mu)
    phase = np.mod(t, 1000.0)
    peak = ((phase > 250) & (phase < 750)).sum()
    assert peak / t.size == pytest.approx(0.5 + 0.8 * 2 / math.pi / 2, abs=0.02)


def test_batch_is_exact():
    b = Batch(n=10, at_s=5.0, spread_s=2.0)
    t = b.sample(np.random.default_rng(0), 100.0)
    assert np.allclose(t, 5.0 + 0.2 * np.arange(10))
    assert b.mean_rate == 5.0 and b.cv == 0.0
    assert Batch(n=3, at_s=1.0).sample(None, 10.0).tolist() == [1.0, 1.0, 1.0]
    assert b.scaled(1.5).n == 15


def test_scaled_multiplies_rates():
    assert Poisson(2).scaled(3).mean_rate == 6
    assert MMPP2(rate_on=4, rate_off=0, mean_on_s=1, mean_off_s=1).scaled(2).mean_rate == pytest.approx(4.0)
    c = ClosedLoop(users=4, think={"dist": "exponential", "mean": 10}).scaled(2)
    assert c.think.mean == 5 and c.users == 4


LENGTH_CASES = [
    ({"dist": "constant", "value": 100}, 100.0, 0.0),
    ({"dist": "uniform", "low": 10, "high": 20}, 15.0, (11 ** 2 - 1) / 12),
    ({"dist": "exponential", "mean": 200, "min": 0}, 200.0, 200.0 ** 2),
    ({"dist": "lognormal", "median": 500, "sigma": 0.5}, 500 * math.exp(0.125),
     (math.exp(0.25) - 1) * 500 ** 2 * math.exp(0.25)),
    ({"dist": "zipf", "a": 1.5, "n": 1000}, None, None),
    ({"dist": "empirical", "values": [10, 100, 1000], "probs": [0.5, 0.3, 0.2]}, 235.0,
     0.5 * 10 ** 2 + 0.3 * 100 ** 2 + 0.2 * 1000 ** 2 - 235.0 ** 2),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("spec,mean,var", LENGTH_CASES, ids=[c[0]["dist"] for c in LENGTH_CASES])
def test_length_model_mean_and_variance(spec, mean, var, seed):
    """200,000 draws: mean within 1.5 %, variance within 5 % (rounding adds <= 1/12)."""
    m = parse_length(spec)
    if spec["dist"] == "zipf":
        k = np.arange(1, 1001.0)
        p = k ** -1.5 / (k ** -1.5).sum()
        mean, var = float((k * p).sum()), float((k * k * p).sum() - (k * p).sum() ** 2)
    assert m.mean == pytest.approx(mean, rel=1e-9)
    x = m.sample(np.random.default_rng(seed), 200_000)
    assert x.dtype == np.int64
    assert x.mean() == pytest.approx(mean, rel=0.015, abs=0.01)
    assert x.var() == pytest.approx(var, rel=0.05, abs=0.1)
    assert m.var == pytest.approx(var, rel=1e-3, abs=0.1)


def test_length_clipping_and_bare_integer():
    m = parse_length({"dist": "exponential", "mean": 100, "min": 5, "max": 50})
    x = m.sample(np.random.default_rng(0), 10_000)
    assert x.min() == 5 and x.max() == 50
    assert m.upper_bound() == 50
    c = parse_length(7)
    assert c.sample(np.random.default_rng(0), 3).tolist() == [7, 7, 7]
    # default upper bound: the 99.99th percentile rounded up
    e = parse_length({"dist": "exponential", "mean": 100})
    assert e.upper_bound() == math.ceil(round(-100 * math.log(1e-4)))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rho", [0.5, -0.3])
def test_gaussian_copula_correlation(rho, seed):
    """Spearman rank correlation of a Gaussian copula is (6/pi) asin(rho/2), within 0.02."""
    p = parse_length({"dist": "lognormal", "median": 1000, "sigma": 1.0})
    o = parse_length({"dist": "lognormal", "median": 200, "sigma": 0.7})
    a, b = sample_pair(np.random.default_rng(seed), 50_000, p, o, rho)
    got = stats.spearmanr(a, b).statistic
    assert got == pytest.approx(6 / math.pi * math.asin(rho / 2), abs=0.02)
    assert a.mean() == pytest.approx(p.mean, rel=0.03)


def test_registered_process_through_parse():
    p = parse_arrival({"process": "onoff", "rate_on": 4, "mean_on_s": 1, "mean_off_s": 3})
    assert p.mean_rate == pytest.approx(1.0)
    g = parse_arrival({"process": "gamma", "rate": 2, "cv": 3})
    assert g.gap_var == pytest.approx(9 / 4)
