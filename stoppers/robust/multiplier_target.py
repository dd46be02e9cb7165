"""Target mode's stop test on a multimodal shape: Weitzman's rule at a Lagrange multiplier per
posterior node, the request's location and scale integrated out by likelihood.

Why: :class:`~stoppers.robust.pooled_target.PooledTargetAcceptance` judges the best reward against
the request's mean and sd, ``(best - mean) / scale >= z*``, with a Monte Carlo offset calibrated on
streams simulated from the deployment's shape. On a bimodal shape (a bulk and a better mode) the sd
mixes the modes, as in cost mode (:mod:`stoppers.robust.likelihood_cost`), and the rule
over-delivered the low targets and saved nothing: mixture deployments got 0.836 at target 0.8 and a
median save of -0.02 at 0.9 (docs/robust-stopping.md, "Target mode on a deployment").

With the prompt's distribution known, the first-crossing target rule - stop at the first v with
E[AR(V) | V >= v] >= t (Weitzman's rule on the AR scale) - is Weitzman's cost rule at the cost
lambda_t(s) = E[(AR(V) - AR(tau_t))+], tau_t its threshold, and in standardised units that
multiplier depends on the prompt's scale s alone (the AR curve is steeper for wider prompts).
So a request can stop when the posterior mean of gain(best) - lambda_t(s) is <= 0: the cost
path's posterior over (m, log s) under the deployment's fitted shape, each node with its own
multiplier (a 161-point table in log s, built once per shape and target; no simulation).

Measured (docs/robust-stopping.md): uncalibrated, it delivers the target on the mixture family but
stops early wherever the tail is long (Gumbel 0.571 at target 0.7; the one-step test under parameter
uncertainty undervalues a long tail), so the default uses it only where the deployment's fitted
shape has more than one mode (:func:`~stoppers.robust.likelihood_cost.count_modes`).
"""

from __future__ import annotations

import numpy as np

from stoppers.robust.gpd_tail import _acceptance_array
from stoppers.robust.likelihood_cost import CENTRES, EDGES, FittedShape

__all__ = ["LOG_SCALES", "MultiplierTargetRule", "multipliers"]

LOG_SCALES = np.linspace(-4.0, 4.0, 161)  # log s grid of the multiplier table (step 0.05)
_TINY = 1e-300
_TABLES_PER_SHAPE = 32  # multiplier tables kept per fitted shape (clients choose targets)


def multipliers(p: np.ndarray, z_alpha: float, target: float) -> np.ndarray:
    """log lambda_t(s) on ``LOG_SCALES`` for the shape with probabilities ``p`` on the bins
    ``EDGES``: at each scale the threshold tau where the conditional mean acceptance
    E[AR | Z >= tau] reaches ``target`` and the one-step gain E[(AR - AR(tau))+] at it. Both are
    taken at the bin edges (the bins above an edge are exactly Z >= edge, each at its centre)
    and read between the two edges the crossing falls between (log-linear in the fraction)."""
    p = np.asarray(p, dtype=np.float64)
    rows = np.arange(LOG_SCALES.size)
    s = np.exp(LOG_SCALES)[:, None]
    ar = _acceptance_array(s * (CENTRES[None, :] - z_alpha))  # (scales, bins)
    ar_edge = _acceptance_array(s * (EDGES[None, :-1] - z_alpha))  # AR at each bin's lower edge
    tail_p = np.cumsum(p[::-1])[::-1]  # P(Z >= lower edge of bin k)
    tail_ar = np.cumsum((ar * p)[:, ::-1], axis=1)[:, ::-1]
    live = tail_p > 1e-12
    conditional = np.where(live, tail_ar / np.where(live, tail_p, 1.0), 0.0)
    reached = (conditional >= target) & live
    # no edge reaches it (a target of 1 on a scale where AR < 1 below kappa): the top live one
    top = int(np.flatnonzero(live)[-1])
    hi = np.where(reached.any(axis=1), np.argmax(reached, axis=1), top)
    lo = np.maximum(hi - 1, 0)
    c_lo, c_hi = conditional[rows, lo], conditional[rows, hi]
    frac = np.clip((target - c_lo) / np.maximum(c_hi - c_lo, 1e-300), 0.0, 1.0)
    frac = np.where(hi > lo, frac, 1.0)
    above = np.arange(CENTRES.size)[None, :]

    def log_gain(k: np.ndarray) -> np.ndarray:
        excess = np.maximum(ar - ar_edge[rows, k][:, None], 0.0) * (above >= k[:, None])
        return np.log(np.maximum(excess @ p, _TINY))

    return (1.0 - frac) * log_gain(lo) + frac * log_gain(hi)


class MultiplierTargetRule:
    """The stop test for one request (state-free): :meth:`margin` <= 0 means stop.

    ``fitted``: the deployment's shape fitted by likelihood; ``scale_mu`` /
    ``scale_precision``: its learned distribution of log sd (the posterior's scale prior).
    """

    def __init__(
        self,
        fitted: FittedShape,
        target: float,
        *,
        alpha: float = 0.99,
        scale_mu: float,
        scale_precision: float,
    ) -> None:
        self.fitted = fitted
        self.z_alpha = fitted.quantile(alpha)
        self.scale_mu = float(scale_mu)
        self.scale_precision = float(scale_precision)
        self.log_multipliers = _cached_multipliers(fitted, self.z_alpha, float(target))

    def evaluate(self, rewards: np.ndarray, best: float) -> tuple[float, float]:
        """(margin, acceptance): the posterior mean of gain(best) - lambda_t(s) - the one-step
        gain in acceptance of one more sample against what the target lets a sample be worth
        at that node; stop when <= 0 - and the posterior mean of AR(best - kappa)."""
        fitted = self.fitted
        m, s, w = fitted.posterior(rewards, self.scale_mu, self.scale_precision)
        gain = fitted.node_gains(m, s, best, self.z_alpha)
        lam = np.exp(np.interp(np.log(s), LOG_SCALES, self.log_multipliers))
        accepted = _acceptance_array(best - (m + s * self.z_alpha))
        return float(w @ (gain - lam)), float(w @ accepted)

    def margin(self, rewards: np.ndarray, best: float) -> float:
        """The stop test alone (:meth:`evaluate`'s first value)."""
        return self.evaluate(rewards, best)[0]


def _cached_multipliers(fitted: FittedShape, z_alpha: float, target: float) -> np.ndarray:
    """The shape's multiplier table for (z_alpha, target to 4 decimals), kept on the shape."""
    cache = fitted.tables
    key = ("multipliers", round(z_alpha, 6), round(target, 4))
    table = cache.get(key)
    if table is None:
        if len(cache) >= _TABLES_PER_SHAPE:
            cache.pop(next(iter(cache)))  # oldest first
        table = cache[key] = multipliers(fitted.p, z_alpha, target)
    return table
