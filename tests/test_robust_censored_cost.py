"""Cost mode's censored reading of a floor (stoppers.robust.censored_cost): the gain on the
rewards above a floor the deployment's rewards pile up at."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from stoppers import default_cost_policy, new_deployment_prior
from stoppers.replay.synth import SynthSpec, generate
from stoppers.robust.ceiling import P_GRID, FloorBound
from stoppers.robust.censored_cost import (
    CUT_EVIDENCE,
    FLOOR_DEPENDENCE_Z,
    INTERIOR_TWO_MODE_MAX,
    CensoredGain,
    CensoredShape,
    fit_censored,
    floor_dependence,
)
from stoppers.robust.cost import TailPandora
from stoppers.robust.cost_prior import CENSORED_KEY, CostShapePrior
from stoppers.robust.likelihood_cost import FittedShape
from stoppers.robust.policy import kappa_offset
from stoppers.robust.shape_cost import ShapePandora
from stoppers.robust.xi_prior import XiPrior

SPREAD = 3.0
FLOOR = -4.0 * (2.0 + SPREAD)  # where `pandora synth --family judge` puts its floor
COST = 1e-3


def judge_like(prompts: int, samples: int, seed: int) -> np.ndarray:
    """`pandora synth --family judge`: each prompt its own share (10-90%) at one floor, a
    normal continuum above it."""
    spec = SynthSpec(family="judge", prompts=prompts, samples=samples, seed=seed)
    return generate(replace(spec, scale_median=SPREAD))["rewards"]


def two_cluster_judge(prompts: int, samples: int, seed: int) -> np.ndarray:
    """A judge like the AlpacaEval one: above the floor each prompt's rewards fall in a losing
    and a winning cluster, 6 sds apart, in its own proportions."""
    rng = np.random.default_rng(seed)
    out = np.empty((prompts, samples))
    for i in range(prompts):
        level, win = rng.normal(0.0, 2.0), rng.uniform(0.2, 0.6)
        body = level + rng.normal(0.0, 1.0, samples) + 6.0 * (rng.random(samples) < win)
        out[i] = np.where(rng.random(samples) < rng.uniform(0.1, 0.8), FLOOR, body)
    return out


def _learned(rewards: np.ndarray, draws: int = 96) -> CostShapePrior:
    prior = new_deployment_prior("cost")
    assert isinstance(prior, CostShapePrior)
    for row in rewards:
        prior.update(row[:draws])
    return prior


def _shape(log_g: np.ndarray, interior: FittedShape) -> CensoredShape:
    return CensoredShape(
        interior=interior,
        floor=FLOOR,
        log_g=tuple(float(v) for v in log_g),
        scale_mu=math.log(SPREAD),
        scale_precision=4.0,
        requests=30,
        two_mode_share=0.0,
    )


def _point_mass(p: float) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.where(p == P_GRID, 1.0, 0.0))


@pytest.fixture(scope="module")
def judge_prior() -> CostShapePrior:
    return _learned(judge_like(30, 960, seed=0))


def test_a_judges_floor_is_read_as_censoring_and_its_interiors_share_a_shape(judge_prior):
    censored = judge_prior.censored_shape()
    assert censored is not None and censored.floor == FLOOR
    assert censored.shared and censored.two_mode_share < INTERIOR_TWO_MODE_MAX
    policy = default_cost_policy(COST, max_samples=960, prior=judge_prior)
    assert isinstance(policy, ShapePandora) and policy.censored and policy.warm


def test_interiors_with_two_clusters_in_their_own_proportions_keep_the_cold_start():
    prior = _learned(two_cluster_judge(30, 960, seed=1))
    censored = prior.censored_shape()
    assert censored is not None and not censored.shared
    policy = default_cost_policy(COST, max_samples=960, prior=prior)
    assert isinstance(policy, ShapePandora) and not policy.censored and not policy.warm


@pytest.mark.parametrize("p", [1.0, 0.5, 0.2])
def test_the_gain_is_p_times_the_interior_gain_at_alpha_prime(judge_prior, p):
    """With p known, E[(AR(V) - AR(best))+] = p E[(AR(m + sZ) - AR(best))+], kappa the
    interior's 1 - (1 - alpha) / p quantile."""
    interior = judge_prior.censored_shape().interior
    gain = CensoredGain(_shape(_point_mass(p), interior), alpha=0.99)
    rng = np.random.default_rng(2)
    inside = list(rng.normal(1.0, SPREAD, 12))
    for v in inside + ([FLOOR] * 5 if p < 1.0 else []):  # p = 1: no reward at the floor
        gain.note(v)
    best = max(inside) - 1.0  # judged against a best under the rewards' top
    z_alpha = interior.quantile(1.0 - 0.01 / p)
    want, kappa = interior.posterior_gain(np.asarray(inside), best, z_alpha, math.log(SPREAD), 4.0)
    got, got_kappa = gain.gain(best)
    assert got == pytest.approx(p * want, rel=1e-9)
    assert got_kappa == pytest.approx(kappa, rel=1e-9)


def test_a_prompt_that_is_mostly_floor_has_kappa_at_the_floor(judge_prior):
    """p <= 1 - alpha: the benchmark is the floor, and any reward above it accepts fully."""
    gain = CensoredGain(_shape(_point_mass(0.01), judge_prior.censored_shape().interior), 0.99)
    for v in [FLOOR] * 20 + [0.5, 1.5]:
        gain.note(v)
    assert gain.gain(1.5) == (0.0, FLOOR)


def test_p_is_read_from_the_draws_under_the_learned_distribution(judge_prior):
    shape = judge_prior.censored_shape()
    gain = CensoredGain(shape, 0.99)
    for v in [FLOOR] * 30 + [1.0] * 10:
        gain.note(v)
    p, w = gain.p_nodes()
    assert p.size <= 5 and w.sum() == pytest.approx(1.0)
    assert 0.1 < float(p @ w) < 0.45  # 10 of 40 above, pulled by the deployment's g


def test_one_reward_above_the_floor_is_placed_by_the_interior_scales(judge_prior):
    """No sd yet: m = x - s Z under a flat prior; the gain falls as the best rises."""
    shape = judge_prior.censored_shape()
    gains = []
    for best in (-2.0, 2.0, 6.0):
        gain = CensoredGain(shape, 0.99)
        for v in [FLOOR] * 7 + [best]:
            gain.note(v)
        gains.append(gain.gain(best)[0])
    assert all(g >= 0.0 and math.isfinite(g) for g in gains)
    assert gains[0] == pytest.approx(gains[1]) and gains[1] == pytest.approx(gains[2])
    # one reward places m relative to itself: the same gain wherever it falls; a second,
    # lower reward says the best is the better of two
    gain = CensoredGain(shape, 0.99)
    for v in [FLOOR] * 6 + [6.0, 0.0]:
        gain.note(v)
    assert gain.gain(6.0)[0] < gains[2]


def test_a_reward_under_the_floor_hands_the_request_to_the_cold_start(judge_prior):
    policy = default_cost_policy(COST, max_samples=960, prior=judge_prior)
    assert policy.censored
    for v in (1.0, FLOOR, 2.0):
        assert not policy.observe(v)
    policy.observe(FLOOR - 1.0)
    assert not policy.censored and not policy.warm
    assert policy._cold is not None and policy._cold.n == 4


def test_the_censored_fit_is_built_where_the_hook_says_and_kept_for_its_floor(judge_prior):
    prior = _learned(judge_like(30, 960, seed=3))
    asked = []
    prior.schedule_build = lambda _prior, key: asked.append(key)
    assert prior.censored_shape() is None and asked == [CENSORED_KEY]
    built = prior.prepare(CENSORED_KEY)()
    assert built is not None and prior.install(CENSORED_KEY, built)
    assert prior.censored_shape() is built
    older = replace(built, requests=built.requests - 1)
    assert not prior.install(CENSORED_KEY, older)
    prior.censored = replace(built, floor=FLOOR + 1.0)  # a fit for another floor is not served
    assert prior.censored_shape() is None


def test_fit_censored_needs_an_interior_spread():
    floor = FloorBound(FLOOR)
    assert fit_censored([[1.0, 1.0, 1.0, 1.0]] * 10, floor, 10) is None
    streams = [list(np.random.default_rng(i).normal(0.0, 1.0, 40)) for i in range(10)]
    fitted = fit_censored(streams, floor, 10)
    assert fitted is not None and fitted.two_mode_share is not None


def test_two_clustered_interiors_run_the_cold_start_with_its_margins_whole():
    """Where the interiors hold a losing and a winning cluster, a tail that looks bounded may end
    the losing one below a winner not drawn yet: the cold start keeps its margins."""
    prior = _learned(two_cluster_judge(30, 960, seed=1))
    reading = prior.censored_shape()
    assert not reading.shared and reading.two_mode_share >= INTERIOR_TWO_MODE_MAX
    policy = default_cost_policy(COST, max_samples=960, prior=prior)
    assert policy._cold is not None and policy._cold.full_margins
    judge = default_cost_policy(COST, max_samples=960, prior=_learned(judge_like(30, 960, seed=0)))
    assert judge._shadow is not None and not judge._shadow.full_margins


def test_full_margins_ignore_a_learned_bounded_tail():
    """TailPandora's margins: the fit's margin_share of them, all of them with full_margins."""
    xi = XiPrior()
    rng = np.random.default_rng(0)
    for _ in range(30):  # uniform rewards: the deployment learns bounded tails
        xi.update(rng.normal(0.0, 2.0) + rng.uniform(size=60))
    rewards = np.random.default_rng(5).normal(size=40)
    offsets = {}
    for full in (False, True):
        policy = TailPandora(1e-6, max_samples=100, prior=xi, full_margins=full)
        for v in rewards:
            policy.observe(float(v))
        fit = policy._tracker.fit
        assert fit.margin_share < 0.5  # the learned prior drops most of the margins ...
        share = 1.0 if full else fit.margin_share  # ... unless they are kept whole
        assert policy._kappa_off == kappa_offset(fit, 0.99, policy.kappa_z * share, xi.weight)
        widen = 1.0 + share * policy.scale_z / math.sqrt(fit.k)
        assert policy._optimistic.sigma == pytest.approx(fit.sigma * widen, rel=1e-12)
        offsets[full] = policy._kappa_off
    assert offsets[True] > offsets[False]


def test_a_floor_the_rewards_pile_up_at_keeps_the_cold_starts_margins_before_any_reading():
    """Before ten interior streams are kept there is no censored reading: the cold start runs,
    its margins whole wherever the floor holds a fifth of the kept rewards."""
    rows = judge_like(30, 960, seed=4)
    prior = _learned(rows[:6])
    assert prior.censoring_floor() is None and prior.piled_floor() is not None
    policy = default_cost_policy(COST, max_samples=960, prior=prior)
    assert not policy.censored and policy._cold is not None and policy._cold.full_margins
    plain = _learned(np.random.default_rng(6).normal(0.0, 1.0, (12, 96)))
    assert plain.piled_floor() is None
    assert not default_cost_policy(COST, max_samples=960, prior=plain)._full_margins


def test_the_piled_floor_is_recomputed_as_the_prior_learns():
    rows = judge_like(30, 960, seed=4)
    prior = _learned(rows[:2])
    assert prior.piled_floor() is None  # not established: two requests reached it
    for row in rows[2:6]:
        prior.update(row[:96])
    assert prior.piled_floor() is not None and prior.piled_floor().value == FLOOR
    before = prior.piled_floor().g
    prior.update([FLOOR, FLOOR, 1.0])  # too short to count as a request; the floor learns p
    assert prior.piled_floor().g == tuple(prior.floor.g) != before


def test_a_tobit_floor_is_read_as_a_cut_and_a_judges_as_censoring():
    """A normal cut at a floor (`pandora synth --family floored`): the more of a prompt the
    floor takes, the more skewed the rest, so no interior shape is shared whatever p; the cut
    reading explains its streams better. The judge's floor lies far below interiors that do not
    depend on its share: there the censored reading wins by far."""
    spec = SynthSpec(family="floored", prompts=30, samples=960, seed=0, loc_mean=-2.0)
    tobit = _learned(generate(spec)["rewards"]).censored_shape()
    assert tobit is not None and tobit.cut and not tobit.shared
    assert tobit.cut_evidence > CUT_EVIDENCE + 50.0
    judge = _learned(judge_like(30, 960, seed=0)).censored_shape()
    assert judge is not None and judge.shared and not judge.cut
    assert judge.cut_evidence < CUT_EVIDENCE - 1000.0
    assert abs(judge.floor_dependence) <= FLOOR_DEPENDENCE_Z


def test_two_mode_interiors_are_read_neither_way():
    reading = _learned(two_cluster_judge(30, 960, seed=1)).censored_shape()
    assert reading is not None and not reading.one_mode
    assert not reading.cut and not reading.shared and reading.latent is None


def test_floor_dependence_is_the_spearman_z_of_share_against_skewness():
    rng = np.random.default_rng(7)
    streams = []
    for i in range(12):
        inside = rng.exponential(1.0, 30) if i % 2 else rng.normal(0.0, 1.0, 30)
        streams.append([FLOOR] * (5 + 10 * (i % 2)) + list(inside))
    z = floor_dependence(streams, FLOOR)
    shares = [(5 + 10 * (i % 2)) / (35 + 10 * (i % 2)) for i in range(12)]
    skews = [stats.skew(np.asarray(s)[np.asarray(s) > FLOOR]) for s in streams]
    assert z == pytest.approx(stats.spearmanr(shares, skews)[0] * math.sqrt(11), rel=1e-12)
    assert z > 0.0  # the skewed interiors are the floor-heavy ones
    assert floor_dependence(streams[:9], FLOOR) is None  # too few streams to tell
