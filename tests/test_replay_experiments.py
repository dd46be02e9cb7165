"""The three experiments' reductions on hand-made per-prompt summaries."""

from __future__ import annotations

import numpy as np
import pytest

from stoppers.replay.engine import PromptSummaries
from stoppers.replay.experiments import distribution, profit_rows, savings_rows, winrate_rows


def _summaries() -> PromptSummaries:
    s = PromptSummaries(prompts=3, horizon=4, costs=(0.1,), targets=(0.9,))
    s.budget[:] = [4, 4, 2]
    s.fixed_acceptance[:] = [
        [0.2, 0.5, 0.7, 0.8],
        [0.6, 0.7, 0.75, 0.8],
        [0.1, 0.3, 0.3, 0.3],  # budget 2: flat past it
    ]
    s.policy_samples[0] = [2.0, 1.0, 2.0]
    s.policy_acceptance[0] = [0.6, 0.65, 0.3]
    s.oracle_samples[0] = [2.0, 1.0, 1.0]
    s.oracle_acceptance[0] = [0.7, 0.7, 0.25]
    s.win_rate[0] = [0.5, 0.75, 0.25]
    s.matched_budget[0] = [2, 1, 2]
    s.target_samples[0] = [2.0, 3.0, 1.0]
    s.target_acceptance[0] = [0.6, 0.75, 0.05]
    return s


def test_profit_picks_one_n_for_the_prompt_set_and_reports_ratios() -> None:
    (row,) = profit_rows(_summaries(), (0.1,))
    # Mean profit over prompts by N (prompt 3 pays for at most its 2 samples):
    # N=1: (0.1 + 0.5 + 0.0) / 3; N=2: (0.3 + 0.5 + 0.1) / 3; N=3: (0.4 + 0.45 + 0.1) / 3
    curve = row["fixed_profit_curve"]
    assert curve[:3] == pytest.approx([0.6 / 3, 0.9 / 3, 0.95 / 3])
    assert row["best_fixed_n"] == 3
    assert row["best_fixed_profit"] == pytest.approx(0.4)  # median of 0.4, 0.45, 0.1
    adaptive = np.array([0.4, 0.55, 0.1])
    assert row["adaptive_profit"] == pytest.approx(np.median(adaptive))
    assert row["ratio"] == pytest.approx(np.median(adaptive / [0.4, 0.45, 0.1]))
    assert row["oracle_profit"] == pytest.approx(0.5)  # 0.5, 0.6, 0.15
    assert row["gap_to_oracle"] == pytest.approx(0.05)
    assert row["mean_samples"] == 2.0
    assert row["ratio_undefined_prompts"] == 0


def test_ratio_leaves_out_prompts_without_positive_fixed_profit() -> None:
    s = _summaries()
    s.fixed_acceptance[2] = [0.0, 0.0, 0.0, 0.0]
    (row,) = profit_rows(s, (0.1,))
    assert row["ratio_undefined_prompts"] == 1
    assert row["stats"]["ratio"]["prompts"] == 2


def test_winrate_and_savings_rows() -> None:
    s = _summaries()
    (win,) = winrate_rows(s, (0.1,))
    assert win["win_rate"] == 0.5 and win["mean_win_rate"] == pytest.approx(0.5)
    (save,) = savings_rows(s)
    # N*: prompt 1 reaches 0.6 between N=2 (0.5) and N=3 (0.7): 2.5; prompt 2 reaches 0.75
    # exactly at N=3; prompt 3's 0.05 is below N=1's 0.1: 1.
    matched = np.array([2.5, 3.0, 1.0])
    samples = np.array([2.0, 3.0, 1.0])
    assert save["matched_fixed_n"] == pytest.approx(np.median(matched))
    assert save["save_ratio"] == pytest.approx(np.median((matched - samples) / matched))
    assert save["mean_save_ratio"] == pytest.approx(0.2 / 3)
    assert save["censored_prompts"] == 0
    s.target_acceptance[0, 0] = 0.95  # above the whole curve: censored at the budget
    (save,) = savings_rows(s)
    assert save["censored_prompts"] == 1


def test_distribution_ignores_nan() -> None:
    d = distribution(np.array([1.0, np.nan, 3.0, 2.0]))
    assert (d["median"], d["mean"], d["prompts"]) == (2.0, 2.0, 3)
    assert distribution(np.array([np.nan]))["median"] is None
