"""ShapePandora: cost mode on a deployment-learned shape (cold start = TailPandora)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from stoppers.robust.cost import HIDDEN_MODE_MASS, TailPandora, hidden_mode_draws
from stoppers.robust.cost_prior import CostShapePrior, cost_shape_prior
from stoppers.robust.shape_cost import (
    FRESH_REQUESTS,
    CostShape,
    ShapePandora,
    _tail_prior,
    tail_excess,
)
from stoppers.robust.stop_table import Z_BINS, Z_HI, Z_LO
from tests.learned_priors import moments, normal_prior, run


def _ar(d):
    e = np.exp(np.minimum(d, 0.0))
    return np.minimum(2.0 * e / (1.0 + e), 1.0)


def test_cold_start_is_tail_pandora_decision_for_decision():
    """Until a shape is learned the request is TailPandora on the prior's xi; while the
    deployment prior is fresh, one that waits hidden_mode_draws before its fit ends the search
    (without a prior, none: a gateway that learns nothing would wait on every request)."""
    rng = np.random.default_rng(1)
    young = cost_shape_prior()
    young.update(rng.normal(size=60).tolist())  # one request: fresh
    grown = cost_shape_prior()
    for _ in range(FRESH_REQUESTS):  # no longer fresh, not warm yet
        grown.update(rng.normal(size=60).tolist())
    wait = hidden_mode_draws(1e-3)
    waited = 0
    for prior, search_min in ((None, 0), (young, wait), (grown, 0)):
        for seed in range(20):
            stream = np.random.default_rng(seed).standard_t(3.0, 400)
            if seed % 2:  # a third of the rewards at their bottom: where the wait applies
                stream = np.maximum(stream, -0.45)
            mine = ShapePandora(1e-3, max_samples=400, prior=prior)
            assert not mine.warm
            ref = TailPandora(
                1e-3, max_samples=400, prior=_tail_prior(prior), search_min=search_min
            )
            assert run(mine, stream) == run(ref, stream)
            assert (mine.best, mine.stop_reason) == (ref.best, ref.stop_reason)
            assert mine.threshold == ref.threshold
            plain = TailPandora(1e-3, max_samples=400, prior=_tail_prior(prior))
            run(plain, stream)
            if search_min and seed % 2:
                assert mine.n >= wait or mine.stop_reason != "threshold"
                waited += plain.n < wait
            else:  # no wait, or a stream with no pile at its bottom: the plain cold start
                assert (mine.n, mine.best) == (plain.n, plain.best)
    assert waited > 0  # the wait changed some requests


def test_hidden_mode_draws_is_where_the_two_point_prior_stops_paying():
    for cost in (1e-2, 1e-3, 3e-4, 1e-4, 1e-5):
        n = hidden_mode_draws(cost)
        gain = lambda k: (1.0 - HIDDEN_MODE_MASS) ** k * HIDDEN_MODE_MASS  # noqa: E731
        assert gain(n) <= cost < gain(n - 1)
    assert (hidden_mode_draws(1e-3), hidden_mode_draws(1e-4)) == (77, 122)
    assert hidden_mode_draws(0.5) == 1  # a draw dearer than the mode's mass: no wait


def test_a_fresh_deployment_finds_a_mode_the_fit_has_not_seen():
    """A judge's losing answers at the bottom of its scale (40% of the draws), the rest normal,
    and a better mode of 5% from the 70th draw on: the plain cold start ends its search on the
    fit before the mode shows on some streams; a fresh deployment's request waits 77 draws and
    finds it on all; once the deployment has learned from three requests the wait is off."""
    grown = cost_shape_prior()
    rng = np.random.default_rng(2)
    for _ in range(FRESH_REQUESTS):
        grown.update(rng.normal(size=60).tolist())
    missed = 0
    for seed in range(10):
        stream = np.random.default_rng(seed).normal(size=400)
        stream[np.random.default_rng(seed + 100).random(400) < 0.4] = -4.0
        stream[70::20] = 8.0
        fresh = ShapePandora(1e-3, max_samples=400, prior=cost_shape_prior())
        run(fresh, stream)
        assert fresh.best == 8.0
        plain = TailPandora(1e-3, max_samples=400)
        run(plain, stream)
        missed += plain.best < 8.0
        later = ShapePandora(1e-3, max_samples=400, prior=grown)
        assert run(later, stream) == run(TailPandora(1e-3, max_samples=400, prior=grown.xi), stream)
    assert missed >= 2
    smooth = np.random.default_rng(0).normal(size=400)
    smooth[70::20] = 8.0  # no pile at the bottom: no wait, as the plain cold start
    fresh = ShapePandora(1e-3, max_samples=400, prior=cost_shape_prior())
    assert run(fresh, smooth) == run(TailPandora(1e-3, max_samples=400), smooth)
    piled = np.maximum(np.random.default_rng(0).normal(size=400), -0.5)
    small = ShapePandora(1e-3, max_samples=40, prior=cost_shape_prior())  # capped at the budget
    assert run(small, piled) == 40


def test_gain_matches_brute_force_integral_over_the_parameter_grid():
    shape = CostShape.from_prior(normal_prior(), 0.99)
    assert shape is not None
    # z_alpha of a standard normal is 2.33; the learned histogram lands near it
    assert 2.0 < shape.z_alpha < 2.8
    b, s, loc_sd, log_s_sd = 1.2, 1.3, 0.2, 0.1
    x, w = np.polynomial.hermite_e.hermegauss(5)
    w = w / w.sum()
    total = 0.0
    for xi, wi in zip(x, w, strict=True):
        for yj, wj in zip(x, w, strict=True):
            bb, ss = b - xi * loc_sd, s * math.exp(yj * log_s_sd)
            kappa = ss * shape.z_alpha
            gain = np.maximum(_ar(ss * shape.z - kappa) - _ar(np.array(bb - kappa)), 0.0)
            total += wi * wj * float(gain @ shape.p)
    assert shape.expected_gain(b, s, loc_sd, log_s_sd) == pytest.approx(total, rel=1e-9)


def test_gain_falls_as_the_best_rises_and_vanishes_past_kappa():
    shape = CostShape.from_prior(normal_prior(), 0.99)
    gains = [shape.expected_gain(b, 1.0, 0.1, 0.05) for b in np.linspace(-1.0, 4.0, 26)]
    assert all(g1 >= g2 for g1, g2 in itertools.pairwise(gains))
    assert gains[0] > 1e-2 and gains[-1] < 1e-6


def test_uncertain_parameters_raise_the_gain():
    shape = CostShape.from_prior(normal_prior(), 0.99)
    sure = shape.expected_gain(1.8, 1.0, 0.0, 0.0)
    unsure = shape.expected_gain(1.8, 1.0, 0.4, 0.2)
    assert unsure > sure * 1.2


def test_warm_policy_samples_about_what_the_known_distribution_needs():
    prior = normal_prior()
    rng = np.random.default_rng(7)
    counts = {}
    for cost in (1e-2, 1e-3):
        n = []
        for _ in range(30):
            policy = ShapePandora(cost, max_samples=960, prior=prior)
            assert policy.warm
            n.append(run(policy, rng.normal(0.5, 1.7, 960)))
            assert policy.stop_reason == "threshold"
            assert policy.expected_gain <= cost
        counts[cost] = float(np.mean(n))
    # Weitzman's oracle on normal rewards samples ~15 (c = 1e-2) and ~65 (c = 1e-3)
    assert 8 <= counts[1e-2] < 40
    assert 30 < counts[1e-3] < 200


def test_min_samples_budget_and_all_tied_rewards():
    prior = normal_prior()
    policy = ShapePandora(10.0, min_samples=5, max_samples=50, prior=prior)
    assert run(policy, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]) == 5  # a huge cost stops at min_samples
    tied = ShapePandora(1e-3, max_samples=20, prior=prior)
    assert run(tied, [1.0] * 30) == 20
    assert tied.stop_reason == "budget"


def test_replay_makes_a_fresh_cost_prior_per_deployment():
    made = ShapePandora.deployment_prior()
    assert isinstance(made, CostShapePrior) and made is not ShapePandora.deployment_prior()


def test_threshold_and_acceptance_estimate_are_reported_when_warm():
    policy = ShapePandora(1e-3, max_samples=960, prior=normal_prior())
    assert policy.threshold is None
    for reward in np.random.default_rng(5).normal(size=20):
        if policy.observe(float(reward)):
            break
    assert policy.threshold is not None and 0.0 < policy.acceptance_estimate <= 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cost": 0.0},
        {"cost": math.inf},
        {"cost": 1e-3, "alpha": 1.0},
        {"cost": 1e-3, "inflation": 0},
    ],
)
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        ShapePandora(**kwargs)


def test_histogram_geometry_matches_the_shape_prior():
    # CostShape reads ShapePrior's bins: a draw of exactly 0 lands in the bin centred near 0
    prior = cost_shape_prior()
    idx = int((0.0 - Z_LO) / (Z_HI - Z_LO) * Z_BINS)
    prior.z_counts[idx] = 1.0
    prior.s_counts[0] = 1.0
    shape = CostShape.from_prior(prior, 0.99)
    assert abs(shape.z[0]) <= (Z_HI - Z_LO) / Z_BINS


def test_policy_keeps_to_its_cold_start_when_prompts_do_not_share_a_shape():
    prior = normal_prior()
    assert moments(1e-3, prior=prior).warm
    prior.tail_hits_sq *= 10.0  # the same counts, far more spread across requests
    assert prior.dispersion > 1.6
    assert not moments(1e-3, prior=prior).warm


def _learned(family: str, requests: int, seed: int) -> CostShapePrior:
    """A cost prior taught by ``requests`` requests of 30-150 rewards of a synth family."""
    from stoppers.replay.synth import SynthSpec, generate

    rows = generate(SynthSpec(family=family, prompts=requests, samples=150, seed=seed))["rewards"]
    rng = np.random.default_rng(seed)
    prior = cost_shape_prior()
    for row in rows:
        prior.update(row[: int(rng.integers(30, 151))].tolist())
    return prior


def test_a_smeared_upper_end_sends_the_trusted_shape_to_the_likelihood_path():
    """Rewards with a hard upper end: the recorded shape (draws standardised by running
    moments) grows a tail past the end that the streams' maxima refute, so the moment path
    steps aside; on normal rewards the streams' maxima agree with it and it stays."""
    ended = _learned("reflected-exponential", 60, seed=1)
    normal = _learned("normal", 60, seed=1)
    for prior, refuted in ((ended, True), (normal, False)):
        shape = CostShape.from_prior(prior, 0.99)
        assert tail_excess(prior, shape) is refuted
        policy = ShapePandora(1e-3, max_samples=960, prior=prior)
        assert policy.warm
        assert (policy.shape is None) is refuted  # refuted: the fitted shape decides
        assert (policy.fitted_shape is not None) is refuted
    # the statistic itself: about one draw's worth of mass above each normal stream's maximum
    n, z_max = normal.stream_maxima()
    shape = CostShape.from_prior(normal, 0.99)
    above = [shape.p[shape.z > z].sum() for z in z_max]
    assert 0.6 < float(np.mean(n * np.asarray(above))) < 1.4


def test_an_end_the_streams_read_sends_the_trusted_shape_to_the_likelihood_path():
    """Where the streams' maxima do not yet refute the recorded shape (``tail_excess``), a
    likelihood fit that the streams end (a bounded tail, ``FittedShape.ended``) still takes the
    request off the moment path: that path's recorded shape smears the end into a tail."""
    from stoppers.replay.synth import SynthSpec, generate

    rows = generate(SynthSpec(family="uniform", prompts=150, samples=150, seed=2))["rewards"][:30]
    rng = np.random.default_rng(2)
    prior = cost_shape_prior()
    for row in rows:
        prior.update(row[: int(rng.integers(24, 80))].tolist())
    assert not tail_excess(prior, CostShape.from_prior(prior, 0.99))
    fitted = prior.fitted_shape()
    assert fitted.ended
    policy = ShapePandora(1e-3, max_samples=960, prior=prior)
    assert policy.warm
    assert policy.shape is None and policy.fitted_shape is fitted
