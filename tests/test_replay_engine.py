"""The replay engine's building blocks against brute force: streaming statistics, fixed-N curves,
the empirical fair cap and Weitzman's oracle, the matched-N interpolation."""

from __future__ import annotations

import numpy as np
import pytest

from stoppers.replay.baselines import (
    empirical_fair_cap,
    fixed_acceptance_curves,
    fixed_best,
    oracle_outcome,
)
from stoppers.replay.batch import PromptBatch
from stoppers.replay.experiments import matched_fixed_n
from stoppers.replay.metrics import acceptance_rate, benchmark
from stoppers.replay.orderings import orderings
from stoppers.replay.streaming import run_streaming


@pytest.mark.parametrize("median", ["lower", "upper", "mean"])
def test_streaming_statistics_equal_brute_force(median: str) -> None:
    rng = np.random.default_rng(1)
    # Rounded values: plenty of ties at and around the median.
    pools = [np.round(rng.normal(size=m), 1) for m in (13, 20, 7)]
    batch = PromptBatch.build(pools, [0, 1, 2], permutations=4, seed=3, alpha=0.9, max_samples=15)
    seen = {}

    def record(s):
        for idx in np.ndindex(s.n.shape):
            if s.n[idx] > batch.budget[s.row[idx]]:
                continue  # a block may run past a row's budget; the engine stops it there
            seen[int(s.row[idx]), int(s.n[idx])] = (
                s.median[idx],
                s.tail_count[idx],
                s.tail_sum[idx] * np.exp(s.reference[idx]),
                s.best[idx],
            )
        return np.zeros(s.n.shape, dtype=bool)

    (out,) = run_streaming(batch, [record], median=median, block=4)
    np.testing.assert_array_equal(out.n, batch.budget)  # never stops: runs to the budget
    assert len(seen) == int(batch.budget.sum())
    for (row, n), (med, count, tail, best) in seen.items():
        x = batch.values[row, :n]
        srt = np.sort(x)
        expect = {"lower": srt[(n + 1) // 2 - 1], "upper": srt[n // 2], "mean": np.median(x)}
        assert med == pytest.approx(expect[median])
        above = x[x > expect[median]]
        assert count == above.size
        assert tail == pytest.approx(np.exp(above).sum(), rel=1e-12)
        assert best == x.max()


def test_deciders_stop_at_first_true_and_rows_are_independent() -> None:
    pools = [np.arange(10.0), np.arange(10.0)[::-1].copy()]
    batch = PromptBatch.build(pools, [0, 1], permutations=3, seed=0, alpha=0.5)
    at_five = run_streaming(batch, [lambda s: s.n >= 5, lambda s: s.best >= 8.0], block=3)
    np.testing.assert_array_equal(at_five[0].n, 5)
    prefix = fixed_best(batch)
    expect = np.argmax(prefix >= 8.0, axis=1) + 1
    np.testing.assert_array_equal(at_five[1].n, expect)
    np.testing.assert_array_equal(at_five[1].best, prefix[np.arange(batch.rows), expect - 1])


def test_min_samples_and_budget_bound_every_stop() -> None:
    rng = np.random.default_rng(6)
    pools = [rng.normal(size=50), rng.normal(size=5)]  # the second budget < min_samples
    batch = PromptBatch.build(pools, [0, 1], permutations=3, seed=0, alpha=0.9)
    asked = []

    def always(s):
        asked.append(int(s.n.min()))
        return np.ones(s.n.shape, dtype=bool)

    always.min_samples = 7
    (out,) = run_streaming(batch, [always], block=4)
    np.testing.assert_array_equal(batch.per_prompt(out.n), [[7, 7, 7], [5, 5, 5]])
    assert min(asked) >= 7  # never asked before min_samples


def test_orderings_are_seeded_per_prompt_and_uniform() -> None:
    a = orderings(5, 4000, seed=1, prompt_index=3)
    np.testing.assert_array_equal(a, orderings(5, 4000, seed=1, prompt_index=3))
    assert not np.array_equal(a, orderings(5, 4000, seed=1, prompt_index=4))
    assert (np.sort(a, axis=1) == np.arange(5)).all()
    first = np.bincount(a[:, 0], minlength=5) / 4000
    assert np.abs(first - 0.2).max() < 0.03


def test_fixed_curves_are_monotone_and_exact() -> None:
    rng = np.random.default_rng(2)
    pools = [rng.normal(size=40), np.round(rng.normal(size=25), 1), rng.gumbel(size=40)]
    batch = PromptBatch.build(pools, [0, 1, 2], permutations=50, seed=0, alpha=0.99)
    curves = fixed_acceptance_curves(batch)
    assert curves.shape == (3, 40)
    assert (np.diff(curves, axis=1) >= 0).all()
    # N = whole pool keeps the pool's max: acceptance exactly 1 (the max is >= kappa).
    np.testing.assert_allclose(curves[:, -1], 1.0)
    # Brute force for one N on prompt 1 (budget 25: N past it keeps the whole pool).
    values = batch.values[batch.prompt == 1]
    n = 7
    expect = acceptance_rate(values[:, :n].max(axis=1), benchmark(pools[1], 0.99)).mean()
    assert curves[1, n - 1] == pytest.approx(expect)
    assert curves[1, 30] == curves[1, 24]


def test_empirical_fair_cap_solves_its_equation() -> None:
    rng = np.random.default_rng(3)
    u = np.concatenate([rng.random(50), np.ones(5), np.full(10, 0.2)])
    for cost in (1e-4, 1e-3, 0.01, 0.1, 0.6):
        tau = empirical_fair_cap(u, cost)
        assert np.mean(np.maximum(u - tau, 0.0)) == pytest.approx(cost, rel=1e-9, abs=1e-12)


def test_oracle_beats_every_fixed_n_on_exponential_rewards() -> None:
    # Exponential rewards (the paper's worked family) at scales where sampling pays: Weitzman's
    # rule on the known (empirical) distribution earns more than every fixed N, on the same
    # orderings. (When even one sample costs more than its expected utility both degenerate
    # to N = 1, so those costs are not informative.)
    rng = np.random.default_rng(4)
    pools = [rng.exponential(scale, size=400) for scale in (0.5, 1.0, 2.0)]
    batch = PromptBatch.build(pools, range(3), permutations=300, seed=5, alpha=0.99)
    curves = fixed_acceptance_curves(batch)  # (prompts, N)
    n_grid = np.arange(1, batch.horizon + 1)
    for cost in (0.01, 0.005, 0.002, 0.001):
        oracle = oracle_outcome(batch, cost)
        profit = batch.per_prompt(batch.acceptance(oracle) - cost * oracle.n).mean(axis=1)
        best_fixed = (curves - cost * n_grid).max(axis=1)
        assert (profit > best_fixed + 0.02).all(), (cost, profit, best_fixed)


def test_matched_fixed_n_interpolates() -> None:
    curve = np.array([0.5, 0.7, 0.8, 0.8, 0.9])
    assert matched_fixed_n(curve, 0.4) == (1.0, False)
    assert matched_fixed_n(curve, 0.6) == (pytest.approx(1.5), False)
    assert matched_fixed_n(curve, 0.8) == (3.0, False)  # first N reaching it
    assert matched_fixed_n(curve, 0.85) == (pytest.approx(4.5), False)
    assert matched_fixed_n(curve, 0.95) == (5.0, True)


def test_parallel_workers_give_the_same_summaries_as_one_process() -> None:
    from stoppers.replay.engine import ReplayConfig, run_replay
    from stoppers.replay.loaders import pool_from_matrix

    rng = np.random.default_rng(8)
    matrix = rng.gumbel(size=(5, 40))
    matrix[1, :7] = np.nan  # a ragged prompt
    pool = pool_from_matrix(matrix)
    config = ReplayConfig(profit_costs=(0.01,), targets=(0.8,), permutations=6, seed=2)
    ticks: list[int] = []
    one = run_replay(pool, config, jobs=1, chunk_prompts=2, progress=ticks.append)
    two = run_replay(pool, config, jobs=2, chunk_prompts=2)
    assert sum(ticks) == 5
    for name in ("fixed_acceptance", "policy_samples", "oracle_samples", "target_acceptance"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name))
    assert one.budget.tolist() == [40, 33, 40, 40, 40]
