"""EM for a grid NPMLE of a mixing distribution (Kiefer-Wolfowitz), shared by the deployment
priors that learn one: the tail shape xi (:mod:`stoppers.robust.xi_prior`) and the chance of a
reward above the scale's floor (:mod:`stoppers.robust.ceiling`)."""

from __future__ import annotations

import numpy as np

__all__ = ["npmle_em"]


def npmle_em(
    likelihood: np.ndarray, g: np.ndarray, base: np.ndarray, base_weight: float, steps: int
) -> np.ndarray:
    """``steps`` EM iterations from ``g``, regularised by ``base_weight`` requests of ``base``.

    ``likelihood``: (requests, grid) p(data_i | grid point j), any positive scale per row.
    g_j <- (sum_i post_ij + base_weight base_j) / (requests + base_weight), post_ij the posterior
    of grid point j for request i under the current g.
    """
    for _ in range(steps):
        post = likelihood * g
        post /= post.sum(axis=1, keepdims=True)
        g = (post.sum(axis=0) + base_weight * base) / (likelihood.shape[0] + base_weight)
    return g
