"""The likelihood shape of a deployment (stoppers/robust/shape_likelihood.py) and the ShapePrior
streams it is fitted to."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stoppers.robust import shape_prior as sp
from stoppers.robust.cost_prior import CostShapePrior
from stoppers.robust.shape_likelihood import _gpd_tail, fit_shape, fit_shape_with_end, fit_shapes
from stoppers.robust.shape_prior import ShapePrior
from stoppers.robust.stop_table import Z_EDGES

EDGES = Z_EDGES
CENTRES = 0.5 * (EDGES[:-1] + EDGES[1:])
EULER = 0.5772156649015329
GUMBEL_SD = math.pi / math.sqrt(6.0)


def gumbel_z(rng: np.random.Generator, size) -> np.ndarray:
    """Standardised Gumbel draws (mean 0, sd 1): a right-skewed shape, 0.99-quantile 3.14."""
    return (rng.gumbel(size=size) - EULER) / GUMBEL_SD


def true_gumbel_quantile(p: float) -> float:
    return (-math.log(-math.log(p)) - EULER) / GUMBEL_SD


def quantile(shape: np.ndarray, p: float) -> float:
    return float(np.interp(p, np.cumsum(shape), EDGES[1:]))


def stopped_streams(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """Gumbel prompts (random location and scale) stopped by a data-dependent rule: after 8
    rewards, at the first whose best is 1.6 sds above the mean (at most 60)."""
    out = []
    for _ in range(count):
        x = rng.normal() + math.exp(rng.normal(0.0, 0.4)) * gumbel_z(rng, 60)
        for n in range(8, 61):
            head = x[:n]
            if (head.max() - head.mean()) >= 1.6 * head.std(ddof=1):
                break
        out.append(x[:n])
    return out


def test_fit_shape_recovers_a_skewed_shape_from_short_streams():
    rng = np.random.default_rng(0)
    streams = [rng.normal() + math.exp(rng.normal(0, 0.4)) * gumbel_z(rng, 16) for _ in range(300)]
    shape = fit_shape(streams, EDGES)
    assert shape is not None and shape.sum() == pytest.approx(1.0)
    assert float(shape @ CENTRES) == pytest.approx(0.0, abs=0.02)
    assert float(shape @ CENTRES**2) == pytest.approx(1.0, abs=0.05)
    for p, tol in ((0.5, 0.05), (0.9, 0.08), (0.99, 0.25)):
        assert quantile(shape, p) == pytest.approx(true_gumbel_quantile(p), abs=tol)


def test_the_likelihood_shape_is_not_bent_by_the_stopping_rule():
    """The recorded histogram of stopped Gumbel streams has too light a tail; the likelihood
    shape of the very same streams does not."""
    rng = np.random.default_rng(1)
    streams = stopped_streams(rng, 400)
    assert 8 <= np.mean([s.size for s in streams]) < 40  # the rule did stop them early
    recorded = ShapePrior(likelihood=False)
    for s in streams:
        recorded.update(s)
    truth = true_gumbel_quantile(0.99)
    from_record = quantile(recorded.z_counts / recorded.z_counts.sum(), 0.99)
    from_likelihood = quantile(fit_shape(streams, EDGES), 0.99)
    assert abs(from_likelihood - truth) < 0.2
    assert abs(from_record - truth) > 2 * abs(from_likelihood - truth)


def test_fit_shape_skips_what_says_nothing():
    assert fit_shape([], EDGES) is None
    assert fit_shape([[1.0, 2.0, 3.0], [2.0] * 10, [0.0, float("nan"), 1.0, 2.0]], EDGES) is None
    rng = np.random.default_rng(2)
    good = [rng.normal(size=12) for _ in range(20)]
    with_noise = [*good, [1.0, 2.0], [5.0] * 9]
    assert np.array_equal(fit_shape(good, EDGES), fit_shape(with_noise, EDGES))


def location_scale_streams(rng: np.random.Generator, draw, count: int) -> list[np.ndarray]:
    """``count`` prompts of 20-100 rewards ``draw(n)``, each at its own location and scale."""
    return [
        rng.normal() + rng.uniform(3.0, 7.0) * draw(int(rng.integers(20, 100)))
        for _ in range(count)
    ]


UNIFORM_END = math.sqrt(3.0)  # the standardised uniform's end: (1 - 1/2) / sqrt(1/12)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_streams_end_a_uniform_shape_where_the_histogram_smears_it(seed):
    rng = np.random.default_rng(seed)
    streams = location_scale_streams(rng, lambda n: rng.uniform(size=n), 40)
    smeared = fit_shape(streams, EDGES)
    ended, read, tail_mode = fit_shape_with_end(streams, EDGES)
    assert read and not tail_mode
    above = EDGES[1:] > UNIFORM_END + 0.05
    assert smeared[above].sum() > 0.005  # the histogram's tail runs on past the end
    assert ended[above].sum() < 0.001
    assert quantile(smeared, 0.999) > UNIFORM_END + 0.2
    assert quantile(ended, 0.999) == pytest.approx(UNIFORM_END, abs=0.06)
    assert quantile(ended, 0.99) == pytest.approx(0.98 * UNIFORM_END, abs=0.04)
    assert float(ended @ CENTRES) == pytest.approx(0.0, abs=0.02)
    assert float(ended @ CENTRES**2) == pytest.approx(1.0, abs=0.05)
    # fit_shapes: both from one EM fit (the table rule keeps the open one; Best-of-N's N the end)
    both_open, both_ended, _ = fit_shapes(streams, EDGES)
    assert np.array_equal(both_open, smeared) and np.array_equal(both_ended, ended)


@pytest.mark.parametrize(
    "draw",
    [
        lambda rng, n: rng.normal(size=n),
        lambda rng, n: rng.gumbel(size=n),
        lambda rng, n: rng.standard_t(4, size=n),
        lambda rng, n: rng.exponential(size=n),
        lambda rng, n: rng.pareto(1 / 0.3, size=n),
    ],
    ids=["normal", "gumbel", "student-t", "exponential", "pareto"],
)
def test_an_open_tail_keeps_the_histograms_fit(draw):
    rng = np.random.default_rng(3)
    streams = location_scale_streams(rng, lambda n: draw(rng, n), 40)
    shape, read, _ = fit_shape_with_end(streams, EDGES)
    assert not read
    assert np.array_equal(shape, fit_shape(streams, EDGES))
    both_open, both_ended, _ = fit_shapes(streams, EDGES)
    assert both_ended is None and np.array_equal(both_open, shape)


def test_gpd_tail_keeps_an_exponential_tail_and_the_mass():
    z = np.linspace(-1.0, 12.0, 5000)
    p = np.diff(np.interp(EDGES, z, 1.0 - np.exp(-(z + 1.0))))  # Exp(1) - 1: mean 0, sd 1
    p /= p.sum()
    spliced = _gpd_tail(p, EDGES, 0.1)
    assert spliced.sum() == pytest.approx(1.0)
    assert quantile(spliced, 0.99) == pytest.approx(math.log(100.0) - 1.0, abs=0.05)
    below = CENTRES < 1.0
    assert np.allclose(spliced[below], p[below] / p.sum() * spliced.sum(), atol=1e-12)


def test_streams_are_bounded_and_persisted():
    rng = np.random.default_rng(3)
    prior = ShapePrior()
    for _ in range(sp.STREAM_REQUESTS + 5):
        assert prior.update(rng.normal(size=sp.STREAM_REWARDS + 10))
    assert len(prior.streams) == sp.STREAM_REQUESTS
    assert all(len(s) == sp.STREAM_REWARDS for s in prior.streams)
    restored = ShapePrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    assert restored.streams == prior.streams and restored.likelihood
    key = prior.table_key(0.9, min_samples=8, horizon=128)
    assert restored.prepare(key)().z_star == prior.prepare(key)().z_star


@pytest.mark.parametrize(
    "streams",
    [
        "nope",
        [[1.0, 2.0]] * (sp.STREAM_REQUESTS + 1),
        [[0.0] * (sp.STREAM_REWARDS + 1)],
        [[]],
        [[1.0, float("inf")]],
        [["1.0", 2.0]],
        [[True, 2.0]],
    ],
)
def test_from_dict_rejects_streams_it_could_not_have_written(streams):
    state = ShapePrior().to_dict() | {"streams": streams}
    with pytest.raises(ValueError, match="stream"):
        ShapePrior.from_dict(state)


def test_an_old_snapshot_uses_the_recorded_shape_until_it_has_kept_streams():
    rng = np.random.default_rng(4)
    recorded = ShapePrior(likelihood=False)
    for _ in range(40):
        recorded.update(gumbel_z(rng, 30))
    old = recorded.to_dict()
    del old["streams"], old["likelihood"]  # what a gateway saved before this change
    restored = ShapePrior.from_dict(old)
    assert restored.likelihood and restored.streams == []
    key = restored.table_key(0.8, min_samples=8, horizon=128)
    assert restored.prepare(key)().z_star == recorded.prepare(key)().z_star
    for _ in range(sp.LIKELIHOOD_MIN_STREAMS):
        restored.update(gumbel_z(rng, 30))
    again = ShapePrior(likelihood=False, z_counts=restored.z_counts, s_counts=restored.s_counts)
    again.requests = restored.requests
    assert restored.prepare(key)().z_star != again.prepare(key)().z_star


def test_deconvolution_is_for_the_recorded_histogram_only():
    with pytest.raises(ValueError, match="likelihood=False"):
        ShapePrior(deconvolve=True)
    old = ShapePrior(likelihood=False, deconvolve=True).to_dict()
    del old["likelihood"], old["streams"]  # a deconvolving prior saved before the streams
    restored = ShapePrior.from_dict(old)
    assert restored.deconvolve and not restored.likelihood


def test_the_cost_prior_keeps_the_streams_of_its_likelihood_shape():
    rng = np.random.default_rng(5)
    prior = CostShapePrior()
    for _ in range(5):
        assert prior.update(rng.normal(size=40))
    assert len(prior.streams) == 5 and prior.likelihood
    restored = CostShapePrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    assert restored.streams == prior.streams and restored.likelihood


def test_table_keys_built_at_one_request_count_share_one_fit(monkeypatch):
    calls = []
    real = sp.fit_shapes

    def counting(streams, edges):
        calls.append(len(streams))
        return real(streams, edges)

    monkeypatch.setattr(sp, "fit_shapes", counting)
    rng = np.random.default_rng(6)
    prior = ShapePrior()
    for _ in range(12):
        prior.update(gumbel_z(rng, 30))
    for target in (0.7, 0.8, 0.9):
        prior.prepare(prior.table_key(target, min_samples=8, horizon=128))()
    assert calls == [12]
    prior.update(gumbel_z(rng, 30))
    prior.prepare(prior.table_key(0.9, min_samples=8, horizon=128))()
    assert calls == [12, 13]
