"""ShapePandora: cost mode on a deployment-learned shape (cold start = TailPandora)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from stoppers.robust.cost import TailPandora
from stoppers.robust.shape_cost import (
    COST_PRIOR_MIN_REWARDS,
    CostShape,
    CostShapePrior,
    ShapePandora,
    cost_shape_prior,
)
from stoppers.robust.stop_table import Z_BINS, Z_HI, Z_LO


def _learned(draws, requests: int = 40, n: int = 80, seed: int = 0) -> CostShapePrior:
    """A prior that learned from ``requests`` full runs of ``draws(rng, n)`` rewards."""
    rng = np.random.default_rng(seed)
    prior = cost_shape_prior()
    for _ in range(requests):
        loc, scale = rng.normal(0.0, 2.0), math.exp(rng.normal(0.0, 0.4))
        assert prior.update((loc + scale * draws(rng, n)).tolist())
    return prior


def _normal_prior() -> CostShapePrior:
    return _learned(lambda rng, n: rng.standard_normal(n))


def _ar(d):
    e = np.exp(np.minimum(d, 0.0))
    return np.minimum(2.0 * e / (1.0 + e), 1.0)


def _run(policy, stream) -> int:
    for reward in stream:
        if policy.observe(float(reward)):
            break
    return policy.n


def test_cold_start_is_tail_pandora_decision_for_decision():
    rng = np.random.default_rng(1)
    young = cost_shape_prior()
    young.update(rng.normal(size=60).tolist())  # one request: not warm yet
    for prior in (None, young):
        for seed in range(20):
            stream = np.random.default_rng(seed).standard_t(3.0, 400)
            mine = ShapePandora(1e-3, max_samples=400, prior=prior)
            assert not mine.warm
            ref = TailPandora(1e-3, max_samples=400)
            assert _run(mine, stream) == _run(ref, stream)
            assert (mine.best, mine.stop_reason) == (ref.best, ref.stop_reason)
            assert mine.threshold == ref.threshold


def test_gain_matches_brute_force_integral_over_the_parameter_grid():
    shape = CostShape.from_prior(_normal_prior(), 0.99)
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
    shape = CostShape.from_prior(_normal_prior(), 0.99)
    gains = [shape.expected_gain(b, 1.0, 0.1, 0.05) for b in np.linspace(-1.0, 4.0, 26)]
    assert all(g1 >= g2 for g1, g2 in itertools.pairwise(gains))
    assert gains[0] > 1e-2 and gains[-1] < 1e-6


def test_uncertain_parameters_raise_the_gain():
    shape = CostShape.from_prior(_normal_prior(), 0.99)
    sure = shape.expected_gain(1.8, 1.0, 0.0, 0.0)
    unsure = shape.expected_gain(1.8, 1.0, 0.4, 0.2)
    assert unsure > sure * 1.2


def test_warm_policy_samples_about_what_the_known_distribution_needs():
    prior = _normal_prior()
    rng = np.random.default_rng(7)
    counts = {}
    for cost in (1e-2, 1e-3):
        n = []
        for _ in range(30):
            policy = ShapePandora(cost, max_samples=960, prior=prior)
            assert policy.warm
            n.append(_run(policy, rng.normal(0.5, 1.7, 960)))
            assert policy.stop_reason == "threshold"
            assert policy.expected_gain <= cost
        counts[cost] = float(np.mean(n))
    # Weitzman's oracle on normal rewards samples ~15 (c = 1e-2) and ~65 (c = 1e-3)
    assert 8 <= counts[1e-2] < 40
    assert 30 < counts[1e-3] < 200


def test_min_samples_budget_and_all_tied_rewards():
    prior = _normal_prior()
    policy = ShapePandora(10.0, min_samples=5, max_samples=50, prior=prior)
    assert _run(policy, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]) == 5  # a huge cost stops at min_samples
    tied = ShapePandora(1e-3, max_samples=20, prior=prior)
    assert _run(tied, [1.0] * 30) == 20
    assert tied.stop_reason == "budget"


def test_prior_learns_scale_from_short_requests_and_shape_only_from_long_ones():
    prior = cost_shape_prior()
    assert prior.update([0.1, 0.2]) is False
    assert prior.update([0.1, 0.4, 0.2, 0.9]) is True  # scale only
    assert prior.shape_requests == 0 and prior.requests == 1
    assert prior.s_counts.sum() == 1 and prior.z_counts.sum() == 0
    long = np.random.default_rng(0).normal(size=COST_PRIOR_MIN_REWARDS + 10)
    assert prior.update(long.tolist()) is True
    assert (prior.shape_requests, prior.requests) == (1, 2)
    assert prior.z_counts.sum() == 10  # draws 25..34, each against the mean/sd before it


def test_prior_round_trips_through_json_with_identical_decisions():
    prior = _normal_prior()
    restored = CostShapePrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    assert isinstance(restored, CostShapePrior)
    assert restored.min_rewards == COST_PRIOR_MIN_REWARDS
    assert restored.shape_requests == prior.shape_requests == 40
    assert restored.to_dict() == prior.to_dict()
    stream = np.random.default_rng(3).normal(size=960)
    a = ShapePandora(1e-3, max_samples=960, prior=prior)
    b = ShapePandora(1e-3, max_samples=960, prior=restored)
    assert _run(a, stream) == _run(b, stream) and a.best == b.best


def test_replay_makes_a_fresh_cost_prior_per_deployment():
    made = ShapePandora.deployment_prior()
    assert isinstance(made, CostShapePrior) and made is not ShapePandora.deployment_prior()


def test_threshold_and_acceptance_estimate_are_reported_when_warm():
    policy = ShapePandora(1e-3, max_samples=960, prior=_normal_prior())
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


def test_dispersion_is_about_one_for_a_shared_shape_and_large_for_different_shapes():
    shared = _learned(lambda rng, n: rng.standard_normal(n), requests=60, n=200)
    assert 0.5 < shared.dispersion < 1.6

    def two_shapes(rng, n):  # half the prompts normal, half with a better mode (25% at +3)
        bulk = rng.standard_normal(n)
        if rng.random() < 0.5:
            return bulk
        return np.where(rng.random(n) < 0.25, rng.normal(3.0, 0.5, n), bulk)

    assert _learned(two_shapes, requests=60, n=200).dispersion > 1.6
    restored = CostShapePrior.from_dict(json.loads(json.dumps(shared.to_dict())))
    assert restored.dispersion == pytest.approx(shared.dispersion)


def _moments(cost, **kwargs) -> ShapePandora:
    """ShapePandora without its likelihood path: the recorded shape, moment errors, tests."""
    return ShapePandora(cost, likelihood=False, **kwargs)


def test_policy_keeps_to_its_cold_start_when_prompts_do_not_share_a_shape():
    prior = _normal_prior()
    assert _moments(1e-3, prior=prior).warm
    prior.tail_hits_sq *= 10.0  # the same counts, far more spread across requests
    assert prior.dispersion > 1.6
    assert not _moments(1e-3, prior=prior).warm


def _clipped(rng, n):
    """Normal rewards clipped at 2 and rounded to 0.1 around a random level (the judge-score
    shape): prompts far from the clip look normal, prompts near it pile up at the clip."""
    level = rng.normal(0.0, 1.0)
    return np.round(np.clip(level + rng.standard_normal(n), -2.0, 2.0) / 0.1) * 0.1 - level


def _each_its_own_family(rng, n):
    """Every prompt draws one of four standardised families (the body of the shape differs)."""
    pick = rng.integers(4)
    if pick == 0:
        return rng.standard_normal(n)
    if pick == 1:
        return rng.exponential(1.0, n) - 1.0
    if pick == 2:
        return rng.standard_t(3.0, n) / math.sqrt(3.0)
    return (rng.gumbel(0.0, 1.0, n) - np.euler_gamma) / (math.pi / math.sqrt(6.0))


def test_whole_shape_dispersion_is_about_one_when_shared_and_large_when_bodies_differ():
    for draws in (
        lambda rng, n: rng.standard_normal(n),
        lambda rng, n: rng.gumbel(0.0, 1.0, n),
        lambda rng, n: rng.exponential(1.0, n),
    ):
        shared = _learned(draws, requests=40, n=120)
        assert 0.6 < shared.shape_dispersion < 1.6
    # Prompts whose shapes differ in the body (a clip at a different place, another family)
    # are told apart, and the policy keeps to its cold start ...
    for draws in (_clipped, _each_its_own_family):
        prior = _learned(draws, requests=40, n=120)
        assert prior.shape_dispersion > 1.6
        assert not _moments(1e-3, prior=prior).warm
    # (with its likelihood path the policy decides on continuous rewards whatever the tests
    # say, and keeps to its cold start on tied ones: tests/test_robust_likelihood_cost.py)
    assert not ShapePandora(1e-3, prior=_learned(_clipped, requests=40, n=120)).warm
    # ... also where their fractions above 1.5 agree and the tail test alone would trust them
    assert _learned(_each_its_own_family, requests=40, n=120).dispersion < 1.6


def test_whole_shape_dispersion_survives_persistence_and_old_snapshots_are_not_trusted():
    prior = _normal_prior()
    assert _moments(1e-3, prior=prior).warm
    restored = CostShapePrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    assert restored.shape_dispersion == pytest.approx(prior.shape_dispersion)
    assert _moments(1e-3, prior=restored).warm
    old = prior.to_dict()
    for key in ("bin_hits", "bin_hits_sq", "bin_requests", "bin_draws"):
        del old[key]  # saved before the whole-shape test existed
    stale = CostShapePrior.from_dict(old)
    assert stale.shape_requests == prior.shape_requests and stale.shape_dispersion is None
    assert not _moments(1e-3, prior=stale).warm  # cannot test the shape: cold start
    # requests learned after the restore give the test its counts (and only theirs)
    rng = np.random.default_rng(5)
    for _ in range(12):
        stale.update((rng.normal() + rng.standard_normal(80)).tolist())
    assert stale.bin_requests == 12 and stale.shape_requests == prior.shape_requests + 12
    assert 0.5 < stale.shape_dispersion < 1.6
    assert _moments(1e-3, prior=stale).warm
    with pytest.raises(ValueError, match="bin_hits"):
        CostShapePrior.from_dict({**prior.to_dict(), "bin_hits": [1.0, 2.0]})
    with pytest.raises(ValueError, match="bin_hits_sq"):
        CostShapePrior.from_dict({**prior.to_dict(), "bin_hits_sq": [-1.0] * 7})


def test_shape_test_report_counts_trusted_deployments(tmp_path, capsys):
    from stoppers.replay.synth import SynthSpec, generate
    from stoppers.robust.shape_test_report import dispersion_runs, main

    pools = {
        f: generate(SynthSpec(family=f, prompts=32, samples=300))["rewards"]
        for f in ("normal", "mixed")
    }
    runs = {f: dispersion_runs(r, 1e-3, orderings=4, after=(8, 24)) for f, r in pools.items()}
    for run in runs.values():
        assert len(run[24]["trusted"]) >= 3  # deployments that learned from >= 24 requests
        # after 8 requests the pooled draws are too few to know the 0.99-quantile
        assert not any(run[8]["trusted"])
    # a shared normal shape is trusted in most deployments, one family per prompt in few
    assert np.mean(runs["normal"][24]["trusted"]) > np.mean(runs["mixed"][24]["trusted"])
    path = tmp_path / "normal.npz"
    np.savez(path, rewards=pools["normal"])
    main([str(path), "--prompts", "16", "--orderings", "3"])
    report = json.loads(capsys.readouterr().out)
    assert report["after 8 shape requests"]["deployments"] == 3
    assert 0.0 <= report["after 8 shape requests"]["trusted"] <= 1.0
