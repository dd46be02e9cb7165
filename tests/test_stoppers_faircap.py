"""Fair-cap solvers against independent numerical integration (scipy quad, mpmath)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import integrate, optimize, stats

from stoppers import (
    acceptance_rate,
    bt_expected_excess,
    bt_fair_cap,
    exponential_fair_cap,
    fair_cap,
)
from stoppers.adaptive_math import utility_excess
from stoppers.elementwise import scaled_exp_integrals
from stoppers.faircap import bt_expected_excess_normalized, bt_fair_cap_normalized


def _quad_excess(t: float, b: float, k: float) -> float:
    """E[(min(2X/(X+k), 1) - t)+], X = 1 + b Exp(1), by adaptive quadrature in s = (X - 1)/b."""
    if t >= 1:
        return 0.0
    x_t = t * k / (2 - t)
    s_lo = max((x_t - 1) / b, 0.0)
    s_hi = max((k - 1) / b, s_lo)

    def band(s: float) -> float:
        x = 1 + b * s
        return (2 * x / (x + k) - t) * math.exp(-s)

    total = 0.0
    if s_hi > s_lo:
        end = min(s_hi, s_lo + 80.0)  # e^-80 of the mass lies beyond
        total += integrate.quad(band, s_lo, end, epsabs=0, epsrel=1e-13, limit=500)[0]
    total += (1 - t) * math.exp(-s_hi)
    return total


def _quad_fair_cap(c: float, b: float, k: float) -> float:
    mean = _quad_excess(0.0, b, k)
    if mean <= c:
        return mean - c
    return optimize.brentq(lambda t: _quad_excess(t, b, k) - c, 0.0, 1.0, xtol=1e-16, rtol=1e-15)


COSTS = [1e-5, 1e-3, 0.03, 0.3]
SCALES = [1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0]  # tail scale / shift: six orders of magnitude
BENCHMARKS = [1e-3, 0.5, 1.0, 2.0, 1e3]  # e^kappa / shift: far below to far above the shift


@pytest.mark.parametrize("cost", COSTS)
def test_fair_cap_matches_quadrature_on_grid(cost: float) -> None:
    worst = 0.0
    for b in SCALES:
        for k in BENCHMARKS:
            got = bt_fair_cap_normalized(cost, b, k)
            want = _quad_fair_cap(cost, b, k)
            rel = abs(got - want) / max(abs(want), 1e-300)
            worst = max(worst, rel)
            assert rel <= 1e-9, (cost, b, k, got, want)
            # the defining equation E[(U - tau)+] = c holds at the returned tau
            assert bt_expected_excess_normalized(got, b, k) == pytest.approx(cost, rel=1e-8)
    assert worst < 1e-9


@pytest.mark.parametrize(
    ("t", "b", "k"),
    [
        (0.3, 1e-4, 1.0),
        (0.95, 0.05, 3.0),
        (-0.5, 100.0, 1e3),
        (0.999999, 1.0, 2.0),
        (0.2, 1e-3, 1e-3),
    ],
)
def test_expected_excess_matches_mpmath(t: float, b: float, k: float) -> None:
    mpmath.mp.dps = 30
    mt, mb, mk = mpmath.mpf(t), mpmath.mpf(b), mpmath.mpf(k)

    def integrand(s):
        x = 1 + mb * s
        return max(min(2 * x / (x + mk), 1) - mt, 0) * mpmath.exp(-s)

    x_t = mt * mk / (2 - mt)
    s_lo = max((x_t - 1) / mb, 0)
    s_hi = max((mk - 1) / mb, s_lo)
    pts = sorted({mpmath.mpf(0), s_lo, s_hi, s_lo + 1, s_lo + 10, s_lo + 100, mpmath.inf})
    want = mpmath.quad(integrand, pts)
    got = bt_expected_excess_normalized(t, b, k)
    assert abs(got - want) <= 1e-11 * abs(want)


def test_scaled_exponential_integrals_match_mpmath() -> None:
    mpmath.mp.dps = 40
    for q in [1e-8, 0.3, 1.0, 7.5, 63.9, 64.1, 500.0, 1e5, 1e12]:
        g, h = scaled_exp_integrals(q)
        e = mpmath.exp(q)
        assert abs(g - e * mpmath.expint(1, q)) <= 1e-13 * g
        assert abs(h - e * mpmath.expint(2, q)) <= 1e-13 * h
        ga, ha = scaled_exp_integrals(np.array([q]))
        assert ga[0] == pytest.approx(g, rel=1e-15) and ha[0] == pytest.approx(h, rel=1e-15)


def test_excess_decreasing_and_array_equals_scalar() -> None:
    rng = np.random.default_rng(3)
    b = 10 ** rng.uniform(-5, 3, 400)
    k = 10 ** rng.uniform(-3, 3, 400)
    t = rng.uniform(-1, 1.2, 400)
    arr = bt_expected_excess_normalized(t, b, k)
    loop = np.array([bt_expected_excess_normalized(*v) for v in zip(t, b, k, strict=True)])
    np.testing.assert_allclose(arr, loop, rtol=1e-13, atol=0)
    grid = np.linspace(-0.5, 1.0, 301)
    for bb, kk in [(0.01, 1.0), (1.0, 5.0), (50.0, 0.1)]:
        e = bt_expected_excess_normalized(grid, np.full_like(grid, bb), np.full_like(grid, kk))
        assert np.all(np.diff(e) <= 1e-15) and e[-1] == 0.0


def test_uncapped_bradley_terry_utility_matches_quadrature() -> None:
    for t, b, k in [(0.2, 0.5, 3.0), (0.6, 5.0, 2.0), (0.45, 1e-3, 1.0)]:
        want = integrate.quad(
            lambda s, b=b, k=k, t=t: max((1 + b * s) / (1 + b * s + k) - t, 0) * math.exp(-s),
            0,
            np.inf,
            epsabs=0,
            epsrel=1e-12,
            limit=400,
        )[0]
        assert utility_excess(t, b, k, "bradley_terry") == pytest.approx(want, rel=1e-9)


def test_unnormalised_wrappers_rescale_by_the_shift() -> None:
    e1 = bt_expected_excess(0.4, shift=1.0, scale=0.3, benchmark=2.0)
    e2 = bt_expected_excess(0.4, shift=1e-20, scale=0.3e-20, benchmark=2e-20)
    assert e1 == pytest.approx(e2, rel=1e-14)
    assert bt_fair_cap(0.01, shift=5.0, scale=2.5, benchmark=15.0) == pytest.approx(
        bt_fair_cap(0.01, shift=1.0, scale=0.5, benchmark=3.0), rel=1e-14
    )
    with pytest.raises(ValueError, match="cost"):
        bt_fair_cap(0.0, shift=1.0, scale=1.0, benchmark=1.0)


def test_acceptance_rate_definition() -> None:
    assert acceptance_rate(0.0, 0.0) == 1.0  # 2 e^0 / (e^0 + e^0) = 1
    assert acceptance_rate(-math.log(3.0), 0.0) == pytest.approx(0.5)  # 2 (1/3) / (4/3)
    assert acceptance_rate(5.0, 0.0) == 1.0
    assert acceptance_rate(-800.0, 0.0) == 0.0  # no overflow
    v = np.linspace(-50, 50, 11)
    np.testing.assert_allclose(
        acceptance_rate(v, 1.0), np.minimum(2 / (1 + np.exp(1.0 - v)), 1.0), rtol=1e-15
    )


def test_exponential_fair_cap_is_the_lemma() -> None:
    for lam, c in [(1.0, 0.01), (0.2, 0.05), (3.0, 1e-4)]:
        tau = exponential_fair_cap(lam, c)
        assert tau == pytest.approx(math.log(1 / (lam * c)) / lam)
        assert math.exp(-lam * tau) / lam == pytest.approx(c)  # E[(V - tau)+] = e^-lam tau / lam
        assert fair_cap(stats.expon(scale=1 / lam), c) == pytest.approx(tau, rel=1e-9)


def test_empirical_fair_cap_is_exact() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = rng.normal(size=rng.integers(1, 50)).round(1)  # ties included
        c = float(rng.uniform(1e-3, 0.5))
        tau = fair_cap(v, c)
        assert np.mean(np.maximum(v - tau, 0.0)) == pytest.approx(c, rel=1e-12, abs=1e-15)


def test_fair_cap_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="cost"):
        fair_cap(stats.norm(), -1.0)
    with pytest.raises(ValueError, match="distribution"):
        fair_cap(np.array([1.0, np.nan]), 0.1)
    with pytest.raises(ValueError, match="distribution"):
        fair_cap([], 0.1)
