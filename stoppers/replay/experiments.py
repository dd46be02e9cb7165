"""The paper's three experiments (Section 5, Appendix E) from per-prompt replay summaries.

1. Profit (Experiment 1): per prompt, profit = mean acceptance - c * mean samples. The best fixed
   N is chosen in hindsight for the whole prompt set (the N maximising the mean profit over the
   prompts, the "generator-dependent best non-adaptive" strategy); the profit performance ratio
   is adaptive profit / that Best-of-N's profit, per prompt. Prompts where the Best-of-N profit
   is <= 0 have no meaningful ratio and are left out of the ratio statistics (counted). We also
   report the ratio against the best N chosen per prompt (the authors' replay does this), and
   Weitzman's oracle on the prompt's empirical distribution with the gap to it.
2. Win rate (Experiment 2): per prompt, Best-of-N with N = ceil(mean adaptive samples) on the
   same orderings; win 1, tie 1/2, loss 0 (computed in the engine).
3. Savings (Experiment 3): per prompt and target, achieved acceptance a and mean samples n of
   the target-acceptance policy; N* is where the prompt's fixed-N mean-acceptance curve reaches
   a (linear interpolation between integers; 1 if even N = 1 reaches it; the largest N, flagged
   as censored, if no N does); save ratio (N* - n) / N*.

Every figure is summarised across prompts by its median (as in the paper) with the mean and the
10th/90th percentiles alongside.
"""

from __future__ import annotations

import numpy as np

from stoppers.replay.engine import PromptSummaries

__all__ = [
    "distribution",
    "matched_fixed_n",
    "profit_rows",
    "prompt_saves",
    "savings_rows",
    "winrate_rows",
]


def distribution(values: np.ndarray) -> dict[str, float | int | None]:
    """Median, mean, 10th/90th percentiles over prompts (NaN entries ignored and counted)."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"median": None, "mean": None, "p10": None, "p90": None, "prompts": 0}
    p10, med, p90 = np.percentile(x, [10, 50, 90])
    return {
        "median": float(med),
        "mean": float(x.mean()),
        "p10": float(p10),
        "p90": float(p90),
        "prompts": int(x.size),
    }


def _median(values: np.ndarray) -> float | None:
    return distribution(values)["median"]


def profit_rows(s: PromptSummaries, costs: tuple[float, ...]) -> list[dict]:
    rows = []
    n_grid = np.arange(1, s.horizon + 1)
    for cost in costs:
        k = s.costs.index(cost)
        adaptive = s.policy_acceptance[k] - cost * s.policy_samples[k]
        # Best-of-N past a prompt's budget draws (and pays for) only the budget.
        drawn = np.minimum(n_grid[None, :], s.budget[:, None])
        fixed = s.fixed_acceptance - cost * drawn  # (prompts, N)
        best_n = int(np.argmax(fixed.mean(axis=0))) + 1
        best_fixed = fixed[:, best_n - 1]
        per_prompt_best = fixed.max(axis=1)
        oracle = s.oracle_acceptance[k] - cost * s.oracle_samples[k]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(best_fixed > 0, adaptive / best_fixed, np.nan)
            ratio_pp = np.where(per_prompt_best > 0, adaptive / per_prompt_best, np.nan)
        stats = {
            "adaptive_profit": distribution(adaptive),
            "best_fixed_profit": distribution(best_fixed),
            "ratio": distribution(ratio),
            "ratio_vs_per_prompt_best_n": distribution(ratio_pp),
            "mean_samples": distribution(s.policy_samples[k]),
            "acceptance": distribution(s.policy_acceptance[k]),
            "oracle_profit": distribution(oracle),
            "gap_to_oracle": distribution(oracle - adaptive),
            "oracle_samples": distribution(s.oracle_samples[k]),
        }
        rows.append(
            {
                "cost": cost,
                "adaptive_profit": stats["adaptive_profit"]["median"],
                "best_fixed_profit": stats["best_fixed_profit"]["median"],
                "best_fixed_n": best_n,
                "ratio": stats["ratio"]["median"],
                "mean_samples": stats["mean_samples"]["median"],
                "oracle_profit": stats["oracle_profit"]["median"],
                "gap_to_oracle": stats["gap_to_oracle"]["median"],
                "mean_adaptive_profit": float(np.mean(adaptive)),
                "mean_best_fixed_profit": float(np.mean(best_fixed)),
                "mean_oracle_profit": _nanmean(oracle),
                "ratio_undefined_prompts": int(np.sum(~(best_fixed > 0))),
                "fixed_profit_curve": [float(v) for v in fixed.mean(axis=0)],
                "stats": stats,
            }
        )
    return rows


def winrate_rows(s: PromptSummaries, costs: tuple[float, ...]) -> list[dict]:
    rows = []
    for cost in costs:
        k = s.costs.index(cost)
        stats = {
            "win_rate": distribution(s.win_rate[k]),
            "mean_samples": distribution(s.policy_samples[k]),
            "matched_fixed_n": distribution(s.matched_budget[k]),
        }
        rows.append(
            {
                "cost": cost,
                "win_rate": stats["win_rate"]["median"],
                "mean_samples": stats["mean_samples"]["median"],
                "mean_win_rate": float(np.mean(s.win_rate[k])),
                "stats": stats,
            }
        )
    return rows


def matched_fixed_n(curve: np.ndarray, achieved: float) -> tuple[float, bool]:
    """N* where a non-decreasing fixed-N acceptance ``curve`` (N = 1..) reaches ``achieved``.

    Returns (N*, censored): censored when no N on the curve reaches it (N* = len(curve)).
    """
    curve = np.asarray(curve, dtype=np.float64)
    if achieved <= curve[0]:
        return 1.0, False
    reach = np.flatnonzero(curve >= achieved)
    if reach.size == 0:
        return float(curve.size), True
    n = int(reach[0]) + 1  # first N (1-based) whose acceptance reaches the target
    lo, hi = curve[n - 2], curve[n - 1]
    frac = (achieved - lo) / (hi - lo) if hi > lo else 1.0
    return float(n - 1 + frac), False


def prompt_saves(s: PromptSummaries, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per prompt at the k-th target: (save ratio (N* - n) / N*, N*, censored), N* the fixed N
    whose acceptance reaches what the policy delivered on that prompt."""
    achieved = s.target_acceptance[k]
    matched = np.empty(s.prompts)
    censored = np.zeros(s.prompts, dtype=bool)
    for i in range(s.prompts):
        curve = s.fixed_acceptance[i, : s.budget[i]]
        matched[i], censored[i] = matched_fixed_n(curve, achieved[i])
    return (matched - s.target_samples[k]) / matched, matched, censored


def savings_rows(s: PromptSummaries) -> list[dict]:
    rows = []
    for k, target in enumerate(s.targets):
        achieved = s.target_acceptance[k]
        samples = s.target_samples[k]
        save, matched, censored = prompt_saves(s, k)
        stats = {
            "achieved_acceptance": distribution(achieved),
            "mean_samples": distribution(samples),
            "matched_fixed_n": distribution(matched),
            "save_ratio": distribution(save),
        }
        rows.append(
            {
                "target": target,
                "achieved_acceptance": stats["achieved_acceptance"]["median"],
                "mean_samples": stats["mean_samples"]["median"],
                "matched_fixed_n": stats["matched_fixed_n"]["median"],
                "save_ratio": stats["save_ratio"]["median"],
                "mean_save_ratio": float(np.mean(save)),
                "censored_prompts": int(censored.sum()),
                "stats": stats,
            }
        )
    return rows


def _nanmean(x: np.ndarray) -> float | None:
    x = np.asarray(x, dtype=np.float64)
    return float(np.nanmean(x)) if np.isfinite(x).any() else None
