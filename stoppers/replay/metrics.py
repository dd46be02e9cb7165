"""The paper's quality measures, vectorised: benchmark reward and acceptance rate.

* Benchmark reward (Definition "Benchmark Reward"): kappa = the empirical alpha-quantile of all
  of the prompt's recorded samples (``numpy.quantile(method="inverted_cdf")``: the smallest
  sample whose empirical CDF reaches alpha).
* Acceptance rate (Definition "Acceptance Rate"): ``AR_kappa(v) = min(2 e^v / (e^v + e^kappa), 1)``
  — the one definition in :func:`stoppers.faircap.acceptance_rate`, shared with the policies.

Profit (utility with B = 1 minus cost) is ``AR - c * n`` (computed in the experiments).
"""

from __future__ import annotations

import numpy as np

from stoppers.faircap import acceptance_rate

__all__ = ["acceptance_rate", "benchmark"]


def benchmark(rewards: np.ndarray, alpha: float) -> float:
    """kappa: the empirical ``alpha``-quantile of one prompt's samples."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    return float(np.quantile(np.asarray(rewards, dtype=np.float64), alpha, method="inverted_cdf"))
