"""Stopping policies that keep their promise on any reward shape (beyond the paper).

* :class:`TailTargetAcceptance` - target mode: deliver the requested acceptance rate.
* :class:`TailPandora` - cost mode: Weitzman's rule on a fitted tail (ShapePandora's cold start).
* :class:`ShapePandora` - cost mode on the deployment-learned shape (:class:`CostShapePrior`),
  the gateway's default (``stoppers.default_cost_policy``).
* :class:`BayesShapePandora` - the same shape, the Bayes-optimal stop by backward induction
  (:mod:`stoppers.robust.bayes_table`), opt-in.
* :class:`TailPrior` - a serialisable cross-prompt prior on the tail shape, kept per model.

Both policies fit a generalised Pareto tail to the raw rewards seen so far
(:mod:`stoppers.robust.gpd_tail`) instead of the paper's shifted exponential on exp(reward).
"""

from stoppers.robust.bayes_cost import BayesShapePandora
from stoppers.robust.cost import TailPandora
from stoppers.robust.cost_prior import CostShapePrior
from stoppers.robust.gpd_tail import TailFit, fit_tail
from stoppers.robust.prior import TailPrior
from stoppers.robust.shape_cost import ShapePandora
from stoppers.robust.target import TailTargetAcceptance

__all__ = [
    "BayesShapePandora",
    "CostShapePrior",
    "ShapePandora",
    "TailFit",
    "TailPandora",
    "TailPrior",
    "TailTargetAcceptance",
    "fit_tail",
]
