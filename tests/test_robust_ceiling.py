"""The deployment's reward ceiling (stoppers.robust.ceiling) and the policies that stop at it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stoppers.robust.bayes_cost import BayesShapePandora
from stoppers.robust.ceiling import CEILING_REQUESTS, RewardCeiling, ceiling_of
from stoppers.robust.pooled_target import PooledTargetAcceptance
from stoppers.robust.prior import TailPrior
from stoppers.robust.shape_cost import CostShapePrior, ShapePandora
from stoppers.robust.shape_prior import ShapePrior

TOP = 9.21024  # the AlpacaEval judge's clipped logit, the kind of bound this is for


def test_the_top_counts_once_per_request_and_resets_when_exceeded():
    ceiling = RewardCeiling()
    assert ceiling.bound is None
    ceiling.note([1.0, TOP, TOP, 2.0])  # twice in one request: one request
    ceiling.note([TOP, 0.0])
    assert (ceiling.top, ceiling.requests, ceiling.bound) == (TOP, 2, None)
    ceiling.note([3.0])  # below the top: teaches nothing
    ceiling.note([math.nan, TOP])  # non-finite rewards are ignored
    assert ceiling.requests == CEILING_REQUESTS == 3 and ceiling.bound == TOP
    ceiling.note([])
    ceiling.note([TOP + 0.5])  # not a bound after all: start over at the new top
    assert (ceiling.top, ceiling.requests, ceiling.bound) == (TOP + 0.5, 1, None)


def test_continuous_rewards_never_establish_a_ceiling():
    rng = np.random.default_rng(0)
    prior = ShapePrior()
    for _ in range(300):
        prior.update(rng.normal(rng.normal(0, 2), 1.0, size=int(rng.integers(4, 40))))
    assert prior.ceiling.requests == 1 and ceiling_of(prior) is None


def test_a_clipped_scale_establishes_its_upper_clip():
    rng = np.random.default_rng(1)
    prior = ShapePrior()
    for _ in range(60):
        prior.update(np.round(np.clip(rng.normal(rng.normal(0, 2), 1.0, 20), -2, 2), 1))
    assert ceiling_of(prior) == 2.0


def test_every_request_teaches_the_ceiling_even_those_the_shape_skips():
    """All tied at the top (no sd) and short requests say the most about a bound."""
    target, cost = ShapePrior(), CostShapePrior()
    for prior in (target, cost):
        prior.update([TOP] * 8)  # all tied: the shape learns nothing
        prior.update([TOP, 1.0])  # too short for the shape
        prior.update([0.5, 1.0, TOP, 2.0] * 10)  # long: learned by the shape too
        assert prior.ceiling.requests == 3 and ceiling_of(prior) == TOP
    assert target.requests == 1  # the shape's own count is unchanged by the ceiling


def test_the_ceiling_survives_a_json_round_trip_and_old_snapshots_have_none():
    for cls in (ShapePrior, CostShapePrior):
        prior = cls()
        for _ in range(3):
            prior.update([0.0, 1.0, TOP, 2.0] * 8)
        restored = cls.from_dict(json.loads(json.dumps(prior.to_dict())))
        assert restored.ceiling == prior.ceiling and ceiling_of(restored) == TOP
        old = prior.to_dict()
        del old["ceiling"]
        assert cls.from_dict(old).ceiling == RewardCeiling()
    assert RewardCeiling.from_dict(RewardCeiling().to_dict()) == RewardCeiling()


@pytest.mark.parametrize(
    "data",
    [
        "9.2",
        {"top": "9.2", "requests": 3},
        {"top": True, "requests": 3},
        {"top": float("nan"), "requests": 3},
        {"top": 1.0, "requests": -1},
        {"top": 1.0, "requests": 2.5},
        {"top": None, "requests": 4},
        {"top": float("inf"), "requests": 4},
    ],
)
def test_a_hostile_snapshot_is_refused(data):
    with pytest.raises(ValueError, match="ceiling"):
        RewardCeiling.from_dict(data)
    snapshot = ShapePrior().to_dict() | {"ceiling": data}
    with pytest.raises(ValueError, match="ceiling"):
        ShapePrior.from_dict(snapshot)


def _established(prior):
    for _ in range(CEILING_REQUESTS):
        prior.update([0.0, 1.0, 0.5, TOP] * 6)
    return prior


def _policies(prior):
    return {
        "target": PooledTargetAcceptance(0.9, prior=prior, max_samples=64),
        "cost": ShapePandora(1e-3, prior=prior, max_samples=64),
        "bayes-cost": BayesShapePandora(1e-3, prior=prior, max_samples=64),
    }


def _run(policy, rewards):
    for reward in rewards:
        if policy.observe(reward):
            break
    return policy.n, policy.stop_reason


@pytest.mark.parametrize("mode", ["target", "cost", "bayes-cost"])
def test_a_best_at_the_ceiling_stops_once_min_samples_are_in(mode):
    """Cold (3 requests learned: no shape trusted yet) and warm alike."""
    rewards = [TOP, 1.0, 0.5, 0.2, 0.7, 0.4, 0.3, 0.1, 0.6, 0.8] * 3
    cold = _policies(_established(CostShapePrior() if "cost" in mode else ShapePrior()))[mode]
    assert _run(cold, rewards) == (8, "ceiling")  # min_samples (8) first
    late = [0.5, 0.2, 0.7, 0.4, 0.3, 0.1, 0.6, 0.8, 0.9, TOP, 0.1] * 3
    cold = _policies(_established(CostShapePrior() if "cost" in mode else ShapePrior()))[mode]
    n, reason = _run(cold, late)
    assert n <= 10  # its own rule may stop earlier; it never samples past the top
    if n == 10:
        assert reason == "ceiling"


@pytest.mark.parametrize("mode", ["target", "cost", "bayes-cost"])
def test_no_ceiling_stop_without_an_established_bound(mode):
    prior = CostShapePrior() if "cost" in mode else ShapePrior()
    for _ in range(CEILING_REQUESTS - 1):
        prior.update([0.0, 1.0, 0.5, TOP] * 6)
    rewards = [TOP] + [0.5, 0.2, 0.7, 0.4, 0.3, 0.1, 0.6] * 9
    assert _run(_policies(prior)[mode], rewards)[1] != "ceiling"
    # above the learned top: a new best, not a ceiling
    prior = _established(CostShapePrior() if "cost" in mode else ShapePrior())
    assert _run(_policies(prior)[mode], [TOP + 1.0, *rewards[1:]])[1] != "ceiling"


def test_priors_without_a_ceiling_change_nothing():
    assert ceiling_of(None) is None and ceiling_of(TailPrior()) is None
    policy = ShapePandora(1e-3, prior=TailPrior(), max_samples=64)
    assert _run(policy, [TOP] * 8 + [0.0] * 56)[1] != "ceiling"
