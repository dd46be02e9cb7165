"""Target mode's multiplier rule (stoppers.robust.multiplier_target) and where the target
default uses it: deployments whose fitted shape has more than one mode."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize, special, stats

from stoppers.robust.likelihood_cost import EDGES, FittedShape
from stoppers.robust.multiplier_target import LOG_SCALES, MultiplierTargetRule, multipliers
from stoppers.robust.pooled_target import PooledTargetAcceptance
from stoppers.robust.shape_prior import ShapePrior

ALPHA = 0.99


def _normal() -> FittedShape:
    return FittedShape(p=np.diff(special.ndtr(EDGES)), requests=1, streams=1, tied=0.0)


def _ar(d: float) -> float:
    return 1.0 if d >= 0.0 else 2.0 * math.exp(d) / (1.0 + math.exp(d))


def _known_rule(s: float, target: float) -> tuple[float, float]:
    """(tau, lambda) for standardised normal rewards at scale s, by quadrature and Brent's
    method: E[AR(s(Z - z_alpha)) | Z >= tau] = target and lambda = E[(AR - AR(tau))+]."""
    za = stats.norm.ppf(ALPHA)

    def conditional(tau: float) -> float:
        mass, _ = integrate.quad(lambda z: _ar(s * (z - za)) * stats.norm.pdf(z), tau, za)
        return (mass + stats.norm.sf(za)) / stats.norm.sf(tau)

    tau = optimize.brentq(lambda v: conditional(v) - target, -6.0, za)
    base = _ar(s * (tau - za))
    below, _ = integrate.quad(lambda z: (_ar(s * (z - za)) - base) * stats.norm.pdf(z), tau, za)
    return tau, below + (1.0 - base) * stats.norm.sf(za)


@pytest.mark.parametrize("target", [0.7, 0.9, 0.95])
@pytest.mark.parametrize("s", [0.5, 1.0, 3.0])
def test_the_multiplier_is_the_known_distributions_cost_at_its_threshold(target, s):
    shape = _normal()
    table = multipliers(shape.p, shape.quantile(ALPHA), target)
    _, lam = _known_rule(s, target)
    got = math.exp(float(np.interp(math.log(s), LOG_SCALES, table)))
    assert got == pytest.approx(lam, rel=0.03)  # bins 0.05 wide, crossing read between edges
    # wider prompts: a steeper AR curve, a different multiplier; the table is not flat
    assert np.ptp(table) > 1.0


def test_with_the_parameters_pinned_the_rule_stops_at_the_known_threshold():
    """Many rewards pin m and s: the rule then stops iff the best passes tau."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.0, 4000)
    x = (x - x.mean()) / x.std(ddof=1)  # exactly m = 0, s = 1 by moments
    shape = _normal()
    rule = MultiplierTargetRule(shape, 0.9, alpha=ALPHA, scale_mu=0.0, scale_precision=1e-6)
    tau, _ = _known_rule(1.0, 0.9)
    assert rule.margin(x, tau + 0.15) < 0.0 < rule.margin(x, tau - 0.15)
    _, accepted = rule.evaluate(x, 3.0)
    assert accepted == pytest.approx(_ar(3.0 - stats.norm.ppf(ALPHA)), abs=0.02)


def _bimodal_rows(prompts: int, seed: int, n: int = 96, weight: float = 0.25) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(prompts):
        good = rng.random(n) < weight
        z = np.where(good, rng.normal(2.5, 0.5, n), rng.normal(0.0, 1.0, n))
        rows.append(rng.normal(0.0, 2.0) + math.exp(rng.normal(0.0, 0.4)) * z)
    return rows


def _learned(rows: list[np.ndarray]) -> ShapePrior:
    prior = ShapePrior()
    for row in rows:
        prior.update(row.tolist())
    return prior


def test_the_target_default_uses_it_where_the_shape_has_two_modes_only():
    bimodal = _learned(_bimodal_rows(30, seed=1))
    policy = PooledTargetAcceptance(0.9, prior=bimodal, max_samples=400)  # builds the table
    assert policy.uses_learned_prior and policy.multimodal
    assert bimodal.multimodal_shape() is not None and bimodal.multimodal_shape().modes == 2
    assert not PooledTargetAcceptance(0.9, prior=bimodal, multimodal=False).multimodal
    rng = np.random.default_rng(2)
    normal = _learned([rng.normal(rng.normal(0, 2), 1.0, 96) for _ in range(30)])
    plain = PooledTargetAcceptance(0.9, prior=normal, max_samples=400)
    assert plain.uses_learned_prior and not plain.multimodal
    assert normal.multimodal_shape() is None
    # rounded scores (a lattice): the likelihood shape cannot hold them, the table rule decides
    lattice = _learned([np.round(row * 2.0) / 2.0 for row in _bimodal_rows(30, seed=3)])
    assert lattice.tied_streams() > 0.01
    assert not PooledTargetAcceptance(0.9, prior=lattice, max_samples=400).multimodal


def _stopped_uniform(rng: np.random.Generator, most: int) -> np.ndarray:
    """A uniform prompt stopped as a target request stops: from 8 rewards, at the first best
    1.5 sds above the mean (at most ``most``)."""
    x = rng.normal() + math.exp(rng.normal(0.0, 0.4)) * rng.uniform(
        -math.sqrt(3), math.sqrt(3), most
    )
    for n in range(8, most + 1):
        if x[:n].max() - x[:n].mean() >= 1.5 * x[:n].std(ddof=1):
            break
    return x[:n]


def test_a_flat_top_that_the_streams_end_is_not_read_as_two_modes():
    """Short uniform streams fit with bumps on the flat top (two modes on 11 of 12 such
    deployments); where the streams end the tail, the table rule decides, not the multiplier
    rule."""
    rng = np.random.default_rng(10)
    prior = _learned([_stopped_uniform(rng, 60) for _ in range(30)])
    policy = PooledTargetAcceptance(0.9, prior=prior, max_samples=400)
    ((requests, (shape, ended)),) = prior._fitted.items()
    assert ended
    assert policy.uses_learned_prior and not policy.multimodal
    assert prior.multimodal_shape() is None
    prior._fitted[requests] = (shape, False)  # the same fit with its end unread: two modes
    assert prior.multimodal_shape() is not None and prior.multimodal_shape().modes > 1
    assert PooledTargetAcceptance(0.9, prior=prior, max_samples=400).multimodal
    # a bulk with a better mode: the streams do not end it, and the multiplier rule decides
    bimodal = _learned(_bimodal_rows(30, seed=1))
    assert PooledTargetAcceptance(0.9, prior=bimodal, max_samples=400).multimodal
    ((requests, (_, ended)),) = bimodal._fitted.items()
    assert not ended


def test_on_bimodal_prompts_it_delivers_the_target_and_reports_its_estimate():
    """Mean acceptance over fresh bimodal prompts within 0.04 of the target, and the stop is the
    rule's ("target"), with its posterior acceptance estimate reported."""
    prior = _learned(_bimodal_rows(40, seed=4))
    target = 0.9
    delivered, samples = [], []
    for row in _bimodal_rows(60, seed=5, n=960):
        kappa = float(np.quantile(row, ALPHA))
        policy = PooledTargetAcceptance(target, prior=prior, max_samples=960)
        assert policy.multimodal
        for reward in row:
            if policy.observe(float(reward)):
                break
        assert policy.stop_reason in ("target", "budget")
        if policy.stop_reason == "target":
            assert 0.0 < policy.acceptance_estimate <= 1.0
        assert policy.threshold is None
        delivered.append(_ar(policy.best - kappa))
        samples.append(policy.n)
    assert abs(np.mean(delivered) - target) < 0.04
    assert 8 <= np.median(samples) < 200


def test_tie_flags_follow_the_kept_streams_through_rolling_and_restore():
    """tied_streams() is kept in step as streams roll off (no recount per request) and agrees
    with a full recount, also after to_dict / from_dict."""
    from stoppers.robust.likelihood_cost import tied_fraction
    from stoppers.robust.shape_prior import STREAM_REQUESTS

    rng = np.random.default_rng(7)
    prior = ShapePrior()
    for k in range(STREAM_REQUESTS + 40):
        x = rng.normal(0.0, 1.0, 30)
        prior.update((np.round(x, 1) if k % 9 == 0 else x).tolist())
        if k % 50 == 0:
            assert prior.tied_streams() == pytest.approx(tied_fraction(prior.streams))
    assert len(prior.streams) == STREAM_REQUESTS
    assert prior.tied_streams() == pytest.approx(tied_fraction(prior.streams))
    restored = ShapePrior.from_dict(prior.to_dict())
    assert restored.tied_streams() == pytest.approx(prior.tied_streams())
    restored.update(np.round(rng.normal(0.0, 1.0, 30), 1).tolist())
    assert restored.tied_streams() == pytest.approx(tied_fraction(restored.streams))


def test_with_a_build_hook_the_rule_waits_for_the_built_table_and_its_fit():
    """The gateway builds tables on a worker thread (schedule_build): until a build is
    installed the request runs the cold start; after it, the build's fit is what the two-mode
    test reads - nothing is fitted on the caller's thread."""
    prior = _learned(_bimodal_rows(30, seed=8))
    asked = []
    prior.schedule_build = lambda p, key: asked.append(key)
    first = PooledTargetAcceptance(0.9, prior=prior, max_samples=400)
    assert not first.uses_learned_prior and not first.multimodal and asked
    assert prior.multimodal_shape() is None  # no build yet, so no fit to read
    key = asked[-1]
    prior.install(key, prior.prepare(key)())  # what the worker thread does
    second = PooledTargetAcceptance(0.9, prior=prior, max_samples=400)
    assert second.uses_learned_prior and second.multimodal
