"""The tie rule: a best repeated above lower rewards is the top of the support only where it piles
up (a clip), not where the scores sit on a lattice (integer or coarsely rounded judge scores)."""

from __future__ import annotations

import numpy as np
import pytest

from stoppers.robust.cost import TailPandora
from stoppers.robust.target import TailTargetAcceptance
from stoppers.robust.tracker import BestTies, is_pile_up


def test_a_pile_up_outnumbers_the_next_lower_value():
    assert not is_pile_up(2, 0)  # fewer than TIES_AT_MAX
    assert not is_pile_up(4, 1) and is_pile_up(5, 1)  # p = 0.19, 0.11
    assert not is_pile_up(6, 2) and is_pile_up(7, 2)  # p = 0.14, 0.09
    assert not is_pile_up(6, 6) and not is_pile_up(30, 40)  # a level like the one below it
    assert is_pile_up(40, 20)


def test_best_ties_counts_the_best_and_the_next_lower_value():
    ties = BestTies()
    for reward in [1.0, 3.0, 2.0, 3.0, 2.0, 0.5, 2.0, 3.0]:
        ties.note(reward)
    assert (ties.top, ties.count, ties.below, ties.below_count) == (3.0, 3, 2.0, 3)
    ties.note(4.0)  # a new best: the old one becomes the next lower value
    assert (ties.top, ties.count, ties.below, ties.below_count) == (4.0, 1, 3.0, 3)
    ties.note(3.5)  # between them: the new next lower value
    assert (ties.below, ties.below_count) == (3.5, 1)
    for _ in range(4):
        ties.note(4.0)
    assert ties.ceiling(mean=3.0, best=4.0)  # 5 ties against one
    assert not BestTies(enabled=False).ceiling(mean=3.0, best=4.0)


def _acceptance(d: float) -> float:
    e = np.exp(min(d, 0.0))
    return float(min(2.0 * e / (1.0 + e), 1.0))


@pytest.mark.parametrize(
    "make",
    [
        lambda: TailTargetAcceptance(0.9, max_samples=200),
        lambda: TailPandora(1e-3, max_samples=200),
    ],
    ids=["target", "cost"],
)
def test_integer_scores_are_not_taken_for_a_clip(make):
    """N(0, 1) rounded to integers: the 0.99-quantile is 2 (P(>= 3) = 0.006), and a best of 1
    is worth AR(-1) = 0.54. Three ties at the top level seen used to stop most requests there
    (mean acceptance 0.75 for a target of 0.9, 176 / 186 of 200 requests "tied"); the lattice's
    top level is no pile-up, so the requests go on to find the 2s."""
    accepted, tied = [], 0
    for seed in range(200):
        stream = np.round(np.random.default_rng(seed).standard_normal(200))
        policy = make()
        for reward in stream.tolist():
            if policy.observe(reward):
                break
        accepted.append(_acceptance(policy.best - 2.0))
        tied += policy.stop_reason == "tied"
    assert np.mean(accepted) >= 0.9
    assert tied <= 40


@pytest.mark.parametrize(
    "make",
    [
        lambda: TailTargetAcceptance(0.9, max_samples=200),
        lambda: TailPandora(1e-3, max_samples=200),
    ],
    ids=["target", "cost"],
)
def test_a_clip_above_continuous_rewards_still_stops_early(make):
    """N(0, 1) clipped at 0.5 (31% of the draws at the clip): the ties pile up there (target mode
    may stop on its own rule first)."""
    stops = []
    for seed in range(100):
        stream = np.minimum(np.random.default_rng(seed).standard_normal(200), 0.5)
        policy = make()
        for reward in stream.tolist():
            if policy.observe(reward):
                break
        stops.append((policy.n, policy.stop_reason))
    assert {reason for _, reason in stops} <= {"tied", "target"}  # never the budget
    assert np.median([n for n, _ in stops]) <= 20


def test_a_lattice_is_fitted_dequantized_and_its_best_judged_within_its_cell():
    from stoppers.robust.gpd_tail import dequantize, lattice_step
    from stoppers.robust.tracker import TailTracker

    # repeats only at the extremes (a clip, a floor): not a lattice
    assert lattice_step([-9.21, -9.21, -1.3, 0.2, 2.7, 9.21, 9.21]) is None
    assert lattice_step([0.1, 0.5, 0.9]) is None
    steps = [-1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0]
    assert lattice_step(steps) == 0.5  # an interior repeat; the smallest gap
    spread = dequantize(np.asarray(steps), 0.5)
    np.testing.assert_allclose(spread, [-1.0, -0.125, 0.125, 0.5, 0.875, 1.125, 2.0])
    assert np.all(np.diff(spread) > 0)
    tracker = TailTracker(xi0=0.0, prior_weight=30.0)
    for reward in [0.0, 1.0, 2.0, 1.0, 2.0, 0.0, 1.0, 3.0, 3.0]:
        tracker.add(reward)
    assert tracker.step == 1.0
    assert tracker.judged_best() == 3.0 + 1.0 * (0.5 - 0.5 / 2)  # the top of two copies
    continuous = TailTracker(xi0=0.0, prior_weight=30.0)
    for reward in np.random.default_rng(0).standard_normal(40).tolist():
        continuous.add(reward)
    assert continuous.step is None and continuous.judged_best() == max(continuous.sorted)
