"""The ends of the deployment's reward scale (stoppers.robust.ceiling) and the policies that read
them: they stop at the ceiling, and price the chance of a better reward at the floor."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import integrate

from stoppers.robust.bayes_cost import BayesShapePandora
from stoppers.robust.ceiling import (
    CEILING_REQUESTS,
    RewardCeiling,
    RewardFloor,
    ceiling_of,
    floor_acceptance_bound,
    floor_gain_bound,
    floor_of,
)
from stoppers.robust.cost import TailPandora
from stoppers.robust.pooled_target import PooledTargetAcceptance
from stoppers.robust.prior import TailPrior
from stoppers.robust.shape_cost import CostShapePrior, ShapePandora
from stoppers.robust.shape_prior import ShapePrior
from stoppers.robust.target import TailTargetAcceptance

TOP = 9.21024  # the AlpacaEval judge's clipped logit, the kind of bound this is for


def test_the_top_counts_once_per_request_and_resets_when_exceeded():
    ceiling = RewardCeiling()
    assert ceiling.bound is None
    ceiling.note([1.0, TOP, TOP, 2.0])  # twice in one request: one request
    ceiling.note([TOP, 0.0])
    assert (ceiling.value, ceiling.requests, ceiling.bound) == (TOP, 2, None)
    ceiling.note([3.0])  # below the top: teaches nothing
    ceiling.note([math.nan, TOP])  # non-finite rewards are ignored
    assert ceiling.requests == CEILING_REQUESTS == 3 and ceiling.bound == TOP
    ceiling.note([])
    ceiling.note([TOP + 0.5])  # not a bound after all: start over at the new top
    assert (ceiling.value, ceiling.requests, ceiling.bound) == (TOP + 0.5, 1, None)


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


BOTTOM = -9.21024  # the AlpacaEval judge's lower clip: most of that pool's entries sit there


def test_the_floor_mirrors_the_ceiling():
    floor = RewardFloor()
    assert floor.bound is None and floor_of(None) is None
    floor.note([1.0, BOTTOM, BOTTOM, 2.0])  # twice in one request: one request
    floor.note([BOTTOM, 0.0])
    floor.note([-3.0, math.nan])  # above the bottom: teaches nothing
    assert (floor.value, floor.requests, floor.bound) == (BOTTOM, 2, None)
    floor.note([BOTTOM])
    assert floor.bound == BOTTOM
    floor.note([BOTTOM - 0.5])  # not a bound after all
    assert (floor.value, floor.requests, floor.bound) == (BOTTOM - 0.5, 1, None)
    for cls in (ShapePrior, CostShapePrior):
        prior = cls()
        for i in range(CEILING_REQUESTS):
            prior.update([BOTTOM, 1.0, 0.0, 2.0 + i] * 8)
        assert floor_of(prior) == BOTTOM and ceiling_of(prior) is None
        restored = cls.from_dict(json.loads(json.dumps(prior.to_dict())))
        assert restored.floor == prior.floor and floor_of(restored) == BOTTOM
        old = prior.to_dict()
        del old["floor"]
        assert cls.from_dict(old).floor == RewardFloor()
        for bad in ({"bottom": "x"}, {"bottom": -math.inf, "requests": 3}, [BOTTOM]):
            with pytest.raises(ValueError, match="floor"):
                cls.from_dict(prior.to_dict() | {"floor": bad})


def test_the_floor_gain_bound_is_the_integral_it_claims():
    """E[p 1{p > 1 - alpha}] under p ~ Beta(1, n + 1), by quadrature; and 1 - alpha^(n+1)."""
    for n in (1, 8, 32, 100, 400):
        density = lambda p, n=n: p * (n + 1) * (1 - p) ** n  # noqa: E731
        exact, _ = integrate.quad(density, 0.01, 1.0, points=[0.05, 0.2])
        assert floor_gain_bound(n, 0.99) == pytest.approx(exact, rel=1e-6)
        mass, _ = integrate.quad(lambda p, n=n: (n + 1) * (1 - p) ** n, 0.0, 0.01)
        assert floor_acceptance_bound(n, 0.99) == pytest.approx(mass, rel=1e-9)
    gains = [floor_gain_bound(n, 0.99) for n in range(1, 600)]
    assert all(a > b for a, b in itertools.pairwise(gains))


def _stop_at(cost, alpha=0.99):
    return next(n for n in range(1, 10_000) if floor_gain_bound(n, alpha) <= cost)


@pytest.mark.parametrize("cost", [1e-2, 1e-3])
def test_all_rewards_at_the_floor_are_no_point_mass(cost):
    """Without a floor, 32 identical rewards stop the cold start ("tied"); at the deployment's
    floor the rule of succession decides: ~79 draws at c = 1e-2, ~260 at 1e-3."""
    stream = [BOTTOM] * 960
    assert _run(TailPandora(cost, max_samples=960), stream) == (32, "tied")
    n, reason = _run(TailPandora(cost, max_samples=960, floor=BOTTOM), stream)
    assert (n, reason) == (_stop_at(cost), "floor") and 60 < n < 300
    target = TailTargetAcceptance(0.9, max_samples=960, floor=BOTTOM)
    n_target = next(n for n in range(1, 960) if floor_acceptance_bound(n, 0.99) >= 0.9)
    assert _run(target, stream) == (n_target, "floor")
    assert _run(TailTargetAcceptance(0.9, max_samples=960), stream) == (16, "tied")
    # a point mass elsewhere than the floor is still one
    assert _run(TailPandora(cost, max_samples=960, floor=BOTTOM), [0.5] * 960) == (32, "tied")


def _floored(prior):
    for i in range(CEILING_REQUESTS):
        prior.update([BOTTOM, 1.0, 0.0, 2.0 + i] * 8)
    return prior


@pytest.mark.parametrize("mode", ["target", "cost", "bayes-cost"])
def test_the_policies_read_the_floor_cold_and_warm(mode):
    """A good response after 40 draws at the floor is found (the point-mass rule stopped at 32
    before); a request that stays at the floor stops on the rule of succession."""
    prior = _floored(CostShapePrior() if "cost" in mode else ShapePrior())
    late_good = [BOTTOM] * 40 + [3.0] + [BOTTOM] * 919
    n, reason = _run(_policies(prior)[mode], late_good)
    assert n > 40 and reason != "tied"
    policy = {
        "target": PooledTargetAcceptance(0.9, prior=prior, max_samples=960),
        "cost": ShapePandora(1e-3, prior=prior, max_samples=960),
        "bayes-cost": BayesShapePandora(1e-3, prior=prior, max_samples=960),
    }[mode]
    expected = (
        next(n for n in range(1, 960) if floor_acceptance_bound(n, 0.99) >= 0.9)
        if mode == "target"
        else _stop_at(1e-3)
    )
    assert _run(policy, [BOTTOM] * 960) == (expected, "floor")


def test_warm_policies_stop_at_the_floor_too():
    """Once the deployment trusts its shape the learned-shape rules decide; an all-floor request
    (no spread to standardise by) still stops on the rule of succession, not at the budget."""
    rng = np.random.default_rng(3)
    prior = CostShapePrior()
    for i in range(40):  # normal rewards; three requests reach the scale's bottom, -4
        rewards = rng.normal() + rng.standard_normal(60)
        rewards[0] = -4.0 if i < CEILING_REQUESTS else rewards[0]
        prior.update(np.maximum(rewards, -4.0))
    assert floor_of(prior) == -4.0
    policy = ShapePandora(1e-3, prior=prior, max_samples=960)
    assert policy.warm
    assert _run(policy, [-4.0] * 960) == (_stop_at(1e-3), "floor")
