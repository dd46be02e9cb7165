"""BayesShapePandora and its backward-induction table (stoppers.robust.bayes_table)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy.ndimage import map_coordinates
from scipy.optimize import brentq
from scipy.stats import norm

from stoppers.robust.bayes_cost import MAX_COST_TABLES, BayesShapePandora, cost_table
from stoppers.robust.bayes_report import exact_normal_shape
from stoppers.robust.bayes_table import build_cost_table
from stoppers.robust.cost import TailPandora
from stoppers.robust.shape_cost import ShapePandora, cost_shape_prior

Q99 = norm.ppf(0.99)


def _ar(x):
    return np.minimum(2.0 / (1.0 + np.exp(-np.asarray(x, dtype=float))), 1.0)


def _margin(table, n, sd, gap):
    """The table's S_n - C_n at one state (the policy's lookup, without the >= 0)."""
    k = min(n, table.horizon)
    x = (math.log(sd) - table.log_sd[0]) / (table.log_sd[1] - table.log_sd[0])
    mode = np.interp(x, np.arange(table.log_sd.size), table.modes[k])
    y = (gap / math.exp(mode) - table.gap[0]) / (table.gap[1] - table.gap[0])
    return float(map_coordinates(table.margin[k], [[x], [y]], order=1)[0])


def test_last_bellman_step_matches_direct_integration():
    # Scale known (prior sd 1e-3 around s = 1), budget 10: at n = 9 the continuation is one
    # more draw and a forced stop. Integrate that directly and compare with the table.
    c = 2e-3
    table = build_cost_table(c, exact_normal_shape(0.0, 1e-3), max_samples=10, horizon=10)
    n, gap = 9, 1.6

    def stop_value(k: int, g: float) -> float:
        # m ~ N(mean, 1/k): E[AR(best - m - q)] with best - mean = g
        return integrate.quad(
            lambda e: _ar(g + e / math.sqrt(k) - Q99) * norm.pdf(e), -9, 9, limit=200
        )[0]

    def next_gap(y: float) -> float:
        return max(gap, y) - y / (n + 1)

    sd_y = math.sqrt(1.0 + 1.0 / n)
    cont = (
        -c
        + integrate.quad(
            lambda y: stop_value(n + 1, next_gap(y)) * norm.pdf(y, scale=sd_y),
            -8,
            8,
            points=[gap],
            limit=200,
        )[0]
    )
    expected = stop_value(n, gap) - cont
    assert _margin(table, n, 1.0, gap) == pytest.approx(expected, abs=2e-3)
    assert table.margin[10].min() == 1.0  # the budget row: always stop


def test_stop_set_is_an_upper_set_in_the_gap_and_dearer_samples_stop_sooner():
    shape = exact_normal_shape(0.0, 0.4)
    grid = {"max_samples": 60, "horizon": 60, "log_sd_nodes": 41, "gap_nodes": 81}
    cheap = build_cost_table(1e-4, shape, **grid)
    dear = build_cost_table(1e-2, shape, **grid)
    for table in (cheap, dear):
        for n in (10, 20, 40):
            for row in table.margin[n]:
                # the stop set is an upper set: once a gap is worth keeping, so is a larger
                # one (up to the grid's noise, ~1e-5 of utility near the boundary)
                first = np.argmax(row >= 0)
                assert row[first:].min() > -5e-5
    first = [
        next(u for u in np.linspace(0, 6, 601) if _margin(t, 20, 1.0, u) >= 0)
        for t in (cheap, dear)
    ]
    assert first[1] < first[0]


def test_known_scale_rule_earns_close_to_the_oracle_on_normal_rewards():
    # The model is right (normal shape, s = 1 known): the Bayes rule's profit on fresh streams
    # must be close to the fair cap (what the oracle that knows m and s earns).
    c = 1e-3
    table = build_cost_table(c, exact_normal_shape(0.0, 1e-3), max_samples=960, horizon=160)
    rng = np.random.default_rng(7)
    profits, ns = [], []
    for _ in range(300):
        m = rng.normal(0.0, 2.0)
        policy = BayesShapePandora(c, max_samples=960, table=table)
        for r in (m + rng.standard_normal(960)).tolist():
            if policy.observe(r):
                break
        profits.append(float(_ar(policy.best - m - Q99)) - c * policy.n)
        ns.append(policy.n)
    u = _ar(np.linspace(-9, 9, 20001) - Q99)
    w = norm.pdf(np.linspace(-9, 9, 20001))
    w /= w.sum()
    fair_cap = brentq(lambda t: float(w @ np.maximum(u - t, 0.0)) - c, 0.0, 1.0)
    assert np.mean(profits) / fair_cap > 0.97
    assert 30 < np.mean(ns) < 200


def test_cold_start_is_tail_pandora_decision_for_decision():
    rng = np.random.default_rng(1)
    young = cost_shape_prior()
    young.update(rng.normal(size=60).tolist())
    for prior in (None, young):
        for seed in range(10):
            stream = np.random.default_rng(seed).standard_t(3.0, 400)
            mine = BayesShapePandora(1e-3, max_samples=400, prior=prior)
            assert not mine.warm
            ref = TailPandora(1e-3, max_samples=400)
            for r in stream.tolist():
                a, b = mine.observe(r), ref.observe(r)
                assert a == b
                if a:
                    break
            assert (mine.n, mine.best, mine.stop_reason) == (ref.n, ref.best, ref.stop_reason)


def test_warm_policy_respects_min_samples_budget_and_ties():
    prior = cost_shape_prior()
    rng = np.random.default_rng(3)
    for _ in range(30):  # 30 x 36 pooled draws: enough to know the 0.99-quantile
        prior.update((rng.normal() + rng.standard_normal(60)).tolist())
    policy = BayesShapePandora(0.5, min_samples=5, max_samples=40, prior=prior, horizon=40)
    assert policy.warm
    stream = rng.standard_normal(40).tolist()
    stops = [policy.observe(r) for r in stream[:5]]
    assert stops == [False] * 4 + [True]  # at this cost the first allowed stop is taken
    assert policy.stop_reason == "threshold"
    tied = BayesShapePandora(1e-3, max_samples=12, prior=prior, horizon=12)
    assert [tied.observe(1.0) for _ in range(12)] == [False] * 11 + [True]
    assert tied.stop_reason == "budget"  # no spread: never judged, runs to the budget


def test_tables_are_cached_rebuilt_when_the_prior_doubles_and_bounded():
    prior = cost_shape_prior()
    rng = np.random.default_rng(5)
    for _ in range(8):
        prior.update(rng.standard_normal(40).tolist())
    small = {"max_samples": 30, "horizon": 30, "alpha": 0.99}
    first = cost_table(prior, 1e-3, **small)
    assert cost_table(prior, 1e-3, **small) is first
    for _ in range(8):
        prior.update(rng.standard_normal(40).tolist())
    rebuilt = cost_table(prior, 1e-3, **small)
    assert rebuilt is not first and rebuilt.requests == 16
    for k in range(MAX_COST_TABLES + 2):
        cost_table(prior, 1e-3 * (k + 2), **small)
    assert len(prior.cost_tables) == MAX_COST_TABLES
    assert prior.to_dict() == cost_shape_prior().from_dict(prior.to_dict()).to_dict()


def test_untrusted_shapes_keep_to_the_cold_start_like_shape_pandora():
    prior = cost_shape_prior()
    rng = np.random.default_rng(2)
    for k in range(20):  # prompts that differ in shape: half have a far better mode
        good = rng.random(80) < (0.4 if k % 2 else 0.0)
        prior.update(np.where(good, rng.normal(4.0, 0.5, 80), rng.normal(size=80)).tolist())
    assert prior.dispersion is not None and prior.dispersion > 1.6
    assert not BayesShapePandora(1e-3, max_samples=100, prior=prior).warm
    assert not ShapePandora(1e-3, max_samples=100, prior=prior, likelihood=False).warm
    # ShapePandora's likelihood path needs no shared shape (tests/test_robust_likelihood_cost.py)
    assert ShapePandora(1e-3, max_samples=100, prior=prior).fitted_shape is not None


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_rejects_bad_costs(bad):
    with pytest.raises(ValueError, match="cost"):
        BayesShapePandora(bad)
    with pytest.raises(ValueError, match="cost"):
        build_cost_table(bad, exact_normal_shape(0.0, 0.4), max_samples=10)


def test_rejects_bad_horizon_and_a_table_of_another_cost():
    with pytest.raises(ValueError, match="horizon"):
        BayesShapePandora(1e-3, horizon=2)
    table = build_cost_table(1e-3, exact_normal_shape(0.0, 0.4), max_samples=10, horizon=10)
    with pytest.raises(ValueError, match="built for cost"):
        BayesShapePandora(2e-3, table=table)


@pytest.mark.parametrize("policy_class", [BayesShapePandora, ShapePandora])
def test_warm_shape_policies_stop_at_a_tied_ceiling_but_not_at_a_point_mass(policy_class):
    # A clipped judge: the top score repeats. No location-scale shape can tell the benchmark
    # sits at the clip, so the ties decide (as in TailPandora): the 6th copy of the best stops,
    # a pile-up against the single reward at the next lower value (tracker.is_pile_up; with the
    # smallest gap 0.1 at sd ~1 the test allows the best 1.1 times the next value's mass).
    prior = cost_shape_prior()
    rng = np.random.default_rng(4)
    for _ in range(30):
        prior.update((rng.normal() + rng.standard_normal(60)).tolist())
    policy = policy_class(1e-6, max_samples=200, prior=prior)
    assert policy.warm
    stream = [0.1, 2.0, -0.4, 0.3, 2.0, -1.0, 0.0, 0.2, 0.5, 2.0, 2.0, 2.0, 1.0, 2.0]
    stops = [policy.observe(r) for r in stream]
    assert stops == [False] * 13 + [True] and policy.stop_reason == "tied"
    # identical rewards may be a lower clip with better answers above (AlpacaEval): keep going
    flat = policy_class(1e-6, max_samples=40, prior=prior)
    assert [flat.observe(0.7) for _ in range(40)] == [False] * 39 + [True]
    assert flat.stop_reason == "budget"


def test_bayes_report_runs_both_modes_on_a_small_pool(tmp_path, capsys):
    import json

    from stoppers.replay.synth import SynthSpec, generate
    from stoppers.robust.bayes_report import main

    pool = tmp_path / "normal.npz"
    # seed 4: on seed 3's prompts 10-39 the early shared-shape test (dispersion 1.33 against its
    # bar of 1.3) happened to read the 30 normal prompts as differing since 2026-11-29's tail fit
    np.savez(pool, **generate(SynthSpec(family="normal", prompts=40, samples=160, seed=4)))
    out = tmp_path / "frozen.json"
    args = ["--prompts", "3", "--permutations", "2", "--out", str(out)]
    # learning from 30 prompts at c = 1e-3 pools enough draws to trust the shape
    assert main(["frozen", str(pool), "--learn", "10:40", "--cost", "0.001", *args]) == 0
    result = json.loads(out.read_text())
    assert result["prior"]["warm"] is True
    rows = result["rows"]
    assert set(rows) == {"TailPandora", "ShapePandora", "BayesShapePandora", "best fixed N"}
    assert all(0 < rows[k]["samples"] <= 160 for k in rows if k != "best fixed N")
    assert main(["bound", str(pool), "--horizon", "40", "--cost", "0.01", *args]) == 0
    assert "scale known" in capsys.readouterr().out
    gumbel = tmp_path / "gumbel.npz"
    np.savez(gumbel, **generate(SynthSpec(family="gumbel", prompts=5, samples=40, seed=3)))
    with pytest.raises(SystemExit, match="normal"):
        main(["bound", str(gumbel), "--cost", "0.01", *args])
