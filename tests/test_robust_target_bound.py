"""target_bound: the save no target rule can beat when each prompt's distribution is known."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from stoppers.replay.baselines import fixed_acceptance_curves
from stoppers.replay.deployment import deployment_batch
from stoppers.robust.target_bound import (
    lower_hull_at,
    prompt_bound,
    target_bound,
    threshold_frontier,
)
from stoppers.robust.target_report import main


def _pool(prompts=4, samples=300, seed=0):
    rng = np.random.default_rng(seed)
    loc = rng.normal(0, 2, (prompts, 1))
    scale = np.exp(rng.normal(0, 0.4, (prompts, 1)))
    return loc + scale * rng.standard_normal((prompts, samples))


def _streams(rewards, orderings=40):
    batch = deployment_batch(rewards, orderings=orderings, seed=0)
    running = np.maximum.accumulate(batch.stream_acceptance, axis=1)
    running = running.reshape(batch.prompts, batch.permutations, -1)
    return running, fixed_acceptance_curves(batch)


def test_hull_equals_the_best_mixture_of_two_points():
    rng = np.random.default_rng(3)
    a = np.sort(rng.random(25))
    n = np.cumsum(rng.random(25) * 5) + 1  # increasing, not convex
    for t in np.linspace(a[0], a[-1], 17):
        brute = min(
            n[i] + (n[j] - n[i]) * (t - a[i]) / (a[j] - a[i]) if a[j] > a[i] else n[j]
            for i, j in itertools.product(range(25), repeat=2)
            if a[i] <= t <= a[j]
        )
        assert lower_hull_at(a, n, t) == pytest.approx(brute, rel=1e-12, abs=1e-12)
    assert np.isnan(lower_hull_at(a, n, a[-1] + 0.01))


def test_frontier_ends_are_best_of_floor_and_never_stopping():
    running, curves = _streams(_pool(prompts=1))
    acceptance, samples = threshold_frontier(running[0], 8)
    # lowest threshold: stop at the floor (Best-of-8); above every value: run to the budget
    assert samples.min() == 8 and acceptance.min() == pytest.approx(curves[0, 7])
    assert samples[-1] == running.shape[2] and acceptance[-1] == pytest.approx(curves[0, -1])


def test_below_the_floor_the_bound_is_best_of_floor_and_saves_nothing():
    running, curves = _streams(_pool(prompts=1))
    b = prompt_bound(running[0], curves[0], 0.01, 8)
    assert b.acceptance == pytest.approx(curves[0, 7]) and b.samples == 8
    assert b.save == pytest.approx(0.0, abs=1e-9)


def test_no_adaptive_rule_on_the_same_streams_beats_the_bound():
    """A rule that is not a fixed threshold (best vs the running mean + k sd) delivers some
    acceptance at some mean samples; the bound at that acceptance needs no more samples."""
    rewards = _pool(prompts=5)
    batch = deployment_batch(rewards, orderings=40, seed=0)
    running, curves = _streams(rewards)
    x = batch.values.reshape(batch.prompts, batch.permutations, -1)
    n = np.arange(1, x.shape[2] + 1)
    mean = np.cumsum(x, axis=2) / n
    sd = np.sqrt(np.maximum(np.cumsum(x * x, axis=2) / n - mean**2, 0.0))
    best = np.maximum.accumulate(x, axis=2)
    for k in (1.0, 1.5, 2.0):
        hit = (best >= mean + k * sd) & (n >= 8)
        hit[..., -1] = True
        stop = hit.argmax(axis=2)
        for i in range(batch.prompts):
            achieved = float(np.take_along_axis(running[i], stop[i][:, None], 1).mean())
            used = float(stop[i].mean() + 1)
            bound = prompt_bound(running[i], curves[i], achieved, 8)
            assert bound.samples <= used + 1e-9
            assert bound.save >= (bound.matched_fixed_n - used) / bound.matched_fixed_n - 1e-9


def test_bound_saves_on_normal_rewards_and_grows_with_the_target():
    bounds = target_bound(_pool(prompts=3, samples=400), (0.7, 0.9), min_samples=1, orderings=60)
    for t in (0.7, 0.9):
        assert all(b.acceptance == pytest.approx(t) for b in bounds[t])
        assert all(0.0 < b.save < 1.0 and b.samples < b.matched_fixed_n for b in bounds[t])
    assert np.median([b.samples for b in bounds[0.9]]) > np.median([b.samples for b in bounds[0.7]])


def test_cli_prints_one_row_per_pool_and_floor(tmp_path, capsys):
    path = tmp_path / "normal.npz"
    np.savez(path, rewards=_pool(prompts=3, samples=120))
    assert main(["bound", str(path), "--orderings", "8", "--min-samples", "1,8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| pool | min samples | bound: save at 0.7 / 0.8 / 0.9 / 0.95")
    assert [line.split(" | ")[:2] for line in out[2:]] == [["| normal", "1"], ["| normal", "8"]]
