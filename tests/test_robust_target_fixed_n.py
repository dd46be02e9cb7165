"""Target mode runs Best-of-N where its table rule does not pay (``StopTable.fixed_n``).

On rewards with a hard upper end a request's mean and sd place its best against the benchmark no
better than a fixed count does: the table's own simulation shows the rule drawing as many rewards
as the Best-of-N that delivers the same, and the table names that N instead. Where the rule pays
(normal, Gumbel) the table keeps it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from stoppers.robust import stop_table as st
from stoppers.robust.pooled_target import PooledTargetAcceptance
from stoppers.robust.shape_prior import ShapePrior

SCALES = np.diff(stats.norm(0.0, 0.5).cdf(np.linspace(st.S_LO, st.S_HI, st.S_BINS + 1)))
ROOT3 = 3.0**0.5
SHAPES = {  # standardised (mean 0, sd 1)
    "uniform": stats.uniform(-ROOT3, 2.0 * ROOT3),
    "normal": stats.norm(),
    "gumbel": stats.gumbel_r(-np.euler_gamma * 6.0**0.5 / np.pi, 6.0**0.5 / np.pi),
}


def _table(shape: str, target: float, min_samples: int = 8) -> st.StopTable:
    w = np.diff(SHAPES[shape].cdf(st.Z_EDGES))
    table, q_alpha = st.plug_in(w, SCALES, target, 0.99, 50)
    return st.calibrate(table, w, SCALES, q_alpha, min_samples, 960, 1)


def test_fixed_n_for_compares_the_rule_with_the_matching_best_of_n():
    curve = np.array([0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.92, 0.94])
    # the rule delivers 0.9 with 5.8 rewards; Best-of-6 does too: no saving, so Best-of-N
    assert st.fixed_n_for(curve, 0.9, 5.8, 0.9, 2) == 6
    # ... at least min_samples
    assert st.fixed_n_for(curve, 0.9, 5.8, 0.9, 7) == 7
    # it saves more than FIXED_N_MARGIN of the matching N: the rule stays
    assert st.fixed_n_for(curve, 0.9, 6 * (1 - st.FIXED_N_MARGIN) - 0.1, 0.9, 2) is None
    # it over-delivers at the floor: compared with the N matching what it delivers
    assert st.fixed_n_for(curve, 0.92, 6.5, 0.8, 2) == 4
    # no n in the simulated horizon reaches the target
    assert st.fixed_n_for(curve, 0.9, 5.0, 0.99, 2) is None


@pytest.mark.parametrize("target", [0.9, 0.95])
def test_a_bounded_shape_gets_best_of_n_an_open_one_keeps_its_rule(target):
    uniform = _table("uniform", target)
    assert uniform.fixed_n is not None
    # the N is the one whose simulated acceptance reaches the target, near the rule's own count
    assert uniform.fixed_n == pytest.approx(uniform.simulated_samples, rel=0.15)
    for shape in ("normal", "gumbel"):
        table = _table(shape, target)
        assert table.fixed_n is None, shape
        assert table.simulated_acceptance == pytest.approx(target, abs=0.01)


def _trained_prior(draw, requests: int, seed: int) -> ShapePrior:
    rng = np.random.default_rng(seed)
    prior = ShapePrior()
    for _ in range(requests):
        scale = float(np.exp(rng.normal(0.0, 0.4)))
        stream = rng.normal() + scale * draw(rng, int(rng.integers(12, 48)))
        prior.update(stream.tolist())
    return prior


def _uniform(rng, n):
    return rng.uniform(-ROOT3, ROOT3, n)


def _normal(rng, n):
    return rng.standard_normal(n)


def test_a_deployment_of_bounded_rewards_runs_best_of_n_and_says_so():
    prior = _trained_prior(_uniform, 60, seed=3)
    # the table rule's requests (a flat fitted shape may count as two modes: the multiplier
    # rule, which is not simulated and keeps deciding where it decides)
    policy = PooledTargetAcceptance(0.9, prior=prior, max_samples=960, multimodal=False)
    assert policy.uses_learned_prior and policy.fixed_n is not None
    default = PooledTargetAcceptance(0.9, prior=prior, max_samples=960)
    assert default.multimodal == (default.fixed_n is None)
    n_fixed = policy.fixed_n
    rng = np.random.default_rng(11)
    drawn = 0
    for reward in rng.uniform(0.0, 1.0, n_fixed + 5):
        drawn += 1
        if policy.observe(float(reward)):
            break
    assert drawn == n_fixed and policy.stop_reason == "fixed"
    assert policy.threshold is None and policy.acceptance_estimate is None


def test_a_normal_deployment_keeps_the_calibrated_rule():
    prior = _trained_prior(_normal, 60, seed=3)
    policy = PooledTargetAcceptance(0.9, prior=prior, max_samples=960)
    assert policy.uses_learned_prior and policy.fixed_n is None


def test_best_of_n_cap_is_a_multiple_of_the_n_that_reaches_the_target():
    curve = np.array([0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.92, 0.94])
    assert st.best_of_n_cap(curve, 0.9, 2) == 6
    assert st.best_of_n_cap(curve, 0.9, 2, factor=2.0) == 12
    assert st.best_of_n_cap(curve, 0.8, 8, factor=1.5) == 8  # at least min_samples
    assert st.best_of_n_cap(curve, 0.95, 2, factor=2.0) is None  # not within the horizon


@pytest.mark.parametrize("shape", ["normal", "gumbel"])
def test_the_plain_tables_rule_ends_at_twice_its_best_of_n(shape):
    """The cap is TABLE_CAP_FACTOR times the Best-of-N that delivers the target on the simulated
    streams, and the calibration counts it: the rule still delivers the target there."""
    table = _table(shape, 0.9)
    w = np.diff(SHAPES[shape].cdf(st.Z_EDGES))
    _, q_alpha = st.plug_in(w, SCALES, 0.9, 0.99, 50)
    z, log_s = st.simulated_streams(w, SCALES, 960, 1)
    kappa = np.exp(log_s) * q_alpha
    curve = st._acceptance(
        np.maximum.accumulate(np.exp(log_s)[:, None] * z, axis=1) - kappa[:, None]
    )
    n = int(np.flatnonzero(curve.mean(axis=0) >= 0.9)[0]) + 1
    assert table.cap == math.ceil(st.TABLE_CAP_FACTOR * n)
    assert table.simulated_samples < table.cap
    assert table.simulated_acceptance == pytest.approx(0.9, abs=0.01)


def test_a_prompt_whose_best_never_reaches_the_threshold_stops_at_the_cap():
    """A request whose rewards sit in two tight lumps (the best far under the normal table's
    threshold for its mean and sd) ends at the table's cap, not at the budget."""
    prior = _trained_prior(_normal, 60, seed=3)
    policy = PooledTargetAcceptance(0.9, prior=prior, max_samples=960, multimodal=False)
    assert policy.fixed_n is None and policy.uses_learned_prior
    cap = policy.cap
    assert cap is not None and 8 < cap < 960
    rng = np.random.default_rng(12)
    lumps = np.where(rng.random(960) < 0.5, 0.0, 1.0) + rng.normal(0.0, 0.01, 960)
    drawn = 0
    for reward in lumps:
        drawn += 1
        if policy.observe(float(reward)):
            break
    assert drawn == cap and policy.stop_reason == "fixed"
