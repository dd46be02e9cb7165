"""The told-shape ablation: evidence-weighted mixtures of shapes and the replay against fixed N."""

from __future__ import annotations

import numpy as np
import pytest

from stoppers.replay.synth import SynthSpec, generate
from stoppers.robust.likelihood_cost import CENTRES, EDGES, FittedShape
from stoppers.robust.told_shape import (
    WEIGHT_FACTORS,
    ShapeMixture,
    main,
    replay_told,
    told_mixtures,
    weight_family,
)

PRIOR = (0.0, 4.0)  # scale_mu, scale_precision


def _shape(z: np.ndarray) -> FittedShape:
    counts = np.histogram(np.clip(z, EDGES[0], EDGES[-1] - 1e-9), EDGES)[0]
    return FittedShape(p=counts / counts.sum(), requests=1, streams=1, tied=0.0)


@pytest.fixture(scope="module")
def shapes() -> tuple[FittedShape, FittedShape]:
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(200_000)
    skewed = rng.exponential(1.0, 200_000) - 1.0
    return _shape(normal), _shape(skewed)


def test_log_posterior_normalised_is_the_posterior(shapes):
    normal, _ = shapes
    x = np.random.default_rng(1).normal(3.0, 2.0, 40)
    m, s, w = normal.posterior(x, *PRIOR)
    m_all, s_all, log_w = normal.log_posterior(x, *PRIOR)
    full = np.exp(log_w - log_w.max())
    keep = full > 1e-6
    np.testing.assert_allclose(w, full[keep] / full[keep].sum(), rtol=1e-12)
    np.testing.assert_array_equal(m, m_all[keep])
    np.testing.assert_array_equal(s, s_all[keep])


def test_a_mixture_of_one_shape_is_the_likelihood_rule(shapes):
    normal, _ = shapes
    x = np.random.default_rng(2).normal(0.0, 1.5, 30)
    best = float(x.max())
    z_alpha = normal.quantile(0.99)
    expected, _ = normal.posterior_gain(x, best, z_alpha, *PRIOR)
    gain = ShapeMixture((normal,), (1.0,)).posterior_gain(x, best, *PRIOR)
    assert gain == pytest.approx(expected, rel=1e-9)


def test_evidence_picks_the_shape_the_rewards_came_from(shapes):
    """Skewed rewards move the posterior to the skewed shape as they accumulate; normal ones
    to the normal shape - whatever the location and scale."""
    normal, skewed = shapes
    mixture = ShapeMixture((normal, skewed), (0.5, 0.5))
    rng = np.random.default_rng(3)
    from_skewed = 5.0 + 2.0 * (rng.exponential(1.0, 256) - 1.0)
    from_normal = -3.0 + 0.5 * rng.standard_normal(256)
    shares = [mixture.shares(from_skewed[:n], *PRIOR)[1] for n in (16, 64, 256)]
    assert 0.5 < shares[0] < shares[1] < shares[2] and shares[2] > 0.99
    shares = [mixture.shares(from_normal[:n], *PRIOR)[0] for n in (16, 64, 256)]
    assert 0.5 < shares[0] < shares[1] < shares[2] and shares[2] > 0.99
    # the mixture's gain lies between its components' gains (a posterior average)
    x = 2.0 + rng.exponential(1.0, 20)
    best = float(x.max())
    gains = [ShapeMixture((s,), (1.0,)).posterior_gain(x, best, *PRIOR) for s in (normal, skewed)]
    assert min(gains) <= mixture.posterior_gain(x, best, *PRIOR) <= max(gains)


def test_told_mixtures_modes():
    rows = np.random.default_rng(4).normal(size=(4, 50))
    labels = ["a", "b", "a", "b"]
    own = told_mixtures(rows, "own")
    assert len(own) == 4 and all(len(m.shapes) == 1 for m in own)
    assert own[0].shapes[0] is not own[1].shapes[0]
    pooled = told_mixtures(rows, "pooled")
    assert all(m is pooled[0] for m in pooled)
    by_label = told_mixtures(rows, "label", labels)
    assert by_label[0].shapes[0] is by_label[2].shapes[0]
    assert by_label[0].shapes[0] is not by_label[1].shapes[0]
    assert len(set(map(id, told_mixtures(rows, "mixture", labels)))) == 1
    assert told_mixtures(rows, "mixture", labels)[0].weights == (0.5, 0.5)
    # one label: its shape is the pooled shape
    np.testing.assert_array_equal(
        told_mixtures(rows, "label", ["x"] * 4)[0].shapes[0].p, pooled[0].shapes[0].p
    )
    with pytest.raises(ValueError, match="mode must be one of"):
        told_mixtures(rows, "nope")
    with pytest.raises(ValueError, match="needs one label per prompt"):
        told_mixtures(rows, "label")
    with pytest.raises(ValueError, match="finite and spread"):
        told_mixtures(np.ones((2, 5)), "own")
    with pytest.raises(ValueError, match="one weight per shape"):
        ShapeMixture((pooled[0].shapes[0],), (0.5, 0.5))


@pytest.fixture(scope="module")
def two_families() -> tuple[np.ndarray, list[str]]:
    """Four normal and four Student-t prompts: the blend's tail is too long for the normal
    prompts and too short for the Student-t ones."""
    normal = generate(SynthSpec(family="normal", prompts=4, samples=480, seed=5))["rewards"]
    heavy = generate(SynthSpec(family="student-t", prompts=4, samples=480, seed=6))["rewards"]
    return np.vstack([normal, heavy]), ["normal"] * 4 + ["student-t"] * 4


def test_told_each_prompts_family_beats_the_blend(two_families):
    rows, labels = two_families
    told = {
        mode: replay_told(rows, told_mixtures(rows, mode, labels), 1e-3, orderings=4)
        for mode in ("label", "pooled")
    }
    assert told["label"].best_fixed_n == told["pooled"].best_fixed_n  # the same streams
    assert told["label"].fixed_profit == told["pooled"].fixed_profit
    assert told["label"].ratio > told["pooled"].ratio
    split = replay_told(rows, told_mixtures(rows, "pooled"), 1e-3, orderings=4, labels=labels)
    assert split.profit == told["pooled"].profit
    assert set(split.by_label) == {"normal", "student-t"}
    # the labels' requests split the profit and the samples
    (r_n, n_n), (r_t, n_t) = split.by_label["normal"], split.by_label["student-t"]
    assert (n_n + n_t) / 2 == pytest.approx(split.samples)
    assert min(r_n, r_t) <= split.ratio <= max(r_n, r_t)
    for r in told.values():
        assert 8 <= r.samples <= 480
        assert 0.0 < r.se_deployments < 0.5 and 0.0 < r.se_prompts < 0.5


def test_cli(tmp_path, two_families, capsys):
    rows, labels = two_families
    path = tmp_path / "pool.npz"
    np.savez(path, rewards=rows[[0, 4]], family=np.array([labels[0], labels[4]]))
    args = [str(path), "--cost", "0.01", "--orderings", "2", "--max-samples", "60"]
    assert main([*args, "--shape", "own", "--shape", "mixture", "--label-key", "family"]) == 0
    out = capsys.readouterr().out
    assert out.count("x best fixed N") == 2 and out.startswith("own")
    assert out.count("x the same fixed N on its requests") == 4  # two labels, two modes
    # without labels every prompt has one: the pooled shape
    assert main([*args, "--shape", "label", "--shape", "pooled"]) == 0
    label, pooled = capsys.readouterr().out.strip().splitlines()[::2]
    assert label.split("x best")[0].split(":")[1] == pooled.split("x best")[0].split(":")[1]


def test_weight_family_leaves_the_better_modes_weight_to_the_request():
    """A two-mode shape becomes shapes that share its two modes and differ in how often the
    better one comes; each re-standardised. The request's evidence picks its own weight."""
    rng = np.random.default_rng(7)

    def two_mode(weight: float, size: int) -> np.ndarray:
        return np.where(
            rng.random(size) < weight, rng.normal(2.5, 0.5, size), rng.normal(size=size)
        )

    pooled = _shape(np.concatenate([two_mode(w, 50_000) for w in (0.1, 0.25, 0.4)]) / 1.4)
    family = weight_family(pooled)
    assert len(family.shapes) == len(WEIGHT_FACTORS)
    means = [float(s.p @ CENTRES) for s in family.shapes]
    sds = [
        float(np.sqrt(s.p @ (CENTRES - m) ** 2)) for s, m in zip(family.shapes, means, strict=True)
    ]
    np.testing.assert_allclose(means, 0.0, atol=0.01)
    np.testing.assert_allclose(sds, 1.0, atol=0.01)
    # a rarer better mode puts the benchmark quantile further out, in standardised units
    quantiles = [s.quantile(0.99) for s in family.shapes]
    assert quantiles == sorted(quantiles, reverse=True) and quantiles[0] > quantiles[-1] + 0.5
    # rewards with a rare better mode favour the low weights, a frequent one the high weights
    for weight, side in ((0.1, slice(None, 3)), (0.4, slice(4, None))):
        shares = family.shares(3.0 + 2.0 * two_mode(weight, 400), *PRIOR)
        assert shares[side].sum() > 0.8
    # one mode: nothing to re-weight
    normal = _shape(rng.standard_normal(100_000))
    assert weight_family(normal).shapes == (normal,)
