"""`pandora synth` pools: seeded, every family well-formed, prompts vary like real data."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from stoppers.replay.synth import (
    FAMILIES,
    HELD_OUT_2,
    HELD_OUT_3,
    HELD_OUT_4,
    HELD_OUT_5,
    LUMPY_FAMILIES,
    SynthSpec,
    generate,
)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_seeded_and_finite(family: str) -> None:
    spec = SynthSpec(family=family, prompts=40, samples=200, seed=7)
    a, b = generate(spec), generate(spec)
    np.testing.assert_array_equal(a["rewards"], b["rewards"])
    assert a["rewards"].shape == (40, 200)
    assert np.isfinite(a["rewards"]).all()
    other = generate(SynthSpec(family=family, prompts=40, samples=200, seed=8))
    assert not np.array_equal(a["rewards"], other["rewards"])


@pytest.mark.parametrize(
    "family",
    [
        f
        for f in FAMILIES
        if f not in ("clipped", "mixed", "wide-lumps", *HELD_OUT_3, *HELD_OUT_4, *LUMPY_FAMILIES)
    ],
)
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


def test_floored_family_is_a_normal_cut_at_its_floor_only() -> None:
    spec = SynthSpec(family="floored", prompts=100, samples=300, seed=0, bound=2.0)
    out = generate(spec)
    r = out["rewards"]
    assert r.min() == -2.0 and r.max() > 4.0  # cut below, open above
    at_floor = np.mean(r == -2.0, axis=1)
    assert 0.1 < at_floor.mean() < 0.5
    assert np.corrcoef(at_floor, out["loc"])[0, 1] < -0.7  # a low prompt sits at the floor
    assert np.mean([np.unique(row).size for row in r]) > 200  # continuous above it
    normal = generate(replace(spec, family="normal"))["rewards"]
    np.testing.assert_array_equal(r, np.maximum(normal, -2.0))  # the same draws, cut


def test_judge_family_piles_a_share_of_each_prompt_at_one_floor() -> None:
    spec = SynthSpec(family="judge", prompts=100, samples=400, seed=0)
    out = generate(spec)
    r = out["rewards"]
    floor = -4.0 * (spec.loc_spread + spec.scale_median)
    assert r.min() == floor
    at_floor = np.mean(r == floor, axis=1)
    assert at_floor.min() > 0.05 and at_floor.max() < 0.95 and np.std(at_floor) > 0.15
    assert abs(np.corrcoef(at_floor, out["loc"])[0, 1]) < 0.3  # the share is the prompt's own
    above = [row[row > floor] for row in r]
    np.testing.assert_allclose([a.mean() for a in above], out["loc"], atol=0.5)
    assert 0.75 < np.median([a.std() for a in above] / out["scale"]) < 1.25


def test_repeats_family_repeats_responses_as_often_as_each_prompt_draws() -> None:
    """Each prompt holds its own number of distinct rewards, from a handful to hundreds, at
    values off any lattice; the distinct values are the prompt's normal draws."""
    spec = SynthSpec(family="repeats", prompts=200, samples=960, seed=0)
    out = generate(spec)
    r = out["rewards"]
    distinct = np.array([np.unique(row).size for row in r])
    assert distinct.min() <= 10 and distinct.max() >= 300
    assert 30 <= np.median(distinct) <= 120  # E[D] ~ theta log(1 + n / theta), theta log-uniform
    rows = zip(r, out["loc"], out["scale"], strict=True)
    z = np.concatenate([(np.unique(row) - m) / s for row, m, s in rows])
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1.0) < 0.1  # the base: a standard normal
    row = np.unique(r[np.argmax(distinct)])
    assert np.unique(np.round(np.diff(row) / np.diff(row).min(), 6)).size > 100  # no lattice


def test_low_temperature_family_repeats_a_few_replies() -> None:
    """The same process at a low concentration: most prompts hold a handful of distinct
    rewards in 960, many a single one."""
    out = generate(SynthSpec(family="low-temperature", prompts=200, samples=960, seed=0))
    distinct = np.array([np.unique(row).size for row in out["rewards"]])
    assert np.median(distinct) <= 4 and np.mean(distinct == 1) > 0.2 and distinct.max() <= 40
    top_share = [np.unique(row, return_counts=True)[1].max() / row.size for row in out["rewards"]]
    assert np.median(top_share) > 0.6  # one reply holds most of a prompt's draws


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


def _standardised_rows(family: str) -> np.ndarray:
    out = generate(SynthSpec(family=family, prompts=200, samples=960, seed=0))
    return (out["rewards"] - out["loc"][:, None]) / out["scale"][:, None]


def _skewness(z: np.ndarray) -> np.ndarray:
    c = z - z.mean(axis=1, keepdims=True)
    return (c**3).mean(axis=1) / (c**2).mean(axis=1) ** 1.5


def test_held_out_5_families_have_their_shapes() -> None:
    """The families of 2026-12-01 (seventeenth session) hold what they are named for."""
    assert set(HELD_OUT_5) <= set(FAMILIES)
    # top-lump: a tight lump of 2-10% of the draws three bulk sds up, where the top percent
    # sits (a bulk draw past it now and then)
    z = np.sort(_standardised_rows("top-lump"), axis=1)
    lump = np.median(z[:, -10:], axis=1, keepdims=True)  # the top 1% of 960
    in_lump = np.mean(np.abs(z - lump) < 0.15, axis=1)
    assert in_lump.min() > 0.01 and in_lump.max() < 0.15
    assert np.mean(z[:, -1] - z[:, -10] < 0.3) > 0.6
    # varied-gpd: tails from a soft end to a power law, prompt by prompt
    skew = _skewness(_standardised_rows("varied-gpd"))
    assert np.percentile(skew, 10) < 1.3 and np.percentile(skew, 90) > 4.0
    # varied-skew: long right tails and long left ones in one deployment
    skew = _skewness(_standardised_rows("varied-skew"))
    assert (skew < -0.5).mean() > 0.3 and (skew > 0.5).mean() > 0.3
    # heavy-t: a fourth moment that does not exist
    z = _standardised_rows("heavy-t")
    kurtosis = (z**4).mean(axis=1) / (z**2).mean(axis=1) ** 2
    assert np.median(kurtosis) > 6.0
    # saturated: pressed against the top (left-skewed), bounded by its own scale
    skew = _skewness(_standardised_rows("saturated"))
    assert (skew < 0).mean() > 0.7
    # wide-lumps: three lumps of sd 0.35, so a prompt's draws fall in at most three clusters
    z = np.sort(_standardised_rows("wide-lumps"), axis=1)
    assert np.all(np.sum(np.diff(z, axis=1) > 0.5, axis=1) <= 2)


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


def _standard_row(family: str, samples: int = 100_000) -> np.ndarray:
    spec = SynthSpec(family=family, prompts=1, samples=samples, seed=3, loc_spread=0.0)
    out = generate(replace(spec, scale_spread=0.0))
    return out["rewards"][0]


@pytest.mark.parametrize(
    ("family", "end"),
    [("uniform", 3**0.5), ("reflected-exponential", 1.0), ("reflected-gamma", 2**0.5)],
)
def test_bounded_families_end_where_they_say(family: str, end: float) -> None:
    z = _standard_row(family)
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1.0) < 0.02
    assert z.max() <= end + 1e-12
    assert z.max() > end - 0.01  # the end is reached: mass right up to it


def test_pareto_has_a_power_law_tail_and_rare_mode_a_far_cluster() -> None:
    z = _standard_row("pareto", 400_000)
    assert abs(z.std() - 1.0) < 0.05
    q = np.quantile(z - z.min(), [0.99, 0.999])
    # GPD(xi = 0.3): (0.001^-0.3 - 1) / (0.01^-0.3 - 1) = 2.33; an exponential tail gives 1.5
    assert 2.1 < q[1] / q[0] < 2.6
    rare = generate(SynthSpec(family="rare-mode", prompts=50, samples=2000, seed=4))
    z = (rare["rewards"] - rare["loc"][:, None]) / rare["scale"][:, None]
    far = (z > 3.0).mean(axis=1)  # the better mode sits ~4.5 standardised units up
    assert 0.005 < np.median(far) < 0.06 and far.min() > 0.0


def test_held_out_families_leave_earlier_pools_unchanged() -> None:
    """Adding families must not move an earlier pool: these sums and values are what the code
    before the 2026-11-29 families drew for the same specs."""
    for family, total, row in (
        ("mixed", -513.5529883895981, (-0.43471022, -0.68274865, 1.54350247)),
        ("mixed-continuous", -453.19470130291035, (-1.85170905, -0.99446984, -1.38620879)),
    ):
        out = generate(SynthSpec(family=family, prompts=30, samples=50, seed=11))
        assert out["rewards"].sum() == pytest.approx(total, abs=1e-9)
        np.testing.assert_allclose(out["rewards"][3, :3], row, atol=1e-8)
        assert not set(HELD_OUT_2) & set(out["family"].tolist())


def test_lumpy_family_scores_a_few_answers_each_alike() -> None:
    """Each prompt's rewards sit in six tight lumps: sorted, they jump between lumps by far more
    than the spread within one, and the prompts differ in where their lumps are."""
    out = generate(SynthSpec(family="lumpy", prompts=50, samples=960, seed=0))
    r = out["rewards"]
    z = (r - out["loc"][:, None]) / out["scale"][:, None]
    for row in z:
        gaps = np.diff(np.sort(row))
        big = gaps > 0.3  # between lumps (the lumps' sd is 0.08)
        assert big.sum() <= 5
    tops = np.sort(z, axis=1)[:, -1]
    assert np.std(tops) > 0.4  # the top lump moves from prompt to prompt
