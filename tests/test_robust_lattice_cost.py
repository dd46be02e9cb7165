"""Cost mode on a lattice deployment: rounded scores without a clip decide on the deployment's
shape fitted dequantized; a clipped lattice keeps the cold start."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from stoppers.robust import gpd_tail
from stoppers.robust.ceiling import ceiling_of, floor_of
from stoppers.robust.cost_prior import CostShapePrior, cost_shape_prior
from stoppers.robust.lattice_gain import lattice_posterior, lattice_posterior_gain
from stoppers.robust.likelihood_cost import EDGES, FittedShape
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


def _normal_shape() -> FittedShape:
    """The deployment's shape, fitted to 16 integer-rounded normal prompts (dequantized)."""
    prior = _deployment()
    fitted = ShapePandora(0.001, prior=prior, max_samples=960).fitted_shape
    assert fitted is not None
    return fitted


def _few_levels(rng: np.random.Generator, n: int, sd: float = 0.5, step: float = 1.5):
    """A prompt whose normal rewards (sd 0.5) fall on three or four levels of a 1.5 lattice."""
    return step * np.round((0.3 + sd * rng.standard_normal(n)) / step)


def test_the_interval_likelihood_finds_the_scale_under_coarse_rounding():
    """Rewards on two to five levels of a 1.5 lattice (sd 0.3-0.8): read as cells, they place
    the scale closer than read as points of the smooth shape (which also sees the rounding)."""
    shape = _normal_shape()
    cells, points = [], []
    for sd in (0.3, 0.5, 0.8):
        for seed in range(4):
            x = _few_levels(np.random.default_rng(seed), 400, sd=sd)
            _, s, w = lattice_posterior(shape, x, 1.5, math.log(0.6), 4.0)
            cells.append(abs(math.log(float(w @ s) / sd)))
            _, s, w = shape.posterior(x, math.log(0.6), 4.0)
            points.append(abs(math.log(float(w @ s) / sd)))
    assert np.mean(cells) < 0.1 and np.mean(cells) < 0.6 * np.mean(points)


def test_a_best_at_the_benchmark_level_gains_nothing_on_the_lattice():
    """Three levels, the best at the one holding the 0.99-quantile: the smooth shape keeps a
    benchmark above the best (why such prompts drew to the budget), the lattice does not."""
    shape, rng = _normal_shape(), np.random.default_rng(2)
    x = _few_levels(rng, 300)
    best = float(x.max())
    gain, kappa = lattice_posterior_gain(shape, x, best, 0.99, 1.5, math.log(0.6), 4.0)
    assert kappa == pytest.approx(best, abs=0.01) and gain < 1e-4
    smooth, smooth_kappa = shape.posterior_gain(x, best, shape.quantile(0.99), math.log(0.6), 4.0)
    assert smooth_kappa > best and smooth > 1e-3


def test_the_lattice_gain_is_the_expected_gain_of_one_more_rounded_draw():
    """Many rewards pin (m, s): the gain is E[(AR(V - kappa) - AR(best - kappa))+] with V the
    shape's draw rounded to the lattice, checked by simulation with the true parameters."""
    shape, rng = _normal_shape(), np.random.default_rng(3)
    step, m, s = 0.5, 0.2, 1.0
    x = step * np.round((m + s * rng.standard_normal(20_000)) / step)
    best = step * np.round((m + 1.0 * s) / step)  # a best below the benchmark's level
    gain, kappa = lattice_posterior_gain(shape, x, best, 0.99, step, 0.0, 1.0)
    draws = step * np.round((m + s * _shape_draws(shape, rng, 400_000)) / step)
    true_kappa = float(np.quantile(draws, 0.99, method="inverted_cdf"))
    assert kappa == pytest.approx(true_kappa, abs=1e-6)
    ar = gpd_tail._acceptance_array
    expected = float(np.mean(np.maximum(ar(draws - kappa) - ar(best - kappa), 0.0)))
    assert gain == pytest.approx(expected, rel=0.1)


def _shape_draws(shape: FittedShape, rng: np.random.Generator, n: int) -> np.ndarray:
    """Draws of the standardised shape: a bin by its probability, uniform within it."""
    i = rng.choice(shape.p.size, size=n, p=shape.p / shape.p.sum())
    return EDGES[i] + (EDGES[1] - EDGES[0]) * rng.random(n)


def test_few_level_prompts_stop_on_the_lattice_before_the_budget():
    """The failure of 2026-11-28 (rounded at 1.5, seed 4): a prompt on three levels whose best
    sits at the benchmark's level drew to the 960 budget at c = 1e-3."""
    prior = _deployment()
    rng = np.random.default_rng(4)
    stops = []
    for _ in range(5):
        policy = ShapePandora(0.001, prior=prior, max_samples=960)
        assert policy.warm and policy.fitted_shape is not None
        x = 1.0 * np.round(0.3 + 0.3 * rng.standard_normal(960))  # levels 0 and 1, a few 2
        n = next(i for i, r in enumerate(x, 1) if policy.observe(float(r)))
        assert policy.stop_reason == "threshold"
        stops.append(n)
    assert max(stops) < 200


def test_rewards_all_on_one_level_are_judged_as_one_cell():
    """A request whose rewards all round to one level used to give the likelihood path no scale
    to judge it by (it waited for a second level; only the blend cap ended it). Read as one
    cell, its scale is the deployment's prior cut to what keeps n draws in one cell: the chance
    of a level above, and the gain, fall as the ties accumulate."""
    prior = _deployment()
    shape = ShapePandora(0.001, prior=prior, max_samples=960).fitted_shape
    gains = [
        lattice_posterior_gain(shape, np.zeros(n), 0.0, 0.99, 2.0, math.log(1.0), 4.0)[0]
        for n in (8, 32, 128, 512)
    ]
    assert gains[0] > 1e-2 and all(a > b for a, b in itertools.pairwise(gains)) and gains[-1] < 1e-4
    # nine copies of 0.9 have a float variance of 1e-32, not 0: still one cell, not a tiny scale
    nines = lattice_posterior_gain(shape, np.full(9, 0.9), 0.9, 0.99, 0.9, math.log(0.6), 4.0)[0]
    assert nines > 1e-2
    policy = ShapePandora(0.001, prior=prior, max_samples=960)
    assert policy.warm and policy.fitted_shape is not None
    assert not any(policy.observe(3.0) for _ in range(16))
    assert policy.expected_gain is not None and policy.expected_gain > 0.001


def test_an_established_floor_leaves_a_lattice_on_the_likelihood_path():
    """The lowest level of a coarse lattice is reached by three requests as easily as a clip:
    a floor alone does not send the deployment back to the cold start (a ceiling does)."""
    prior = _deployment()
    for _ in range(3):  # three requests all at one low level: the deployment's floor
        prior.update(np.full(40, -9.0))
    assert floor_of(prior) is not None and ceiling_of(prior) is None
    policy = ShapePandora(0.001, prior=prior, max_samples=960)
    assert policy.warm and policy.fitted_shape is not None
