"""BEACON (Wan et al., "BEACON: Bayesian Optimal Stopping for Efficient LLM Sampling",
arXiv 2510.15945): sequential search with Bayesian learning of a Normal reward distribution.

Model: rewards ~ N(mu, sigma^2) with a Normal–Inverse-Gamma prior, here the non-informative
(Jeffreys) limit; after k rewards with mean rbar and sum of squared deviations SSD the posterior
predictive of the next reward is Student-t with k - 1 degrees of freedom, location rbar and
scale s_k = sqrt(SSD (k + 1) / (k (k - 1))). Everything is scale-free in the standardised best
z = (best - rbar) / s_k, so the optimal rule is an index h_{n,k}(z), one table per horizon n
(= ``max_samples``) serving every cost: stop as soon as h_{n,k}(z) s_k <= c.

The table comes from backward induction on the Bellman equation in standardised units: with
G_{n,n} = 0 and, for k < n, after one more draw u ~ t_{k-1} the statistics move to
mean' = u/(k+1), s'^2 = (k+2)(k-1+u^2)/(k+1)^2 and best' = max(z, u), so

    Q_k(z; c) = E[(u - z)+] - c + E[ s' max(0, Q_{k+1}(z'; c/s')) ],  z' = (best' - mean')/s',

and h_{n,k}(z) is the c solving Q_k(z; c) = 0 (Q decreases in c). E[(u - z)+] is the Student-t
closed form; the expectation over u uses 32 equal-probability t quantiles; Q_{k+1} is
interpolated on a (z, log c) grid. The table for one n is computed once per process and cached
(a few ms per step k: ~0.5 s for n = 64). Sampling starts with k0 = 3 rewards (the predictive needs
k - 1 >= 2 degrees of freedom for a finite mean). ``cost`` is in reward units.

Left out on purpose: the paper's optional winsorisation of low outliers, and informative priors.
If all rewards so far are equal (SSD = 0) the posterior scale is 0 and the policy stops.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

from stoppers.base import StoppingPolicy, _check_positive_int
from stoppers.faircap import _check_cost

__all__ = ["Beacon", "beacon_index_table"]

_K0 = 3
_Z_GRID = np.linspace(-6.0, 12.0, 97)
_LOG_C_GRID = np.linspace(math.log(1e-6), math.log(20.0), 48)
_QUANTILES = 32


@functools.lru_cache(maxsize=256)
def beacon_index_table(max_samples: int) -> np.ndarray:
    """h[k, j] = h_{n,k}(z_j) on :data:`_Z_GRID` for k = 0..n-1 (rows < 3 are +inf: continue).

    Cached per ``max_samples``; read-only.
    """
    _check_positive_int("max_samples", max_samples)
    n = max_samples
    z = _Z_GRID
    costs = np.exp(_LOG_C_GRID)
    table = np.full((n, z.size), np.inf)
    future = np.zeros((costs.size, z.size))  # Q_{k+1}(z; c)+ on the grid, zero at k + 1 = n
    probs = (np.arange(_QUANTILES) + 0.5) / _QUANTILES
    for k in range(n - 1, _K0 - 1, -1):
        df = k - 1
        t = stats.t(df)
        u = t.ppf(probs)
        gain = (
            (df + z**2) / (df - 1.0) * t.pdf(z) - z * t.sf(z) if df > 1 else np.full_like(z, np.inf)
        )
        cont = np.zeros((costs.size, z.size))
        if k + 1 < n:
            for uj in u:
                mean_new = uj / (k + 1.0)
                s_new = math.sqrt((k + 2.0) * (k - 1.0 + uj * uj)) / (k + 1.0)
                z_new = (np.maximum(z, uj) - mean_new) / s_new
                log_c_new = _LOG_C_GRID - math.log(s_new)
                cont += s_new * _interp2(future, log_c_new, z_new)
            cont /= _QUANTILES
        q = gain[None, :] - costs[:, None] + cont
        future = np.maximum(q, 0.0)
        table[k] = _root_in_cost(q)
    return table


def _interp2(grid: np.ndarray, log_c: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Bilinear interpolation of grid[c, z] at (log_c[i], z[j]) for all i, j (clamped)."""
    ci = np.clip(
        (log_c - _LOG_C_GRID[0]) / (_LOG_C_GRID[1] - _LOG_C_GRID[0]), 0, _LOG_C_GRID.size - 1
    )
    zi = np.clip((z - _Z_GRID[0]) / (_Z_GRID[1] - _Z_GRID[0]), 0, _Z_GRID.size - 1)
    c0 = np.minimum(ci.astype(int), _LOG_C_GRID.size - 2)
    z0 = np.minimum(zi.astype(int), _Z_GRID.size - 2)
    fc = (ci - c0)[:, None]
    fz = (zi - z0)[None, :]
    g00 = grid[c0[:, None], z0[None, :]]
    g01 = grid[c0[:, None], z0[None, :] + 1]
    g10 = grid[c0[:, None] + 1, z0[None, :]]
    g11 = grid[c0[:, None] + 1, z0[None, :] + 1]
    return (g00 * (1 - fz) + g01 * fz) * (1 - fc) + (g10 * (1 - fz) + g11 * fz) * fc


def _root_in_cost(q: np.ndarray) -> np.ndarray:
    """Per z column, the cost where Q(z; c) crosses 0 (log-linear interpolation on the grid)."""
    costs = _LOG_C_GRID
    positive = q > 0
    # Q decreases in c: index of the last grid cost with Q > 0
    last = positive.sum(axis=0) - 1
    out = np.empty(q.shape[1])
    for j in range(q.shape[1]):
        i = last[j]
        if i < 0:
            out[j] = math.exp(costs[0])
        elif i >= costs.size - 1:
            out[j] = math.exp(costs[-1])
        else:
            q0, q1 = q[i, j], q[i + 1, j]
            frac = q0 / (q0 - q1)
            out[j] = math.exp(costs[i] + frac * (costs[i + 1] - costs[i]))
    # the index is non-increasing in z (a better best leaves less to gain)
    return np.minimum.accumulate(out)


class Beacon(StoppingPolicy):
    """BEACON's universal index policy for horizon ``max_samples`` and per-sample ``cost``.

    Stop reason ``"threshold"`` (h s <= c) or ``"budget"``. O(1) per observation: Welford mean
    and SSD, one interpolation in the cached index table.
    """

    def __init__(self, cost: float, max_samples: int) -> None:
        _check_cost(cost)
        _check_positive_int("max_samples", max_samples)
        super().__init__(max_samples=max_samples)
        self.cost = float(cost)
        self._table = beacon_index_table(max_samples)
        self._mean = 0.0
        self._ssd = 0.0
        self._index: float | None = None
        self._scale: float | None = None

    def _decide(self, reward: float) -> str | None:
        k = self._n
        delta = reward - self._mean
        self._mean += delta / k
        self._ssd += delta * (reward - self._mean)
        if k < _K0 or k >= self.max_samples:
            return None
        scale = math.sqrt(max(self._ssd, 0.0) * (k + 1) / (k * (k - 1)))
        self._scale = scale
        if scale <= 0.0:
            self._index = 0.0
            return "threshold"
        z = (self._best - self._mean) / scale
        self._index = float(np.interp(z, _Z_GRID, self._table[k]))
        return "threshold" if self._index * scale <= self.cost else None

    @property
    def threshold(self) -> float | None:
        """None: BEACON's rule is an index on the standardised best, not a reward threshold."""
        return None

    @property
    def index(self) -> float | None:
        """The current h_{n,k}(z) (standardised cost units), once k >= 3."""
        return self._index
