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
