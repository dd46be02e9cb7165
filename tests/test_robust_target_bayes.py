"""target_bayes: the Bayes target rule for normal rewards of unknown location and scale."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

from stoppers.robust.target_bayes import BayesTargetSpec, evaluate, fixed_curve, price, solve


def _ar(x):
    return min(1.0, 2.0 / (1.0 + np.exp(-x)))


def _small(spread=0.4, target=0.9):
    return BayesTargetSpec(target, spread, min_samples=4, horizon=24)


_SOLVED: dict = {}


def _solved(spread, multiplier):
    """Each (spread, multiplier) solved once for the module (~3 s each)."""
    key = (spread, multiplier)
    if key not in _SOLVED:
        _SOLVED[key] = solve(_small(spread), multiplier)
    return _SOLVED[key]


def _run(spread, multiplier, prompts, streams, seed):
    spec = _small(spread)
    return evaluate(
        spec,
        _solved(spread, multiplier),
        prompts=prompts,
        streams=streams,
        seed=seed,
        fixed_budget=400,
    )


@pytest.mark.parametrize("scale", [0.5, 1.0, 2.0])
def test_price_is_the_known_distribution_rules_gain_at_its_threshold(scale):
    lam, z = price(np.array([scale]), 0.9)
    za = norm.ppf(0.99)
    ar = lambda v: _ar(scale * (v - za))  # noqa: E731
    tail = norm.sf(z[0])
    conditional = integrate.quad(lambda v: ar(v) * norm.pdf(v), z[0], 12)[0] / tail
    assert conditional == pytest.approx(0.9, abs=0.003)  # the threshold delivers the target
    gain = integrate.quad(lambda v: max(ar(v) - ar(z[0]), 0) * norm.pdf(v), z[0], 12)[0]
    assert lam[0] == pytest.approx(gain, rel=0.02)


def test_fixed_curve_matches_simulated_best_of_n():
    rng = np.random.default_rng(0)
    curve = fixed_curve(1.3, 20)
    best = np.maximum.accumulate(rng.standard_normal((200_000, 20)), axis=1)
    simulated = np.minimum(2 / (1 + np.exp(-1.3 * (best - norm.ppf(0.99)))), 1).mean(axis=0)
    np.testing.assert_allclose(curve, simulated, atol=0.003)


def test_the_rule_stops_on_a_higher_best_whatever_the_sd():
    spec = _small()
    margins = _solved(0.4, 1.0)
    sd = np.exp(spec.log_sd_grid)
    for n in (4, 10, 20):
        # reachable states only: best - mean <= sd (n - 1) / sqrt(n)
        reachable = spec.d_grid[:, None] <= sd[None, :] * (n - 1) / np.sqrt(n)
        stop = np.where(reachable, margins[n] >= 0, True)
        # once stopping at some d, stopping at every larger d (an upper set in d)
        assert np.all(np.diff(stop.astype(int), axis=0) >= 0), n
        assert stop[reachable].any() and not stop[reachable].all(), n


def test_a_higher_price_buys_less_acceptance_with_fewer_samples():
    spec = _small()
    cheap = _run(0.4, 1.0, 12, 150, 1)
    dear = _run(0.4, 2.0, 12, 150, 1)
    assert np.mean([r.acceptance for r in dear]) < np.mean([r.acceptance for r in cheap])
    assert np.mean([r.samples for r in dear]) < np.mean([r.samples for r in cheap])
    assert all(spec.min_samples <= r.samples <= spec.horizon for r in cheap + dear)


def test_knowing_the_scale_saves_more_than_learning_it():
    """Same price, two priors on the scale: nearly known (spread 0.05) vs 0.4 (the spread of
    the AlpacaEval pool's log sd); the save falls when the rule must learn the scale."""
    saves = {}
    for spread in (0.05, 0.4):
        res = _run(spread, 1.0, 30, 200, 2)
        saves[spread] = np.median([r.save for r in res])
    assert saves[0.05] > saves[0.4] + 0.05


def test_spec_rejects_bad_input():
    with pytest.raises(ValueError, match="target"):
        BayesTargetSpec(1.2, 0.4)
    with pytest.raises(ValueError, match="spread"):
        BayesTargetSpec(0.9, 0.0)
    with pytest.raises(ValueError, match="min_samples"):
        BayesTargetSpec(0.9, 0.4, min_samples=50, horizon=40)
