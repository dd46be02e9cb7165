"""Fair-cap values (the paper's Definition "Fair-cap value": E[(V - tau)+] = c) and acceptance.

Three solvers:

* :func:`bt_fair_cap` — the one the adaptive policies need: V = u_kappa(log X) for X a shifted
  exponential (shift theta, mean excess ``scale``) pushed through the Bradley–Terry acceptance
  utility u_kappa(v) = min(2 e^v / (e^v + e^kappa), 1) (Definitions "Acceptance Rate" and
  "Utility Function", B = 1). E[(U - t)+] has a closed form in exponential integrals (derived in
  :func:`bt_expected_excess_normalized`); tau is found with a bracketing root finder. This replaces
  the paper's Riemann sum over ~5,000 intervals (Section 4.2, "Implementation Efficiency").
* :func:`fair_cap` — any scipy.stats frozen distribution (numerical integration of the survival
  function) or an array of samples taken as the empirical distribution (exact: piecewise linear).
* :func:`exponential_fair_cap` — Lemma "Fair-cap value for Exponential distribution":
  tau = log(1 / (lambda c)) / lambda.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import integrate, optimize

from stoppers import elementwise as ew

__all__ = [
    "acceptance_rate",
    "bt_expected_excess",
    "bt_expected_excess_normalized",
    "bt_fair_cap",
    "bt_fair_cap_normalized",
    "exponential_fair_cap",
    "fair_cap",
]

_TINY = 1e-300
# 5-point Gauss–Legendre nodes/weights on [-1, 1]; used on excess intervals much shorter than the
# tail scale, where the closed form is a difference of two nearly equal terms (cancellation).
_GL_X = (
    -0.9061798459386640,
    -0.5384693101056831,
    0.0,
    0.5384693101056831,
    0.9061798459386640,
)
_GL_W = (
    0.2369268850561891,
    0.4786286704993665,
    0.5688888888888889,
    0.4786286704993665,
    0.2369268850561891,
)
_SHORT_INTERVAL = 0.02
_NO_CAP = 1e300


def acceptance_rate(v: Any, kappa: Any) -> Any:
    """AR_kappa(v) = min(2 e^v / (e^v + e^kappa), 1) (Definition "Acceptance Rate").

    Written as 2 / (1 + e^(kappa - v)) so that it never overflows; floats or numpy arrays.
    """
    with ew.quiet(v, kappa):
        return ew.minimum(2.0 / (1.0 + ew.exp(kappa - v)), 1.0)


def bt_expected_excess_normalized(t: Any, b: Any, k: Any, capped: bool = True) -> Any:
    """E[(U - t)+] for U = min(2X / (X + k), 1), X = 1 + b * Exp(1) (shift normalised to 1).

    ``capped=False`` drops the cap: U = 2X / (X + k) in [0, 2) (then hi = inf below); the
    authors' code's utility X / (X + k) is half of that (see :func:`bt_utility_excess`).

    Derivation. u(x) >= t  <=>  x >= x_t = t k / (2 - t), and u(x) = 1 for x >= k. With
    lo = max(x_t, 1) and hi = max(k, lo), on [lo, hi] the integrand is
    u(x) - t = (2 - t)(x - x_t) / (x + k). Substituting x = lo + b s (density S(lo) e^-s ds,
    S(lo) = e^-(lo - 1)/b), with p = (lo - x_t)/b, q = (lo + k)/b, w = (hi - lo)/b:

        E = S(lo) [ (2 - t) (J(p, q) - e^-w J(p + w, q + w)) + (1 - t) e^-w ],
        J(p, q) = int_0^inf (p + s)/(q + s) e^-s ds = e^q E_2(q) + p e^q E_1(q),

    all positive terms apart from the J difference, which is replaced by 5-point Gauss–Legendre
    on [0, w] when w is short (w < 0.02 and w < 0.02 q: the difference would cancel, and the
    integrand's pole at s = -q is far away). b <= 0 is the degenerate (point-mass) limit.
    Floats or broadcastable numpy arrays.
    """
    if isinstance(t, np.ndarray) or isinstance(b, np.ndarray) or isinstance(k, np.ndarray):
        return excess_in(ew.ARRAY, t, b, k, capped)
    return excess_in(ew.SCALAR, t, b, k, capped)


def excess_in(xp: Any, t: Any, b: Any, k: Any, capped: bool = True) -> Any:
    """:func:`bt_expected_excess_normalized` in a namespace the caller already picked
    (:mod:`stoppers.elementwise`), so a kernel that knows its inputs dispatches only once."""
    if xp.is_array:
        with np.errstate(all="ignore"):
            return _excess_array(
                np.asarray(t, float), np.asarray(b, float), np.asarray(k, float), capped
            )
    top = 1.0 if capped else 2.0
    if t >= top:
        return 0.0
    if b <= 0.0:
        return _point_mass(xp, t, k, top)
    p, q, w, scale = _band_geometry(xp, t, b, k, capped)
    band = _band_short(xp, p, q, w) if _is_short(q, w) else _band_closed(xp, p, q, w)
    return _combine(xp, t, w, scale, band)


def _excess_array(t: np.ndarray, b: np.ndarray, k: np.ndarray, capped: bool) -> np.ndarray:
    xp = ew.ARRAY
    top = 1.0 if capped else 2.0
    t_in = np.where(t < top, t, 0.5)  # keeps the discarded branches finite
    bs = np.maximum(b, _TINY)
    p, q, w, scale = _band_geometry(xp, t_in, bs, k, capped)
    band = np.where(_is_short(q, w), _band_short(xp, p, q, w), _band_closed(xp, p, q, w))
    out = np.where(b <= 0.0, _point_mass(xp, t, k, top), _combine(xp, t_in, w, scale, band))
    return np.where(t >= top, 0.0, out)


def _band_geometry(xp: Any, t: Any, b: Any, k: Any, capped: bool) -> tuple[Any, Any, Any, Any]:
    x_t = t * k / (2.0 - t)
    lo = xp.maximum(x_t, 1.0)
    if capped:
        w = (xp.maximum(k, lo) - lo) / b
    else:  # no cap: the band runs to infinity (finite stand-in keeps e^-w (p + w) g at 0)
        w = np.full_like(lo, _NO_CAP) if xp.is_array else _NO_CAP
    return (lo - x_t) / b, (lo + k) / b, w, xp.exp(-(lo - 1.0) / b)


def _is_short(q: Any, w: Any) -> Any:
    return (w < _SHORT_INTERVAL) & (w < _SHORT_INTERVAL * q)


def _band_closed(xp: Any, p: Any, q: Any, w: Any) -> Any:
    g0, h0 = xp.scaled_exp_integrals(q)
    g1, h1 = xp.scaled_exp_integrals(q + w)
    return h0 + p * g0 - xp.exp(-w) * (h1 + (p + w) * g1)


def _band_short(xp: Any, p: Any, q: Any, w: Any) -> Any:
    half = 0.5 * w
    total = 0.0
    for node, weight in zip(_GL_X, _GL_W, strict=True):
        s = half * (node + 1.0)
        total = total + weight * (p + s) / (q + s) * xp.exp(-s)
    return total * half


def _combine(xp: Any, t: Any, w: Any, scale: Any, band: Any) -> Any:
    return scale * ((2.0 - t) * band + (1.0 - t) * xp.exp(-w))


def _point_mass(xp: Any, t: Any, k: Any, top: float) -> Any:
    return xp.maximum(xp.minimum(2.0 / (1.0 + k), top) - t, 0.0)


def bt_expected_excess(t: Any, *, shift: Any, scale: Any, benchmark: Any) -> Any:
    """E[(U - t)+] for U = u_kappa(log X), X = shift + Exp(mean=scale), benchmark = e^kappa.

    The utility depends on X / e^kappa only, so everything is rescaled by ``shift`` first.
    """
    return bt_expected_excess_normalized(t, scale / shift, benchmark / shift)


def bt_fair_cap_normalized(cost: float, b: float, k: float) -> float:
    """Fair cap tau of U = min(2X/(X + k), 1), X = 1 + b Exp(1): E[(U - tau)+] = cost.

    E[(U - t)+] is continuous and decreasing in t, 0 at t = 1. When E[U] <= cost the root is
    at t <= 0 where E[(U - t)+] = E[U] - t exactly, so tau = E[U] - cost in closed form;
    otherwise tau is in (0, 1) and Brent's method brackets it to ~machine precision.
    """
    mean_utility = float(bt_expected_excess_normalized(0.0, b, k))
    if mean_utility <= cost:
        return mean_utility - cost

    def gap(t: float) -> float:
        return float(bt_expected_excess_normalized(t, b, k)) - cost

    return optimize.brentq(gap, 0.0, 1.0, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=400)


def bt_fair_cap(cost: float, *, shift: float, scale: float, benchmark: float) -> float:
    """Fair cap (in utility units, B = 1) of the Bradley–Terry utility of a shifted exponential.

    >>> round(bt_fair_cap(0.01, shift=1.0, scale=0.5, benchmark=3.0), 6)
    0.819042
    """
    _check_cost(cost)
    if not (shift > 0 and scale >= 0 and benchmark > 0):
        raise ValueError(
            f"need shift > 0, scale >= 0, benchmark > 0; got {shift!r}, {scale!r}, {benchmark!r}"
        )
    return bt_fair_cap_normalized(cost, scale / shift, benchmark / shift)


def exponential_fair_cap(rate: float, cost: float) -> float:
    """tau(Exp(rate), c) = log(1 / (rate c)) / rate (Lemma "Fair-cap value for Exponential")."""
    _check_cost(cost)
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate!r}")
    return -math.log(rate * cost) / rate


def fair_cap(distribution: Any, cost: float) -> float:
    """tau(D, c) with E_{v~D}[(v - tau)+] = c (Definition "Fair-cap value").

    ``distribution`` is a scipy.stats frozen distribution (continuous) or a 1-d array of samples
    taken as the empirical distribution.
    """
    _check_cost(cost)
    if hasattr(distribution, "sf") and hasattr(distribution, "mean"):
        return _fair_cap_frozen(distribution, cost)
    samples = np.asarray(distribution, dtype=float)
    if samples.ndim != 1 or samples.size == 0 or not np.all(np.isfinite(samples)):
        raise ValueError("distribution must be a scipy frozen distribution or a 1-d finite array")
    return _fair_cap_empirical(samples, cost)


def _fair_cap_empirical(samples: np.ndarray, cost: float) -> float:
    """Exact: mean((v - tau)+) is piecewise linear; on the piece where the k largest samples
    exceed tau it equals (sum_top_k - k tau) / n, so tau = (sum_top_k - n c) / k."""
    v = np.sort(samples)[::-1]
    n = v.size
    top = np.cumsum(v)
    k = np.arange(1, n + 1)
    tau = (top - n * cost) / k
    # valid piece: v[k] <= tau <= v[k-1] (v[n] = -inf)
    below = np.append(v[1:], -np.inf)
    ok = (tau <= v) & (tau >= below)
    return float(tau[np.argmax(ok)])


def _fair_cap_frozen(dist: Any, cost: float) -> float:
    lower, upper = dist.support()
    mean = float(dist.mean())
    if not math.isfinite(mean):
        raise ValueError("the distribution needs a finite mean for its fair cap to exist")

    def excess(tau: float) -> float:
        # E[(V - tau)+] = int_tau^inf S(v) dv (+ lower - tau below the support, where S = 1).
        # tanh-sinh calls the survival function on whole arrays of nodes (fast for frozen dists).
        start = max(tau, lower)
        val = float(integrate.tanhsinh(dist.sf, start, upper, rtol=1e-13).integral)
        return val + max(0.0, lower - tau)

    lo = mean - cost  # excess(lo) >= mean - lo = cost
    step = max(float(dist.std()), 1e-3) if math.isfinite(dist.std()) else 1.0
    hi = mean
    while excess(hi) > cost:
        hi += step
        step *= 2.0
    return optimize.brentq(lambda tau: excess(tau) - cost, lo, hi, xtol=1e-13, rtol=1e-13)


def _check_cost(cost: float) -> None:
    if not (isinstance(cost, int | float) and math.isfinite(cost) and cost > 0):
        raise ValueError(f"cost must be a finite number > 0, got {cost!r}")
