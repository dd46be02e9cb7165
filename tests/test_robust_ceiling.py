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
    P_GRID,
    FloorBound,
    RewardCeiling,
    RewardFloor,
    ceiling_of,
    clipped_floor_of,
    floor_acceptance_bound,
    floor_gain_bound,
    floor_of,
    piles_up,
)
from stoppers.robust.cost import TailPandora
from stoppers.robust.cost_prior import CostShapePrior
from stoppers.robust.pooled_target import PooledTargetAcceptance
from stoppers.robust.prior import TailPrior
from stoppers.robust.shape_cost import ShapePandora
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


def _rounded_prompt(rng, loc, samples=100, clip=None, sd=0.6):
    """Normal rewards on a 1.25 lattice, clipped above at ``clip``."""
    x = 1.25 * np.round((loc + sd * rng.standard_normal(samples)) / 1.25)
    return x if clip is None else np.minimum(x, clip)


def test_the_top_level_of_rounded_scores_without_a_clip_is_no_ceiling():
    """The highest prompts' best levels coincide on a coarse lattice; none of them piles up
    there, so no ceiling (and the clipless lattice keeps its likelihood path)."""
    rng = np.random.default_rng(0)
    prior = CostShapePrior()
    for loc in (2.0, 2.0, 2.0, 0.5, 1.0, 2.0, 0.0, 2.0):
        prior.update(_rounded_prompt(rng, loc))
    assert prior.ceiling.requests >= CEILING_REQUESTS and prior.ceiling.piled == 0
    assert ceiling_of(prior) is None


def test_a_clipped_lattice_establishes_its_clip_once_a_request_piles_up():
    rng = np.random.default_rng(0)
    prior = CostShapePrior()
    for loc in (1.0, 1.0, 1.0):  # bulk under the clip: they reach it, without a pile-up
        prior.update(_rounded_prompt(rng, loc, clip=2.5))
    assert prior.ceiling.requests == 3 and ceiling_of(prior) is None
    prior.update(_rounded_prompt(rng, 2.5, clip=2.5, sd=1.0))  # the clip holds most of it
    assert prior.ceiling.piled == 1 and ceiling_of(prior) == 2.5


def test_piles_up():
    # the top level the mode of a rounded normal, and no reward ever above it: a clip
    assert piles_up(np.array([0.0] * 2 + [1.0] * 6 + [2.0] * 12 + [3.0] * 30))
    # the top level holds less than the one below and a normal's tail explains it: no clip
    assert not piles_up(np.array([0.0] * 4 + [1.0] * 12 + [2.0] * 20 + [3.0] * 8))
    assert not piles_up(np.array([0.0, 1.0, 1.0, 2.0, 2.0, 3.0]))  # one copy of the top
    assert piles_up(np.array([0.1, 0.7, 1.3, TOP]))  # continuous: a tie is the signal
    # two levels: too few to tell, unless the deployment's lattice says how far apart they are
    two = np.array([4.0] * 20 + [6.0] * 20)
    assert piles_up(two) and not piles_up(two, step=2.0)
    assert piles_up(np.array([1.0] * 4 + [2.0] * 16 + [3.0] * 60))  # steeply up to the top


def test_two_level_prompts_of_a_coarse_lattice_establish_no_ceiling():
    """Rounded at twice the scale: prompts sit on two or three levels, their top level often
    their mode (rounded at 2.0, seed 7, established a false ceiling this way)."""
    rng = np.random.default_rng(2)
    prior = CostShapePrior()
    for loc in (0.0, 1.0, -1.0, 5.0, 5.0, 5.0, 4.6, 5.0, 0.5, 5.0):
        prior.update(2.0 * np.round((loc + 0.8 * rng.standard_normal(60)) / 2.0))
    assert prior.lattice_step() == 2.0
    assert prior.ceiling.requests >= CEILING_REQUESTS and ceiling_of(prior) is None


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
        before_piled = prior.to_dict()  # a snapshot from before piles_up: all piled
        del before_piled["ceiling"]["piled"]
        assert cls.from_dict(before_piled).ceiling.piled == prior.ceiling.requests
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
        {"top": 1.0, "requests": 3, "piled": 4},
        {"top": 1.0, "requests": 3, "piled": -1},
        {"top": 1.0, "requests": 3, "piled": True},
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


@pytest.mark.parametrize("policy_class", [ShapePandora, BayesShapePandora])
def test_a_known_ceiling_replaces_the_requests_tie_guess(policy_class):
    """Below an established ceiling, a tied best is the scale's resolution (rounded scores), not
    a clip: the cost policies keep sampling and find the better reward; without a ceiling the
    request's own guess (a pile-up: 6 ties against one reward at the next value, the scores 0.1
    apart at sd 0.43) still stops it ("tied")."""
    rounded = [0.4, 1.3, 0.3, 1.3, 0.9, 1.3, 1.3, 1.3, 1.3, 0.1, 0.6, 0.8, 0.2]
    rounded += [1.9] + [0.5] * 60
    guess = policy_class(1e-4, prior=CostShapePrior(), max_samples=64)
    assert _run(guess, rounded) == (9, "tied")
    known = policy_class(1e-4, prior=_established(CostShapePrior()), max_samples=64)
    n, reason = _run(known, rounded)
    assert n >= 14 and known.best == 1.9 and reason != "tied"


def test_tail_pandora_without_the_tie_guess_keeps_the_point_mass_rule():
    rounded = [0.4, 1.3, 0.3, 1.3, 0.9, 1.3, 1.3, 1.3, 1.3] + [0.6] * 55
    assert _run(TailPandora(1e-4, max_samples=64), rounded) == (9, "tied")
    policy = TailPandora(1e-4, max_samples=64, tie_ceiling=False)
    assert _run(policy, rounded)[1] != "tied"
    point_mass = TailPandora(1e-4, max_samples=64, tie_ceiling=False)
    assert _run(point_mass, [0.6] * 64) == (54, "tied")  # cost_all_tied(1e-4)


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
    floor.note([-3.0, math.nan])  # above the bottom: teaches nothing about where it is
    assert (floor.value, floor.requests, floor.bound) == (BOTTOM, 2, None)
    floor.note([BOTTOM])
    assert floor.bound == BOTTOM and len(floor.counts) == 4
    floor.note([BOTTOM - 0.5])  # not a bound after all: what was learned goes with it
    assert (floor.value, floor.requests, floor.bound) == (BOTTOM - 0.5, 1, None)
    assert floor.counts == [[1, 0]] and floor.lift_weight == 0.0
    for cls in (ShapePrior, CostShapePrior):
        prior = cls()
        for i in range(CEILING_REQUESTS):
            prior.update([BOTTOM, 1.0, 0.0, 2.0 + i] * 8)
        assert floor_of(prior).value == BOTTOM and ceiling_of(prior) is None
        restored = cls.from_dict(json.loads(json.dumps(prior.to_dict())))
        assert restored.floor == prior.floor and floor_of(restored) == floor_of(prior)
        old = prior.to_dict()
        del old["floor"]
        assert cls.from_dict(old).floor == RewardFloor()
        for bad in (
            {"bottom": "x"},
            {"bottom": -math.inf, "requests": 3},
            [BOTTOM],
            {"bottom": BOTTOM, "counts": [[3, 4]]},
            {"bottom": BOTTOM, "counts": [[3, True]]},
            {"bottom": BOTTOM, "g": [1.0]},
            {"bottom": BOTTOM, "g": [0.5] * P_GRID.size},
            {"bottom": BOTTOM, "lift_sum": 2.0, "lift_weight": 1.0},
            {"bottom": BOTTOM, "lift_sum": "0"},
        ):
            with pytest.raises(ValueError, match="floor"):
                cls.from_dict(prior.to_dict() | {"floor": bad})


def test_a_floor_is_a_clip_only_where_a_request_piles_up_at_it():
    """The lowest level of rounded scores is reached by three requests and establishes a floor
    (whose rule still ends all-bottom requests) without piling up there: no clip, the lattice
    keeps its likelihood path. A judge's lower clip holding most of a prompt's responses piles
    up: the floor is a clip and closes it (AlpacaEval's duplicated logits look like a fine
    lattice, and the lattice path lost there, 0.9978 of the best fixed N at 1e-4)."""
    rng = np.random.default_rng(0)
    prior = CostShapePrior()
    for loc in (-2.0, -2.0, -2.0, 0.5, 1.0, -2.0, 0.0, -2.0):
        prior.update(_rounded_prompt(rng, loc))
    assert floor_of(prior) is not None and prior.floor.piled == 0
    assert clipped_floor_of(prior) is None
    assert ShapePandora(1e-3, prior=prior, max_samples=960).fitted_shape is not None
    for _ in range(3):  # a clip under the bulk: most of each request sits at it
        prior.update(np.maximum(_rounded_prompt(rng, -4.5, sd=1.0), -5.0))
    assert prior.floor.piled >= 1 and clipped_floor_of(prior) == -5.0
    policy = ShapePandora(1e-3, prior=prior, max_samples=960)
    assert not policy.warm and policy.fitted_shape is None
    # all at one value says nothing of a clip; a continuous request with ties at its bottom does
    floor = RewardFloor()
    floor.note([1.0] * 20)
    assert floor.piled == 0
    floor.note([BOTTOM] * 30 + [-3.1, 0.4, 2.2])
    assert floor.piled == 1 and floor.clip is None  # one request: not yet established
    restored = RewardFloor.from_dict(json.loads(json.dumps(floor.to_dict())))
    assert restored == floor
    old = floor.to_dict()
    del old["piled"]  # a snapshot from before: every request at the floor counted as piled
    assert RewardFloor.from_dict(old).piled == floor.requests
    with pytest.raises(ValueError, match=r"floor\.piled"):
        RewardFloor.from_dict(floor.to_dict() | {"piled": 5})


def test_the_floor_gain_bound_is_the_integral_it_claims():
    """Unlearned: E[p 1{p > 1 - alpha}] under p ~ Beta(1, n + 1), by quadrature, and
    1 - alpha^(n+1); learned: the same sums under the grid posterior."""
    for n in (1, 8, 32, 100, 400):
        density = lambda p, n=n: p * (n + 1) * (1 - p) ** n  # noqa: E731
        exact, _ = integrate.quad(density, 0.01, 1.0, points=[0.05, 0.2])
        assert floor_gain_bound(n, 0.99) == pytest.approx(exact, rel=1e-6)
        mass, _ = integrate.quad(lambda p, n=n: (n + 1) * (1 - p) ** n, 0.0, 0.01)
        assert floor_acceptance_bound(n, 0.99) == pytest.approx(mass, rel=1e-9)
    gains = [floor_gain_bound(n, 0.99) for n in range(1, 600)]
    assert all(a > b for a, b in itertools.pairwise(gains))
    g = np.zeros(P_GRID.size)
    g[P_GRID == 0.0], g[P_GRID == 0.05] = 0.5, 0.5
    bound = FloorBound(BOTTOM, lift=0.5, g=tuple(g))
    post = 0.95**20 / (1.0 + 0.95**20)  # the posterior weight of p = 0.05 after 20 at the floor
    assert floor_gain_bound(20, 0.99, bound) == pytest.approx(0.5 * 0.05 * post)
    assert floor_acceptance_bound(20, 0.99, bound) == pytest.approx(1.0 - 0.5 * post)


def _stop_at(cost, floor=None, alpha=0.99):
    return next(n for n in range(1, 10_000) if floor_gain_bound(n, alpha, floor) <= cost)


@pytest.mark.parametrize("cost", [1e-2, 1e-3])
def test_all_rewards_at_the_floor_are_no_point_mass(cost):
    """Without a floor, identical rewards stop the cold start ("tied": 32 at c = 1e-3, 16 - twice
    min_samples - at 1e-2, :func:`cost_all_tied`); at the deployment's floor (nothing learned
    about it yet) the rule of succession decides: ~79 draws at c = 1e-2, ~260 at 1e-3."""
    stream = [BOTTOM] * 960
    tied = {1e-2: 16, 1e-3: 32}[cost]
    assert _run(TailPandora(cost, max_samples=960), stream) == (tied, "tied")
    floor = FloorBound(BOTTOM)
    n, reason = _run(TailPandora(cost, max_samples=960, floor=floor), stream)
    assert (n, reason) == (_stop_at(cost), "floor") and 60 < n < 300
    target = TailTargetAcceptance(0.9, max_samples=960, floor=floor)
    n_target = next(n for n in range(1, 960) if floor_acceptance_bound(n, 0.99) >= 0.9)
    assert _run(target, stream) == (n_target, "floor")
    assert _run(TailTargetAcceptance(0.9, max_samples=960), stream) == (16, "tied")
    # a point mass elsewhere than the floor is still one
    assert _run(TailPandora(cost, max_samples=960, floor=floor), [0.5] * 960) == (tied, "tied")
    with pytest.raises(ValueError, match="floor"):
        TailPandora(cost, floor=BOTTOM)


def _deployment(prior, p_floor_heavy, rng, requests=40):
    """Requests of 60 draws: a quarter floor-heavy (a reward above the floor with probability
    ``p_floor_heavy``, ~4 logits above it), the rest mostly above the floor."""
    for i in range(requests):
        p = p_floor_heavy if i % 4 == 0 else rng.uniform(0.3, 1.0)
        above = rng.random(60) < p
        x = np.where(above, BOTTOM + 4.0 + rng.standard_normal(60), BOTTOM)
        if i < CEILING_REQUESTS:
            x[0] = BOTTOM
        prior.update(x)
    return prior


def test_the_deployment_learns_how_often_a_floor_prompt_has_better_responses():
    """Where the floor-heavy prompts were all floor, an all-floor request stops far sooner than
    where they had a few good responses (5%), and sooner than with nothing learned."""
    rng = np.random.default_rng(5)
    empty = floor_of(_deployment(CostShapePrior(), 0.0, rng))
    sparse = floor_of(_deployment(CostShapePrior(), 0.05, rng))
    assert empty.value == sparse.value == BOTTOM
    assert 0.9 < sparse.lift <= 1.0  # 4 logits above the floor: almost all the acceptance
    assert _stop_at(1e-3, empty) < 80 < 200 < _stop_at(1e-3, sparse)
    assert _stop_at(1e-3, empty) < _stop_at(1e-3) == 260
    p_zero = np.asarray(empty.g)[P_GRID <= 0.005].sum()
    assert p_zero > 0.15  # ~ the quarter of requests that were all floor


def test_the_lift_is_what_rising_above_the_floor_was_worth():
    far, near = RewardFloor(), RewardFloor()
    for _ in range(CEILING_REQUESTS):
        far.note([BOTTOM] * 9 + [BOTTOM + 8.0])  # AR(-8) ~ 0: the lift is ~1
        near.note([-2.0] * 9 + [-1.9])  # AR(-0.1) ~ 0.95: the floor is nearly as good
    assert far.lift > 0.99 and near.lift < 0.06
    assert _stop_at(1e-3, FloorBound(-2.0, near.lift)) < _stop_at(1e-3, FloorBound(-2.0))


@pytest.mark.parametrize("mode", ["target", "cost", "bayes-cost"])
def test_the_policies_read_the_floor_cold_and_warm(mode):
    """A good response after 40 draws at the floor is found (the point-mass rule stopped at 32
    before); a request that stays at the floor stops on the learned rule of succession."""
    prior = _deployment(
        CostShapePrior() if "cost" in mode else ShapePrior(), 0.05, np.random.default_rng(6)
    )
    late_good = [BOTTOM] * 40 + [BOTTOM + 5.0] + [BOTTOM] * 919
    n, reason = _run(_policies(prior)[mode], late_good)
    assert n > 40 and reason != "tied"
    policy = {
        "target": PooledTargetAcceptance(0.9, prior=prior, max_samples=960),
        "cost": ShapePandora(1e-3, prior=prior, max_samples=960),
        "bayes-cost": BayesShapePandora(1e-3, prior=prior, max_samples=960),
    }[mode]
    floor = floor_of(prior)
    if mode == "target":
        expected = next(n for n in range(8, 960) if floor_acceptance_bound(n, 0.99, floor) >= 0.9)
    else:
        expected = _stop_at(1e-3, floor)
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
    floor = floor_of(prior)
    assert floor.value == -4.0
    policy = ShapePandora(1e-3, prior=prior, max_samples=960)
    assert policy.warm
    assert _run(policy, [-4.0] * 960) == (_stop_at(1e-3, floor), "floor")


def test_target_mode_stops_once_the_best_is_within_the_targets_reach_of_the_ceiling():
    """kappa <= ceiling for every prompt, so AR(best - ceiling) >= t keeps the promise: at
    t = 0.8 a best 0.3 below the top (AR 0.851) stops; at t = 0.9 it does not (it needs
    ln(2 / 0.9 - 1) = 0.20), nor does any target above a best 0.3 below the top."""
    below = TOP - 0.3
    rewards = [below, 1.0, 0.5, 0.2, 0.7, 0.4, 0.3, 0.1, 0.6, 0.8] * 3
    assert math.isclose(2 / (1 + math.exp(0.3)), 0.8511, abs_tol=1e-4)
    for target, stops in ((0.8, True), (0.85, True), (0.86, False), (0.9, False)):
        policy = PooledTargetAcceptance(target, prior=_established(ShapePrior()), max_samples=64)
        n, reason = _run(policy, rewards)
        assert (n, reason) == (8, "ceiling") if stops else reason != "ceiling", target
    # within reach but before min_samples: waits for the floor, as at the ceiling itself
    policy = PooledTargetAcceptance(0.8, prior=_established(ShapePrior()), min_samples=5)
    assert _run(policy, rewards) == (5, "ceiling")
