"""Rewards in half precision: a reward model on a GPU (the worker's ``auto`` dtype, vLLM's
pooling runner) returns bfloat16 scores, 8 significant bits whose step grows with the score's
magnitude, so most of a prompt's rewards tie on an uneven lattice. The defaults must decide on
them as they do on the same draws in full precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stoppers.replay.synth import PRECISIONS, SynthSpec, generate, to_precision
from stoppers.robust.ceiling import ceiling_of
from stoppers.robust.likelihood_cost import TIED_MAX
from stoppers.robust.loss_report import loss_breakdown
from stoppers.robust.pooled_target import PooledTargetAcceptance
from stoppers.robust.shape_prior import ShapePrior
from stoppers.robust.target_report import run_one


@pytest.mark.parametrize("precision", ["bfloat16", "float16", "float32"])
def test_to_precision_rounds_as_torch_casts(precision: str) -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.normal(0.0, 1.0, 2000),
            rng.normal(20.0, 3.0, 2000),
            rng.normal(-150.0, 40.0, 2000),
            [0.0, -0.0, 3.171875, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1e-30, np.nan, np.inf],
        ]
    )
    expected = torch.tensor(x, dtype=torch.float64).to(getattr(torch, precision)).double().numpy()
    np.testing.assert_array_equal(to_precision(x, precision), expected)
    np.testing.assert_array_equal(to_precision(x, "float64"), x)
    with pytest.raises(ValueError, match="unknown precision"):
        to_precision(x, "int8")


def test_synth_precision_and_level_leave_the_draws_alone() -> None:
    base = generate(SynthSpec(prompts=20, samples=300, seed=4))["rewards"]
    assert set(PRECISIONS) == {"float64", "float32", "bfloat16", "float16"}
    moved = generate(SynthSpec(prompts=20, samples=300, seed=4, loc_mean=20.0))["rewards"]
    np.testing.assert_allclose(moved - base, 20.0, atol=1e-12)
    half = generate(SynthSpec(prompts=20, samples=300, seed=4, loc_mean=20.0, precision="bfloat16"))
    r = half["rewards"]
    np.testing.assert_array_equal(r, to_precision(moved, "bfloat16"))
    np.testing.assert_array_equal(to_precision(r, "bfloat16"), r)  # already representable
    assert np.all(np.abs(r - moved) <= np.abs(moved) * 2.0**-8 + 1e-12)
    assert np.mean([np.unique(row).size for row in r]) < 100  # of 300: mostly ties
    with pytest.raises(ValueError, match="precision"):
        SynthSpec(precision="half")


def _pools(prompts: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The same draws in full precision and in bfloat16 at a reward model's usual level (~20,
    a step of 1/8 where the prompts' sd is about 1)."""
    spec = SynthSpec(prompts=prompts, samples=samples, seed=11, loc_mean=20.0)
    full = generate(spec)["rewards"]
    half = generate(SynthSpec(**(spec.to_dict() | {"precision": "bfloat16"})))["rewards"]
    return full, half


def test_target_default_delivers_the_same_on_bfloat16_rewards() -> None:
    """Measured at this seed: mean acceptance 0.931 in 51.3 rewards (float64) and 0.930 in 51.8
    (bfloat16); the replay report's 40 x 20 pools differed by <= 0.02 in median acceptance."""
    full, half = _pools(24, 400)
    rows = [
        run_one(pool, "pooled", orderings=2, targets=(0.9,))["0.9"]["all"] for pool in (full, half)
    ]
    assert abs(rows[0]["mean_acceptance"] - rows[1]["mean_acceptance"]) <= 0.03
    assert abs(rows[1]["mean_acceptance"] - 0.9) <= 0.06
    assert rows[1]["mean_samples"] == pytest.approx(rows[0]["mean_samples"], rel=0.2)


def test_cost_default_earns_the_same_on_bfloat16_rewards() -> None:
    """The profit ratio to the best fixed N on the same streams, and the rewards drawn: a
    bfloat16 lattice misread as a clip or a pile-up would stop early, one misread as integer
    scores would decide on the wrong shape. Measured at this seed: 1.0055 in 81.6 rewards
    (float64) and 1.0039 in 77.0 (bfloat16); on 16 prompts x 2 deployments the two differed by
    0.02, the replay's noise at that size."""
    full, half = _pools(24, 400)
    runs = [loss_breakdown(pool, 1e-3, orderings=3) for pool in (full, half)]
    ratios = [b.profit / b.fixed_profit for b in runs]
    assert abs(ratios[0] - ratios[1]) <= 0.01
    assert ratios[1] >= 0.99
    assert runs[1].samples == pytest.approx(runs[0].samples, rel=0.15)


def _prior_of(make, requests: int = 30) -> ShapePrior:
    prior = ShapePrior()
    for _ in range(requests):
        assert prior.update(list(make()))
    return prior


def test_a_fine_lattice_is_rounding_and_a_coarse_one_or_a_clip_is_not() -> None:
    rng = np.random.default_rng(0)

    def level_20() -> np.ndarray:  # a prompt's 60 rewards at a reward model's usual level
        return rng.normal(20.0, 2.0) + np.exp(rng.normal(0.0, 0.4)) * rng.standard_normal(60)

    half = _prior_of(lambda: to_precision(level_20(), "bfloat16"))
    assert half.lattice_step() == 0.125 and half.tied_streams() > TIED_MAX
    assert half.fine_lattice()
    for step in (0.5, 0.25):  # rounded scores: a quarter of an sd is a judge's levels
        rounded = _prior_of(lambda step=step: step * np.round(level_20() / step))
        assert rounded.lattice_step() == step and not rounded.fine_lattice()
    assert not _prior_of(level_20).fine_lattice()  # continuous: no lattice at all

    def clipped_at_21() -> np.ndarray:  # the top of the reward scale at 21, about 1 sd above
        x = rng.normal(20.0, 0.3) + rng.standard_normal(60)
        return to_precision(np.minimum(x, 21.0), "bfloat16")

    clipped = _prior_of(clipped_at_21)
    assert clipped.lattice_step() == 0.125 and ceiling_of(clipped) == 21.0
    assert not clipped.fine_lattice()  # a clip's point mass is no density's


def test_two_modes_in_bfloat16_are_read_as_in_full_precision() -> None:
    """A bulk and a better mode (``mixture``): the same draws in float64 and in bfloat16 at
    level ~20 both reach the two-mode rule once the prior has its 16 requests. Before
    2026-11-30 the bfloat16 ties kept it off, and mixture's 40 x 20 replay over-delivered at
    0.8 (0.857; 0.827 in float64)."""
    spec = SynthSpec(family="mixture", prompts=24, samples=200, seed=3, loc_mean=20.0)
    for precision in ("float64", "bfloat16"):
        rewards = generate(SynthSpec(**(spec.to_dict() | {"precision": precision})))["rewards"]
        prior = ShapePrior()
        for row in rewards:
            policy = PooledTargetAcceptance(0.8, prior=prior, max_samples=row.size)
            seen = []
            for reward in row:
                seen.append(float(reward))
                if policy.observe(float(reward)):
                    break
            prior.update(seen)
        assert prior.fine_lattice() == (precision == "bfloat16")
        assert PooledTargetAcceptance(0.8, prior=prior, max_samples=200).multimodal, precision
