"""CostShapePrior: what cost mode's deployment prior learns and persists; its shared-shape tests."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stoppers.robust.cost_prior import COST_PRIOR_MIN_REWARDS, CostShapePrior, cost_shape_prior
from stoppers.robust.shape_cost import ShapePandora
from tests.learned_priors import learned, moments, normal_prior, run


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
    prior = normal_prior()
    restored = CostShapePrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    assert isinstance(restored, CostShapePrior)
    assert restored.min_rewards == COST_PRIOR_MIN_REWARDS
    assert restored.shape_requests == prior.shape_requests == 40
    assert restored.to_dict() == prior.to_dict()
    stream = np.random.default_rng(3).normal(size=960)
    a = ShapePandora(1e-3, max_samples=960, prior=prior)
    b = ShapePandora(1e-3, max_samples=960, prior=restored)
    assert run(a, stream) == run(b, stream) and a.best == b.best


def test_dispersion_is_about_one_for_a_shared_shape_and_large_for_different_shapes():
    shared = learned(lambda rng, n: rng.standard_normal(n), requests=60, n=200)
    assert 0.5 < shared.dispersion < 1.6

    def two_shapes(rng, n):  # half the prompts normal, half with a better mode (25% at +3)
        bulk = rng.standard_normal(n)
        if rng.random() < 0.5:
            return bulk
        return np.where(rng.random(n) < 0.25, rng.normal(3.0, 0.5, n), bulk)

    assert learned(two_shapes, requests=60, n=200).dispersion > 1.6
    restored = CostShapePrior.from_dict(json.loads(json.dumps(shared.to_dict())))
    assert restored.dispersion == pytest.approx(shared.dispersion)


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
        shared = learned(draws, requests=40, n=120)
        assert 0.6 < shared.shape_dispersion < 1.6
    # Prompts whose shapes differ in the body (a clip at a different place, another family)
    # are told apart, and the policy keeps to its cold start ...
    for draws in (_clipped, _each_its_own_family):
        prior = learned(draws, requests=40, n=120)
        assert prior.shape_dispersion > 1.6
        assert not moments(1e-3, prior=prior).warm
    # (with its likelihood path the policy decides on continuous rewards whatever the tests
    # say, and keeps to its cold start on tied ones: tests/test_robust_likelihood_cost.py)
    assert not ShapePandora(1e-3, prior=learned(_clipped, requests=40, n=120)).warm
    # ... also where their fractions above 1.5 agree and the tail test alone would trust them
    assert learned(_each_its_own_family, requests=40, n=120).dispersion < 1.6


def test_whole_shape_dispersion_survives_persistence_and_old_snapshots_are_not_trusted():
    prior = normal_prior()
    assert moments(1e-3, prior=prior).warm
    restored = CostShapePrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    assert restored.shape_dispersion == pytest.approx(prior.shape_dispersion)
    assert moments(1e-3, prior=restored).warm
    old = prior.to_dict()
    for key in ("bin_hits", "bin_hits_sq", "bin_requests", "bin_draws"):
        del old[key]  # saved before the whole-shape test existed
    stale = CostShapePrior.from_dict(old)
    assert stale.shape_requests == prior.shape_requests and stale.shape_dispersion is None
    assert not moments(1e-3, prior=stale).warm  # cannot test the shape: cold start
    # requests learned after the restore give the test its counts (and only theirs)
    rng = np.random.default_rng(5)
    for _ in range(12):
        stale.update((rng.normal() + rng.standard_normal(80)).tolist())
    assert stale.bin_requests == 12 and stale.shape_requests == prior.shape_requests + 12
    assert 0.5 < stale.shape_dispersion < 1.6
    assert moments(1e-3, prior=stale).warm
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
    for deployments in runs.values():
        assert len(deployments[24]["trusted"]) >= 3  # deployments that learned from >= 24 requests
        # after 8 requests the pooled draws are too few to know the 0.99-quantile
        assert not any(deployments[8]["trusted"])
    # a shared normal shape is trusted in most deployments, one family per prompt in few
    assert np.mean(runs["normal"][24]["trusted"]) > np.mean(runs["mixed"][24]["trusted"])
    path = tmp_path / "normal.npz"
    np.savez(path, rewards=pools["normal"])
    main([str(path), "--prompts", "16", "--orderings", "3"])
    report = json.loads(capsys.readouterr().out)
    assert report["after 8 shape requests"]["deployments"] == 3
    assert 0.0 <= report["after 8 shape requests"]["trusted"] <= 1.0
