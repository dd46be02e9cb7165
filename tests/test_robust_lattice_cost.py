"""Cost mode on a lattice deployment: rounded scores without a clip decide on the deployment's
shape fitted dequantized; a clipped lattice keeps the cold start."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stoppers.robust.ceiling import ceiling_of
from stoppers.robust.cost_prior import CostShapePrior, cost_shape_prior
from stoppers.robust.likelihood_cost import FittedShape
from stoppers.robust.shape_cost import ShapePandora


def _prompt(rng: np.random.Generator, samples: int, clip: float | None = None) -> np.ndarray:
    """Normal rewards, location N(0, 2), sd exp(N(0.3, 0.3)), rounded to integers (a judge's
    ratings), clipped above at ``clip``."""
    rewards = rng.normal(0, 2) + math.exp(rng.normal(0.3, 0.3)) * rng.standard_normal(samples)
    rewards = np.round(rewards)
    return rewards if clip is None else np.minimum(rewards, clip)


def _deployment(clip: float | None = None, prompts: int = 16) -> CostShapePrior:
    rng = np.random.default_rng(0)
    prior = cost_shape_prior()
    for _ in range(prompts):
        prior.update(_prompt(rng, 100, clip))
    return prior


def test_rounded_scores_decide_on_the_dequantized_shape():
    prior = _deployment()
    assert prior.tied_streams() == 1.0 and prior.lattice_step() == 1.0
    policy = ShapePandora(0.001, prior=prior, max_samples=960)
    assert policy.warm and policy.fitted_shape is not None
    fitted = policy.fitted_shape
    # the normal shape's quantiles (2.33, 3.09), not the lumps of the rounded rewards
    assert fitted.modes == 1
    assert fitted.quantile(0.99) == pytest.approx(2.33, abs=0.15)
    assert fitted.quantile(0.999) == pytest.approx(3.09, abs=0.3)
    # fitted to the rewards as they are, the lattice's lumps read as modes
    lumpy = FittedShape.fit(prior.streams, prior.requests)
    assert lumpy is not None and lumpy.modes > 1


def test_a_clipped_lattice_keeps_the_cold_start():
    """A clip's point mass is no rounded smooth shape: once the deployment knows its ceiling,
    requests run the cold start and the ceiling rule, as before."""
    prior = _deployment(clip=1.0)
    assert prior.lattice_step() == 1.0 and ceiling_of(prior) == 1.0
    policy = ShapePandora(0.001, prior=prior, max_samples=960)
    assert not policy.warm and policy.fitted_shape is None


def test_lattice_step_follows_the_kept_streams_and_survives_a_restore():
    prior = _deployment(prompts=4)
    assert prior.lattice_step() == 1.0
    rng = np.random.default_rng(3)
    for _ in range(6):  # continuous requests outnumber the rounded ones
        prior.update(rng.normal(0, 1, 100))
    assert prior.lattice_step() is None
    restored = CostShapePrior.from_dict(prior.to_dict())
    assert restored.lattice_step() is None and restored.tied_streams() == prior.tied_streams()
