"""ShapePrior.build_table deconvolves the recorded predictive statistic into the shape."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from stoppers.replay.metrics import acceptance_rate
from stoppers.robust import shape_deconvolve as dc
from stoppers.robust import shape_prior as sp
from stoppers.robust import stop_table as st
from stoppers.robust.pooled_target import PooledTargetAcceptance
from stoppers.robust.shape_prior import ShapePrior

GUMBEL_SD = math.pi / math.sqrt(6.0)


def _shape(name):
    """Histogram (sp's z bins) of a standardised shape."""
    if name == "gumbel":
        cdf = stats.gumbel_r.cdf(st.Z_EDGES * GUMBEL_SD + np.euler_gamma)
    elif name == "t3":
        cdf = stats.t.cdf(st.Z_EDGES * math.sqrt(3.0), 3.0)
    else:
        cdf = stats.norm.cdf(st.Z_EDGES)
    w = np.diff(cdf)
    return w / w.sum()


def _scales():
    sw = np.diff(stats.norm.cdf(np.linspace(st.S_LO, st.S_HI, st.S_BINS + 1), 0.0, 0.4))
    return sw / sw.sum()


def _recorded_under_rule(w, sw, target):
    """What ShapePrior.update records from streams of shape w stopped by w's own rule."""
    table, q_alpha = st.plug_in(w, sw, target, 0.99, 1)
    rule = st.calibrate(table, w, sw, q_alpha, 8, 960, 1)
    z, log_s = st.simulated_streams(w, sw, 960, 99)  # other draws than the calibration's
    x = np.exp(log_s)[:, None] * z
    margin, shrink, _, _, _ = st.rule_margin(rule, x, 8)
    hit = margin - rule.slope * shrink >= rule.offset
    stop = np.where(hit.any(axis=1), np.argmax(hit, axis=1), x.shape[1] - 1)
    recorded = dc.recorded_histogram(x, stop, 4)
    return recorded / recorded.sum()


def _deconvolved(observed, sw, target):
    table, q_alpha = st.plug_in(observed, sw, target, 0.99, 1)
    rule = st.calibrate(table, observed, sw, q_alpha, 8, 960, 1)
    return dc.deconvolve_shape(observed, sw, rule, 8, 960, 1, 4)


def test_g_and_h_is_the_identity_at_zero_and_standardises():
    zc = st.bin_centres(st.Z_LO, st.Z_HI, st.Z_BINS)
    assert np.array_equal(dc._g_and_h(zc, 0.0, 0.0), zc)
    out = dc._gh_shape(_shape("normal"), 0.3, 0.1)
    mean = out @ zc
    assert out.sum() == pytest.approx(1.0)
    assert mean == pytest.approx(0.0, abs=0.02)
    assert math.sqrt(out @ (zc - mean) ** 2) == pytest.approx(1.0, abs=0.02)
    assert out @ (zc - mean) ** 3 > 0.5  # g > 0 skews to the right


def test_recorder_matches_shape_prior_update():
    """recorded_histogram keeps exactly the draws ShapePrior.update standardises, equal values."""
    rng = np.random.default_rng(0)
    x = rng.gumbel(size=(1, 30))
    recorded = dc.recorded_histogram(x, np.array([19]), 4)
    z = ShapePrior()._standardise(x[0, :20])
    idx = np.clip(
        ((z - st.Z_LO) / (st.Z_HI - st.Z_LO) * st.Z_BINS).astype(np.int64), 0, st.Z_BINS - 1
    )
    assert np.array_equal(recorded, np.bincount(idx, minlength=st.Z_BINS))


@pytest.mark.parametrize("name", ["gumbel", "t3"])
def test_deconvolution_recovers_skewed_and_heavy_shapes(name):
    """Recorded predictive draws of stopped streams make the body too wide (t3: 0.9-quantile
    1.32 against 0.95); the deconvolved shape's quantiles are back near the true ones."""
    w, sw = _shape(name), _scales()
    observed = _recorded_under_rule(w, sw, 0.7)
    true_q = dc._quantiles(w)
    raw_err = np.max(np.abs(dc._quantiles(observed) - true_q)[1:-1])
    dec_err = np.max(np.abs(dc._quantiles(_deconvolved(observed, sw, 0.7)) - true_q)[1:-1])
    assert raw_err > 0.15
    assert dec_err < 0.5 * raw_err


def test_normal_shape_is_a_fixed_point():
    w, sw = _shape("normal"), _scales()
    observed = _recorded_under_rule(w, sw, 0.7)
    out = _deconvolved(observed, sw, 0.7)
    assert np.max(np.abs(dc._quantiles(out) - dc._quantiles(w))) < 0.06


def test_deconvolved_tables_deliver_a_low_target_on_gumbel_prompts():
    """Given what Gumbel deployments record, the built tables deliver 0.7 on fresh Gumbel
    prompts (mean over 4 Monte Carlo seeds: one build's own calibration noise is ~0.01-0.02);
    built on the recorded histogram as if it were the shape they deliver ~0.63."""
    w, sw = _shape("gumbel"), _scales()
    observed = _recorded_under_rule(w, sw, 0.7)
    tables = {"deconvolved": [], "raw": []}
    for seed in range(1, 5):
        tables["deconvolved"].append(
            sp.build_table(observed * 20000, sw * 1000, 0.7, 0.99, 8, 960, seed, deconvolve=True)
        )
        # the default (deconvolve off) is exactly the table built on the recorded histogram
        default = sp.build_table(observed * 20000, sw * 1000, 0.7, 0.99, 8, 960, seed)
        raw, q_alpha = st.plug_in(observed, sw, 0.7, 0.99, seed)
        tables["raw"].append(st.calibrate(raw, observed, sw, q_alpha, 8, 960, seed))
        for name, value in vars(tables["raw"][-1]).items():  # equal up to rounding
            if value is None:  # no lattice
                assert getattr(default, name) is None, name
                continue
            assert np.allclose(getattr(default, name), value, rtol=1e-9, atol=1e-12), name
    rng = np.random.default_rng(7)
    delivered = {name: [] for name in tables}
    for _ in range(300):
        z = (rng.gumbel(size=960) - np.euler_gamma) / GUMBEL_SD
        pool = rng.normal(0, 2) + math.exp(rng.normal(0, 0.4)) * z
        kappa = np.quantile(pool, 0.99, method="inverted_cdf")
        for name, built in tables.items():
            for table in built:
                prior = ShapePrior(z_counts=observed, s_counts=sw, requests=1)
                prior.table = lambda *args, _t=table, **kwargs: _t  # this very table
                policy = PooledTargetAcceptance(0.7, prior=prior, max_samples=960, cold_start=1)
                for v in pool:
                    if policy.observe(float(v)):
                        break
                delivered[name].append(float(acceptance_rate(policy.best, kappa)))
    assert np.mean(delivered["deconvolved"]) == pytest.approx(0.7, abs=0.03)
    assert np.mean(delivered["raw"]) < 0.67


def test_deconvolution_is_opt_in_and_survives_a_round_trip():
    assert ShapePrior().deconvolve is False
    prior = ShapePrior(likelihood=False, deconvolve=True)
    assert prior.update(np.random.default_rng(0).normal(size=40))
    assert ShapePrior.from_dict(prior.to_dict()).deconvolve is True
    legacy = prior.to_dict()
    del legacy["deconvolve"], legacy["likelihood"], legacy["streams"]  # before both options
    restored = ShapePrior.from_dict(legacy)
    assert restored.deconvolve is False and restored.likelihood is True
