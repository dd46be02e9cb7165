"""The paper's quality measures, vectorised: benchmark reward, acceptance rate, profit.

* Benchmark reward (Definition "Benchmark Reward"): kappa = the empirical alpha-quantile of all
  of the prompt's recorded samples (``numpy.quantile(method="inverted_cdf")``: the smallest
  sample whose empirical CDF reaches alpha).
* Acceptance rate (Definition "Acceptance Rate"): ``AR_kappa(v) = min(2 e^v / (e^v + e^kappa), 1)``,
  written as ``min(2 * expit(v - kappa), 1)`` so large rewards never overflow.
* Profit (utility with B = 1 minus cost): ``AR - c * n``.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

__all__ = ["acceptance_rate", "benchmark", "profit"]


def benchmark(rewards: np.ndarray, alpha: float) -> float:
    """kappa: the empirical ``alpha``-quantile of one prompt's samples."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    return float(np.quantile(np.asarray(rewards, dtype=np.float64), alpha, method="inverted_cdf"))


def acceptance_rate(reward, kappa):
    """AR_kappa(reward), elementwise; broadcasting like numpy."""
    return np.minimum(2.0 * expit(np.subtract(reward, kappa)), 1.0)


def profit(acceptance, samples, cost):
    """Utility (B = 1) minus the cost of the samples drawn."""
    return np.subtract(acceptance, np.multiply(cost, samples))
