"""`pandora synth` pools: seeded, every family well-formed, prompts vary like real data."""

from __future__ import annotations

import numpy as np
import pytest

from stoppers.replay.synth import FAMILIES, SynthSpec, generate


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_seeded_and_finite(family: str) -> None:
    spec = SynthSpec(family=family, prompts=40, samples=200, seed=7)
    a, b = generate(spec), generate(spec)
    np.testing.assert_array_equal(a["rewards"], b["rewards"])
    assert a["rewards"].shape == (40, 200)
    assert np.isfinite(a["rewards"]).all()
    other = generate(SynthSpec(family=family, prompts=40, samples=200, seed=8))
    assert not np.array_equal(a["rewards"], other["rewards"])


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("clipped", "mixed")])
def test_location_and_scale_vary_across_prompts(family: str) -> None:
    out = generate(SynthSpec(family=family, prompts=300, samples=400, seed=1))
    r = out["rewards"]
    # Standardised families: each prompt's spread tracks its drawn scale, its mean its location.
    np.testing.assert_allclose(r.mean(axis=1), out["loc"], atol=6 * out["scale"].max() / 20)
    ratio = r.std(axis=1) / out["scale"]
    assert 0.75 < np.median(ratio) < 1.25
    spread = np.percentile(r.std(axis=1), [10, 90])
    assert spread[1] / spread[0] > 1.8  # scale varies across prompts like the real pool
    assert np.std(np.median(r, axis=1)) > 1.0  # and so does the level


def test_clipped_family_is_bounded_and_tied() -> None:
    out = generate(SynthSpec(family="clipped", prompts=100, samples=300, seed=0, bound=2.0))
    r = out["rewards"]
    assert r.min() >= -2.0 - 1e-12 and r.max() <= 2.0 + 1e-12
    at_lower = np.mean(np.isclose(r, -2.0))
    assert at_lower > 0.1
    assert np.mean([np.unique(row).size for row in r]) < 50  # rounded: many ties


def test_rounded_family_is_a_lattice_without_a_clip() -> None:
    spec = SynthSpec(family="rounded", prompts=60, samples=400, seed=0, resolution=1.0)
    r = generate(spec)["rewards"]
    np.testing.assert_array_equal(r, np.round(r))  # integers
    assert np.mean([np.unique(row).size for row in r]) < 12  # a handful of levels a prompt
    # no clip: the prompts' tops differ, none piles up at a common bound
    assert np.unique(r.max(axis=1)).size > 5
    # the same draws as `clipped` with a bound nothing reaches
    same = SynthSpec(family="clipped", prompts=60, samples=400, seed=0, bound=1e9, resolution=1.0)
    np.testing.assert_array_equal(r, generate(same)["rewards"])


def test_missing_fraction_leaves_nan_but_two_samples() -> None:
    out = generate(SynthSpec(prompts=50, samples=20, missing_fraction=0.3, seed=2))
    r = out["rewards"]
    assert 0.2 < np.isnan(r).mean() < 0.35
    assert (np.sum(~np.isnan(r), axis=1) >= 2).all()


def test_bad_spec_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown family"):
        SynthSpec(family="cauchy")
    with pytest.raises(ValueError):
        SynthSpec(samples=1)


@pytest.mark.parametrize("family", ["lognormal", "logistic"])
def test_held_out_families_are_standardised(family: str) -> None:
    from stoppers.replay.synth import _standard_draws

    z = _standard_draws(family, 400_000, np.random.default_rng(3))
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    skew = float(np.mean(z**3))
    assert (skew > 1.0) if family == "lognormal" else (abs(skew) < 0.05)


def test_later_families_leave_earlier_pools_unchanged() -> None:
    """``mixed`` draws its per-prompt families from the original seven only, so a pool made
    before lognormal / logistic existed reproduces from its seed."""
    out = generate(SynthSpec(family="mixed", prompts=200, samples=5, seed=0))
    assert set(out["family"]) <= {
        "normal",
        "gumbel",
        "skew-normal",
        "student-t",
        "mixture",
        "exponential",
        "clipped",
    }


def test_mixed_continuous_draws_every_continuous_family_and_no_ties() -> None:
    out = generate(SynthSpec(family="mixed-continuous", prompts=200, samples=300, seed=0))
    mixed = generate(SynthSpec(family="mixed", prompts=200, samples=2, seed=0))
    assert set(out["family"]) == set(mixed["family"]) - {"clipped"}  # the other six
    assert all(np.unique(row).size == row.size for row in out["rewards"])  # a continuum
