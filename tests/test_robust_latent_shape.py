"""The latent shape under a floor: the Tobit reading of cost mode (stoppers.robust.latent_shape)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import special, stats

from stoppers import default_cost_policy, new_deployment_prior
from stoppers.replay.synth import SynthSpec, generate
from stoppers.robust.censored_cost import CUT_EVIDENCE, FLOOR_DEPENDENCE_Z, CensoredGain
from stoppers.robust.cost_prior import CostShapePrior
from stoppers.robust.latent_shape import fit_latent, latent_posterior, latent_scales, tobit_start
from stoppers.robust.likelihood_cost import FittedShape
from stoppers.robust.loss_report import decision_path
from stoppers.robust.shape_cost import ShapePandora

FLOOR = 0.0


def cut_streams(shape: str, streams: int, seed: int) -> list[list[float]]:
    """Streams of 20-100 rewards max(FLOOR, m + s Z), m ~ N(0, 1), log s ~ N(0, 0.3): a third
    to two thirds of each at the floor. Z standard normal or a standardised Gumbel."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(streams):
        n = int(rng.integers(20, 100))
        z = rng.standard_normal(n)
        if shape == "gumbel":
            z = (rng.gumbel(size=n) - np.euler_gamma) / (math.pi / math.sqrt(6.0))
        m, s = rng.normal(0.0, 1.0), math.exp(rng.normal(0.0, 0.3))
        out.append(list(np.maximum(m + s * z, FLOOR)))
    return out


@pytest.fixture(scope="module")
def normal_fit() -> FittedShape:
    fit = fit_latent(cut_streams("normal", 40, seed=0), FLOOR, requests=40)
    assert fit is not None
    return fit


def test_the_latent_shape_of_normal_rewards_cut_at_a_floor_is_normal(normal_fit):
    # tolerances: what a fit to 40 uncut normal streams of 20-100 misses by (0.99: up to 0.1)
    for alpha, tol in ((0.5, 0.05), (0.9, 0.1), (0.99, 0.15)):
        assert normal_fit.quantile(alpha) == pytest.approx(special.ndtri(alpha), abs=tol)
    usable = [s for s in cut_streams("normal", 40, seed=0) if sum(v > FLOOR for v in s) >= 4]
    assert normal_fit.streams == len(usable)  # a stream needs 4 rewards above the floor


def test_the_interiors_alone_read_a_different_shape():
    """What the cut reading is for: above the floor a normal's rewards are a skewed tail, so a
    shape fitted to them as if uncut puts the 0.99-quantile too far out."""
    streams = cut_streams("normal", 40, seed=0)
    inside = [[v for v in s if v > FLOOR] for s in streams]
    uncut = FittedShape.fit([s for s in inside if len(s) >= 4], requests=40)
    latent = fit_latent(streams, FLOOR, requests=40)
    assert uncut is not None and latent is not None
    assert uncut.quantile(0.99) > latent.quantile(0.99) + 0.2


def test_a_skewed_latent_shape_keeps_its_skew():
    fit = fit_latent(cut_streams("gumbel", 40, seed=1), FLOOR, requests=40)
    assert fit is not None
    gumbel = (stats.gumbel_r.ppf(0.99) - np.euler_gamma) / (math.pi / math.sqrt(6.0))
    assert fit.quantile(0.99) > special.ndtri(0.99) + 0.3  # heavier than the normal's 2.33
    assert fit.quantile(0.99) == pytest.approx(gumbel, abs=0.35)


def test_tobit_start_reads_a_cut_normal_from_its_plotting_positions():
    n, at_floor = 200, 80
    q = special.ndtri((np.arange(1, n + 1) - 0.5) / n)
    rewards = 1.5 + 2.0 * q  # exact quantiles of N(1.5, 2^2)
    m, s = tobit_start(rewards[at_floor:], at_floor)
    assert (m, s) == pytest.approx((1.5, 2.0), rel=1e-9)
    assert tobit_start(rewards[-2:], n - 2) is None  # two rewards give no slope, no scale
    m, s = tobit_start(rewards[-2:], n - 2, scale=2.0)
    assert (m, s) == pytest.approx((1.5, 2.0), rel=1e-9)


def test_a_requests_posterior_finds_its_latent_location_under_the_floor(normal_fit):
    """Half of the request's rewards are at the floor: the mean above it lies well over m."""
    streams = cut_streams("normal", 40, seed=0)
    scale = latent_scales(streams, FLOOR)
    assert scale is not None
    rng = np.random.default_rng(5)
    errors = []
    for _ in range(20):
        x = np.maximum(0.0 + rng.standard_normal(60), FLOOR)
        inside = x[x > FLOOR]
        m, s, w = latent_posterior(normal_fit, inside, int(x.size - inside.size), FLOOR, *scale)
        assert w.sum() == pytest.approx(1.0)
        errors.append((float(w @ m), float(w @ s), float(inside.mean())))
    m_hat, s_hat, inside_mean = np.mean(errors, axis=0)
    assert abs(m_hat) < 0.15 and abs(s_hat - 1.0) < 0.15
    assert inside_mean > 0.6  # what reading the interior as the whole would have placed m at


@pytest.fixture(scope="module")
def tobit_prior() -> CostShapePrior:
    spec = SynthSpec(family="floored", prompts=30, samples=960, seed=0, loc_mean=-2.0)
    prior = new_deployment_prior("cost")
    assert isinstance(prior, CostShapePrior)
    for row in generate(spec)["rewards"]:
        prior.update(row[:96])
    return prior


def test_a_tobit_deployment_decides_on_the_cut_reading(tobit_prior):
    reading = tobit_prior.censored_shape()
    assert reading is not None and reading.cut and not reading.shared
    policy = default_cost_policy(1e-3, max_samples=960, prior=tobit_prior)
    assert isinstance(policy, ShapePandora) and policy.censored and policy.floor_cuts
    assert decision_path(policy) == "cut"


def test_the_cut_gain_is_nil_where_the_benchmark_lies_under_the_best(tobit_prior):
    reading = tobit_prior.censored_shape()
    assert reading is not None and reading.cut
    floor = reading.floor
    gain = CensoredGain(reading, alpha=0.99)
    for v in [floor] * 40 + [floor + 0.5, floor + 0.2]:  # mostly at the floor: kappa is low
        gain.note(v)
    low, kappa_low = gain.gain(floor + 6.0)
    assert low < 1e-6 and kappa_low < floor + 6.0
    g, kappa = gain.gain(floor + 0.5)
    assert g > low and kappa > floor + 0.5


def test_skewness_falling_with_the_share_at_the_floor_refutes_a_cut(tobit_prior):
    """A cut makes the floor-heavy prompts' interiors the more skewed upper tails; the real
    pool's two clusters above a judge's clip show the opposite, and a likelihood that favours
    the cut there does not make it one."""
    reading = tobit_prior.censored_shape()
    assert reading is not None and reading.cut
    assert not replace(reading, floor_dependence=-FLOOR_DEPENDENCE_Z - 0.5).cut
    assert replace(reading, floor_dependence=-FLOOR_DEPENDENCE_Z + 0.5).cut
    assert not replace(reading, cut_evidence=CUT_EVIDENCE - 1.0).cut


FEW_ABOVE = [([0.6], 40), ([0.2, 1.1], 30), ([0.3, 0.9, 1.4], 20)]


@pytest.mark.parametrize(("inside", "at_floor"), FEW_ABOVE)
def test_few_rewards_above_many_at_the_floor_are_placed_as_on_a_fine_grid(
    monkeypatch, inside, at_floor
):
    """The grid's m span is capped at s: the floor's count places m within about s even when
    one reward above it leaves sqrt(N) / n large."""
    import stoppers.robust.latent_shape as latent

    normal = np.diff(special.ndtr(latent.EDGES))
    shape = FittedShape(p=normal / normal.sum(), requests=1, streams=1, tied=0.0)
    args = (shape, np.asarray(inside), at_floor, FLOOR, 0.0, 1.0 / 0.3**2)
    m, s, w = latent_posterior(*args)
    monkeypatch.setattr(latent, "LATENT_GRID", 81)
    m_fine, s_fine, w_fine = latent_posterior(*args)
    assert float(w @ m) == pytest.approx(float(w_fine @ m_fine), abs=0.05)
    assert float(w @ s) == pytest.approx(float(w_fine @ s_fine), abs=0.05)
