"""Cost priors learned from synthetic requests, and stream runners: shared by the cost-mode
tests (tests/test_robust_shape_cost.py, tests/test_robust_cost_prior.py) and the target-mode
ones (tests/test_robust_pooled_target.py, tests/test_robust_lattice_target.py)."""

from __future__ import annotations

import math

import numpy as np

from stoppers.replay.metrics import acceptance_rate
from stoppers.robust.cost_prior import CostShapePrior, cost_shape_prior
from stoppers.robust.shape_cost import ShapePandora


def learned(draws, requests: int = 40, n: int = 80, seed: int = 0) -> CostShapePrior:
    """A prior that learned from ``requests`` full runs of ``draws(rng, n)`` rewards."""
    rng = np.random.default_rng(seed)
    prior = cost_shape_prior()
    for _ in range(requests):
        loc, scale = rng.normal(0.0, 2.0), math.exp(rng.normal(0.0, 0.4))
        assert prior.update((loc + scale * draws(rng, n)).tolist())
    return prior


def normal_prior() -> CostShapePrior:
    """A prior that learned from 40 requests of normal rewards (80 each)."""
    return learned(lambda rng, n: rng.standard_normal(n))


def run(policy, stream) -> int:
    """Feed ``stream`` to ``policy`` until it stops; the rewards it drew."""
    for reward in stream:
        if policy.observe(float(reward)):
            break
    return policy.n


def served(policy, pool: np.ndarray, alpha: float = 0.99) -> tuple[float, int]:
    """Serve one prompt's rewards ``pool`` (in order) to ``policy`` until it stops: the
    acceptance of its best against the pool's alpha-quantile, and the rewards it drew."""
    kappa = np.quantile(pool, alpha, method="inverted_cdf")
    n = run(policy, pool)
    return float(acceptance_rate(policy.best, kappa)), n


def moments(cost, **kwargs) -> ShapePandora:
    """ShapePandora without its likelihood path: the recorded shape, moment errors, tests."""
    return ShapePandora(cost, likelihood=False, **kwargs)
