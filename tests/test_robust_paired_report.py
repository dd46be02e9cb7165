"""Two cost rules on the same streams: loss_report's per-request rows, paired_report's
difference and its paired standard error."""

from __future__ import annotations

import numpy as np
import pytest

from stoppers.replay.synth import SynthSpec, generate
from stoppers.robust import loss_report, paired_report
from stoppers.robust.loss_report import loss_breakdown, save_rows
from stoppers.robust.paired_report import paired_differences

COSTS = (1e-3, 1e-4)
ORDERINGS = 6


@pytest.fixture(scope="module")
def pool() -> np.ndarray:
    return generate(SynthSpec(family="normal", prompts=8, samples=240, seed=5))["rewards"]


_RUNS: dict[tuple[str, int], list] = {}  # (policy, seed): breakdowns, replayed once per module


def _rows(tmp_path, pool, policy: str, *, seed: int = 0):
    key = (policy, seed)
    if key not in _RUNS:
        _RUNS[key] = [
            loss_breakdown(pool, c, policy=policy, orderings=ORDERINGS, seed=seed) for c in COSTS
        ]
    path = tmp_path / f"{policy}-{seed}.npz"
    replay = {"pool": "p.npz", "prompts": 8, "orderings": ORDERINGS, "seed": seed}
    save_rows(str(path), _RUNS[key], max_samples=None, **replay)
    return str(path), _RUNS[key]


def test_the_rows_hold_what_the_breakdown_averaged(tmp_path, pool):
    _, breakdowns = _rows(tmp_path, pool, "default")
    for b in breakdowns:
        assert b.request_profit.mean() == pytest.approx(b.profit)
        assert b.request_fixed_profit.mean() == pytest.approx(b.fixed_profit)
        # every deployment serves each position once
        assert np.array_equal(np.bincount(b.request_position), np.full(8, ORDERINGS))


def test_a_rule_against_itself_differs_by_nothing(tmp_path, pool):
    path, _ = _rows(tmp_path, pool, "default")
    for d in paired_differences(path, path, by_position=True):
        assert d.before == d.after and d.difference == 0.0 and d.standard_error == 0.0


def test_two_rules_differ_by_their_ratios_with_a_tighter_error(tmp_path, pool):
    """The paired difference is the difference of the two ratios, and its standard error is
    smaller than the larger of the rules' own errors over deployments (the shared noise of
    the streams cancels)."""
    before, tails = _rows(tmp_path, pool, "tail")
    after, defaults = _rows(tmp_path, pool, "default")
    whole = [d for d in paired_differences(before, after) if d.group == "all"]
    assert [d.cost for d in whole] == list(COSTS)
    for d, t, f in zip(whole, tails, defaults, strict=True):
        assert d.before == pytest.approx(t.profit / t.fixed_profit)
        assert d.after == pytest.approx(f.profit / f.fixed_profit)
        assert d.difference == pytest.approx(d.after - d.before)
        assert d.standard_error < max(t.se_deployments, f.se_deployments)


def test_position_bins_partition_the_requests(tmp_path, pool):
    before, _ = _rows(tmp_path, pool, "tail")
    after, _ = _rows(tmp_path, pool, "default")
    differences = paired_differences(before, after, by_position=True)
    for cost in COSTS:
        groups = [d for d in differences if d.cost == cost]
        assert groups[0].group == "all" and groups[0].requests == 8 * ORDERINGS
        assert [d.group for d in groups[1:]] == ["#1", "#2-3", "#4-7", "#8"]
        assert sum(d.requests for d in groups[1:]) == groups[0].requests
        for d in groups:  # each bin's paired mean is the difference of its two ratios
            assert d.difference == pytest.approx(d.after - d.before)


def test_different_replays_or_streams_are_refused(tmp_path, pool):
    before, breakdowns = _rows(tmp_path, pool, "default")
    other_seed = str(tmp_path / "seed1.npz")
    save_rows(
        other_seed,
        breakdowns,
        pool="p.npz",
        prompts=8,
        orderings=ORDERINGS,
        seed=1,
        max_samples=None,
    )
    with pytest.raises(ValueError, match="seed differ"):
        paired_differences(before, other_seed)
    with np.load(before) as data:  # same names, other streams: the fixed N earns otherwise
        rows = dict(data)
    rows["0.001/fixed"] = rows["0.001/fixed"] + 0.01
    forged = str(tmp_path / "forged.npz")
    np.savez(forged, **rows)
    with pytest.raises(ValueError, match="not the same streams"):
        paired_differences(before, forged)
    bare = str(tmp_path / "bare.npz")
    np.savez(bare, rewards=pool)
    with pytest.raises(ValueError, match="not a loss_report --rows-out file"):
        paired_differences(bare, before)


def test_the_two_commands_end_to_end(tmp_path, pool, capsys):
    file = tmp_path / "pool.npz"
    np.savez(file, rewards=pool)
    for policy in ("tail", "default"):
        args = [str(file), "--cost", "0.001", "--orderings", "3", "--policy", policy]
        assert loss_report.main([*args, "--rows-out", str(tmp_path / f"{policy}.npz")]) == 0
    capsys.readouterr()
    before, after = str(tmp_path / "tail.npz"), str(tmp_path / "default.npz")
    assert paired_report.main([before, after, "--by", "position"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("c = 0.001: ") and "paired" in out[0]
    assert [line.split(":")[0].strip() for line in out[1:]] == ["#1", "#2-3", "#4-7", "#8"]
