"""Cost mode's one-step gain on a rounding lattice: rewards, benchmark and gain all on its levels.

Why: on rounded scores (integer judge ratings, scores rounded to 0.5) the likelihood path read a
request's rewards as points of the smooth shape, and its gain counted values between the best
and the next level that the lattice never produces. On prompts with three or four levels whose
best sits at the benchmark's level it kept a benchmark above the best and drew to the budget
(docs/robust-stopping.md, "Both lattice changes on lattices built after them"). Summing the gain
over the levels alone stopped those prompts but stopped others too early: the point-density
posterior was too sure of the request's scale (docs/robust-stopping.md, "Cost mode learns the
shape of rounded scores"). Here both sides are on the lattice:

- the likelihood of a reward x is the shape's mass over its rounding cell,
  F((x + h/2 - m) / s) - F((x - h/2 - m) / s) (interval-censored data), so a request whose
  rewards fall on few levels keeps a posterior as wide as those levels leave its scale;
- at each (m, s) node the benchmark kappa is the level whose cell holds the shape's
  alpha-quantile m + s z_alpha (Definition "Benchmark Reward" for a lattice-valued reward), and
  the gain of one more draw is sum over the levels above the best of
  P(level) (AR(level - kappa) - AR(best - kappa))+ (Definitions "Fair-cap value",
  "Weitzman's Algorithm").

The grid is found in two passes: a wide one around the moment estimates (the sd corrected for
rounding by Sheppard's h^2 / 12), then one fitted to where the first put the posterior's mass.
Rewards are read as (level, count), so a pass costs nodes x levels, not nodes x n.
"""

from __future__ import annotations

import math

import numpy as np

from stoppers.robust.gpd_tail import _acceptance_array
from stoppers.robust.likelihood_cost import EDGES, FittedShape

__all__ = ["lattice_posterior", "lattice_posterior_gain"]

_NODES = 15  # per axis
_UNIT = np.linspace(-1.0, 1.0, _NODES)
_UNIT_M = np.repeat(_UNIT, _NODES)
_UNIT_L = np.tile(_UNIT, _NODES)
_WIDE = 1.5  # first pass: log s within +-1.5 of the corrected log sd (x 0.22 to 4.5)
_LEVELS = 256  # levels above the best summed at most
_SPAN_SDS = 5.0  # second pass: +-5 posterior sds of the first
_TINY = 1e-300


def lattice_posterior(
    shape: FittedShape,
    rewards: np.ndarray,
    step: float,
    scale_mu: float,
    scale_precision: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, s, weights): a request's posterior over its location and scale from ``rewards`` on a
    lattice of step ``step``, each read as its rounding cell, under the deployment's
    standardised ``shape`` and log-sd prior N(``scale_mu``, 1 / ``scale_precision``)."""
    return _posterior(_cdf(shape), rewards, step, (scale_mu, scale_precision))


def _posterior(
    cdf: np.ndarray, rewards: np.ndarray, step: float, prior: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`lattice_posterior` under the shape's CDF ``cdf`` (:func:`_cdf`)."""
    x = np.asarray(rewards, dtype=np.float64)
    levels, counts = np.unique(x, return_counts=True)
    n = x.size
    if levels.size > 1:
        var = float(x.var(ddof=1))
        # Sheppard: rounding adds h^2 / 12 to the variance (floored: a few levels say little)
        log_sd = 0.5 * math.log(max(var - step * step / 12.0, 0.25 * var))
        half_m = 2.0 * _SPAN_SDS * math.sqrt(max(var, step * step / 12.0) / n)
        loc, log_scale = (float(x.mean()), half_m), (log_sd, _WIDE)
    else:
        loc, log_scale = _one_cell_grid(float(x[0]), step, prior)
    m, s, w = _pass(levels, counts, cdf, step, loc, log_scale, prior)
    log_s = np.log(s)
    m_mean, l_mean = float(w @ m), float(w @ log_s)
    m_sd = math.sqrt(float(w @ (m - m_mean) ** 2))
    l_sd = math.sqrt(float(w @ (log_s - l_mean) ** 2))
    # the second pass no coarser than the first
    half_m = max(_SPAN_SDS * m_sd, 2.0 * loc[1] / (_NODES - 1))
    half_l = max(_SPAN_SDS * l_sd, 2.0 * log_scale[1] / (_NODES - 1))
    return _pass(levels, counts, cdf, step, (m_mean, half_m), (l_mean, half_l), prior)


def _one_cell_grid(
    level: float, step: float, prior: tuple[float, float]
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The first pass's (centre, half-width) of m and of log s for rewards all on one level.

    They hold no spread to centre on: the likelihood P(cell)^n is flat for scales well under
    the step and vanishes above it, and m is anywhere in the cell. So m spans the cell and a
    step either side, and log s runs from the log-sd prior's low end (or a twentieth of the
    step) to 1.6 steps: what the prior puts on scales too small to reach another level is
    kept, not cut off (cutting it would overstate the chance of a level above)."""
    low = min(math.log(step) - 3.0, prior[0] - 3.0 / math.sqrt(prior[1]))
    high = math.log(step) + 0.5
    return (level, 1.5 * step), (0.5 * (low + high), 0.5 * (high - low))


def lattice_posterior_gain(
    shape: FittedShape,
    rewards: np.ndarray,
    best: float,
    alpha: float,
    step: float,
    scale_mu: float,
    scale_precision: float,
) -> tuple[float, float]:
    """(one-step gain, posterior mean of kappa) for a request holding ``rewards`` on a lattice
    of step ``step``: the gain over the lattice's levels averaged over
    :func:`lattice_posterior`."""
    cdf = _cdf(shape)  # once for the posterior and the gain
    m, s, w = _posterior(cdf, rewards, step, (scale_mu, scale_precision))
    z_alpha = float(np.interp(alpha, cdf, EDGES))
    kappa = best + step * np.round((m + s * z_alpha - best) / step)  # the level holding it
    base = _acceptance_array(best - kappa)
    top = float(np.max(m + s * EDGES[-1]))
    levels = best + step * np.arange(1, min(max(math.ceil((top - best) / step), 1), _LEVELS) + 1)
    mass = _cell_mass(levels, cdf, step, m, s)
    ar = _acceptance_array(levels[None, :] - kappa[:, None])
    gains = np.sum(mass * np.maximum(ar - base[:, None], 0.0), axis=1)
    return float(w @ gains), float(w @ kappa)


def _cdf(shape: FittedShape) -> np.ndarray:
    """The shape's CDF at the bin edges ``EDGES`` (linear within a bin)."""
    cdf = np.concatenate(([0.0], np.cumsum(shape.p)))
    return cdf / cdf[-1]


def _cell_mass(
    levels: np.ndarray, cdf: np.ndarray, step: float, m: np.ndarray, s: np.ndarray
) -> np.ndarray:
    """P(a draw rounds to each level) at each (m, s) node: the shape's mass over its cell."""
    hi = np.interp((levels[None, :] + 0.5 * step - m[:, None]) / s[:, None], EDGES, cdf)
    lo = np.interp((levels[None, :] - 0.5 * step - m[:, None]) / s[:, None], EDGES, cdf)
    return hi - lo


def _pass(
    levels: np.ndarray,
    counts: np.ndarray,
    cdf: np.ndarray,
    step: float,
    loc: tuple[float, float],
    log_scale: tuple[float, float],
    prior: tuple[float, float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, s, weights) on a 15 x 15 grid, m within ``loc`` = (centre, half-width) and log s
    within ``log_scale``: the cells' log likelihood weighted by the levels' counts plus the
    log-sd prior ``prior`` = (mean, precision); nodes under 1e-6 of the top one dropped."""
    m = loc[0] + _UNIT_M * loc[1]
    log_s = log_scale[0] + _UNIT_L * log_scale[1]
    s = np.exp(log_s)
    log_post = np.log(np.maximum(_cell_mass(levels, cdf, step, m, s), _TINY)) @ counts
    log_post -= 0.5 * prior[1] * (log_s - prior[0]) ** 2
    w = np.exp(log_post - log_post.max())
    keep = w > 1e-6
    return m[keep], s[keep], w[keep] / w[keep].sum()
