"""The deployment-prior contract between the gateway and the default policies."""

from __future__ import annotations

import numpy as np
import pytest

import stoppers


@pytest.mark.parametrize("mode", ["cost", "target"])
def test_new_prior_satisfies_protocol_and_learns_from_a_finished_request(mode):
    prior = stoppers.new_deployment_prior(mode)
    assert isinstance(prior, stoppers.DeploymentPrior)
    before = prior.to_dict()
    factory = stoppers.default_cost_policy if mode == "cost" else stoppers.default_target_policy
    policy = factory(0.01 if mode == "cost" else 0.9, max_samples=24, prior=prior)
    seen = []
    for reward in np.random.default_rng(3).standard_t(3, size=24):
        seen.append(float(reward))
        if policy.observe(float(reward)):
            break
    assert prior.update(seen) is True
    assert prior.to_dict() != before


def test_too_few_rewards_teach_nothing():
    prior = stoppers.new_deployment_prior("cost")
    assert prior.update([0.1, 0.2]) is False


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode must be"):
        stoppers.new_deployment_prior("fixed")


def test_default_cost_policy_is_tail_pandora_until_the_cost_prior_is_trusted():
    from stoppers.robust.cost import TailPandora
    from stoppers.robust.shape_cost import ShapePandora

    prior = stoppers.new_deployment_prior("cost")
    rng = np.random.default_rng(7)

    def serve(policy, stream):
        for reward in stream:
            if policy.observe(float(reward)):
                break
        return policy

    warm_at = None
    for request in range(60):
        stream = rng.normal() + np.exp(rng.normal(0.0, 0.4)) * rng.standard_normal(200)
        policy = stoppers.default_cost_policy(1e-4, max_samples=200, prior=prior)
        assert isinstance(policy, ShapePandora)
        assert policy.uses_learned_prior == policy.warm  # what the gateway counts
        if not policy.warm:
            # the cold start decides exactly as TailPandora with the deployment's learned
            # tail-shape distribution on the same stream
            ref = serve(TailPandora(1e-4, max_samples=200, prior=prior.xi), stream)
            assert serve(policy, stream).n == ref.n and policy.best == ref.best
        elif warm_at is None:
            warm_at = request
            serve(policy, stream)
        else:
            serve(policy, stream)
        prior.update(stream[: policy.n].tolist())  # what the gateway does when it finishes
    # shared normal shape: trusted once 8 requests pooled >= 1000 draws
    assert warm_at is not None and 8 <= warm_at < 40
    # another class of prior (the target prior) is not read as a cost prior
    target_prior = stoppers.new_deployment_prior("target")
    for _ in range(40):
        assert target_prior.update(rng.standard_normal(200).tolist())
    assert not stoppers.default_cost_policy(1e-4, max_samples=200, prior=target_prior).warm


def test_default_target_policy_says_when_it_decides_on_the_learned_prior():
    prior = stoppers.new_deployment_prior("target")
    assert not stoppers.default_target_policy(0.9, max_samples=100, prior=prior).uses_learned_prior
    rng = np.random.default_rng(2)
    for _ in range(12):
        assert prior.update((rng.normal() + rng.standard_normal(60)).tolist())
    policy = stoppers.default_target_policy(0.9, max_samples=100, prior=prior)
    assert policy.uses_learned_prior and not policy.cold
    assert not stoppers.FixedN(4).uses_learned_prior
