"""The interiors a floor that cuts one latent shape leaves, as target mode's floor table reads them.

Why: the floor table (:mod:`stoppers.robust.floor_table`) models a prompt as drawing above the
floor with probability p and there from an interior shape the deployment's prompts share. On a
floor that cuts one latent distribution - rewards max(floor, m + s Z), a Tobit - the interior is
the latent shape above its (1 - p)-quantile: the more of a prompt the floor takes, the shorter
and more skewed what is left. One interior shape for every p over-delivered and drew more than
the Best-of-N it matched on such a deployment (`floored --loc-mean -2` at sd 1: median saves
-0.39 to -0.75 at targets 0.7-0.95; docs/robust-stopping.md, "The floor read as censoring").

Read as a cut (the reading cost mode chooses by a Bayes factor, :attr:`CensoredShape.cut`), the
table's threshold for p is the known-distribution one of the interior the cut leaves at p, and
its calibration simulates the cut itself: a stream's latent scale from the kept streams' first
estimates, its rewards above the floor the latent shape above its (1 - p)-quantile, its
benchmark m + s z_alpha (the latent alpha-quantile: the floor's share does not move it while
p > 1 - alpha).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from stoppers.robust.likelihood_cost import CENTRES, EDGES
from stoppers.robust.stop_table import Z_EDGES

__all__ = ["CutInterior"]


@dataclass(frozen=True)
class CutInterior:
    """The latent shape (bin probabilities on ``likelihood_cost.EDGES``, mean 0 and sd 1: a
    :class:`~stoppers.robust.likelihood_cost.FittedShape`'s ``p``) and its log-scale prior
    (:func:`~stoppers.robust.latent_shape.latent_scales`)."""

    latent: np.ndarray
    scale_mu: float
    scale_precision: float
    _cdf: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        p = np.asarray(self.latent, dtype=np.float64)
        cdf = np.concatenate([[0.0], np.cumsum(p / p.sum())])
        object.__setattr__(self, "_cdf", cdf)

    def quantile(self, alpha: float) -> float:
        """The latent alpha-quantile (the CDF linear within a bin)."""
        return float(np.interp(alpha, self._cdf, EDGES))

    def shape(self, p_above: float) -> np.ndarray:
        """The interior at ``p_above`` - the latent shape above its (1 - p_above)-quantile -
        standardised by its own mean and sd, as bin probabilities on ``stop_table.Z_EDGES``."""
        cut = 1.0 - p_above
        tail = np.maximum(self._cdf - cut, 0.0) / p_above  # the interior's CDF at EDGES
        mass = np.diff(tail)
        mean = float(mass @ CENTRES)
        sd = math.sqrt(max(float(mass @ (CENTRES - mean) ** 2), 1e-12))
        return np.diff(np.interp(mean + sd * Z_EDGES, EDGES, tail, left=0.0, right=1.0))

    def draws(
        self, p_above: np.ndarray, horizon: int, alpha: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """(rewards above the floor, benchmarks) of one simulated stream per ``p_above``, located
        at m = 0: every draw from the latent shape above its (1 - p)-quantile, scaled by a latent
        scale from the prior; the benchmark s z_alpha. A draw that lands at the floor is drawn by
        the caller (with chance 1 - p): these are the rewards of the draws above it."""
        r = p_above.size
        log_s = self.scale_mu + rng.standard_normal(r) / math.sqrt(self.scale_precision)
        s = np.exp(log_s)
        u = 1.0 - p_above[:, None] * rng.random((r, horizon))
        z = np.interp(u, self._cdf, EDGES)
        return s[:, None] * z, s * self.quantile(alpha)
