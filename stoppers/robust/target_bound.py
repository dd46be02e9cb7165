"""What target mode could save if each prompt's reward distribution were known: a bound.

Why: the issue asks for a median save of 30% at target 0.9 against the fixed N that reaches the same
acceptance. Whether any rule can do that depends on the prompt's distribution, so before asking a
learning rule for it, this module measures what the *best* rule saves when it knows the
distribution. Told the distribution, minimising the mean samples subject to a mean acceptance ``t``
is a Lagrangian problem whose solution is Weitzman's rule on the AR scale (docs/robust-stopping.md,
"Target mode on a deployment"): after the ``min_samples`` floor, stop at the first n whose best
reward reaches a fixed threshold. The thresholds trace a frontier of (mean acceptance, mean
samples); mixing two thresholds at random reaches every point of its lower convex hull, and for
independent draws no rule (fixed threshold or not) can do better than the hull, so its value at
``t`` is the fewest mean samples that deliver ``t``. The replayed streams draw a finite pool
without replacement, which a rule could in principle exploit; on 960-reward pools that is
negligible, on a 49-reward pool replayed whole (AlpacaEval) the bound is approximate.

Measured on exactly the streams :func:`~stoppers.replay.deployment.replay_deployment` serves
(``deployment_batch``), with the save defined as :func:`~stoppers.replay.experiments.savings_rows`
defines it: (N* - n) / N*, N* the fixed N whose Best-of-N acceptance reaches the acceptance
delivered (here ``t`` itself), median over prompts. The thresholds are every distinct value of
the running-max acceptance, so the frontier is exact for these streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoppers.replay.baselines import fixed_acceptance_curves
from stoppers.replay.deployment import deployment_batch
from stoppers.replay.experiments import matched_fixed_n

__all__ = ["PromptBound", "lower_hull_at", "prompt_bound", "render_bound", "target_bound"]


@dataclass(frozen=True)
class PromptBound:
    """One prompt's bound at one target (NaN where the target cannot be delivered: below the
    floor of Best-of-``min_samples`` the bound is the floor itself, reported as such)."""

    target: float
    acceptance: float  # what the bound's rule delivers: the target, or the floor if above it
    samples: float  # the fewest mean samples any rule needs to deliver ``acceptance``
    matched_fixed_n: float  # N* of Best-of-N at ``acceptance``
    save: float  # (N* - samples) / N*


def threshold_frontier(running_best: np.ndarray, min_samples: int) -> tuple[np.ndarray, ...]:
    """(acceptance, samples) of every threshold rule on one prompt's streams.

    ``running_best``: (orderings, T) acceptance of the best reward so far (non-decreasing per
    row). The rule with threshold c stops at max(min_samples, first n with running best >= c),
    or at T; thresholds are the distinct running-best values plus one above them all.
    """
    horizon = running_best.shape[1]
    floor = min(max(int(min_samples), 1), horizon)
    cands = np.append(np.unique(running_best), np.inf)
    # first index reaching c, per row: the row is sorted, so a binary search per threshold
    first = np.stack([np.searchsorted(row, cands, side="left") for row in running_best])
    stop = np.clip(np.maximum(first, floor - 1), 0, horizon - 1)  # (rows, thresholds)
    acceptance = np.take_along_axis(running_best, stop, axis=1).mean(axis=0)
    samples = (stop + 1).mean(axis=0)
    return acceptance, samples


def lower_hull_at(acceptance: np.ndarray, samples: np.ndarray, target: float) -> float:
    """The lower convex hull of the points (acceptance, samples), evaluated at ``target``
    (NaN above the highest acceptance; the fewest samples among points at or above it when the
    target is below every point)."""
    order = np.lexsort((samples, acceptance))
    a, n = acceptance[order], samples[order]
    first = np.append(True, a[1:] > a[:-1])  # per distinct acceptance, its fewest samples
    a, n = a[first], n[first]
    if target > a[-1]:
        return float("nan")
    if target <= a[0]:
        return float(n[a >= target].min())
    hull: list[int] = []  # Andrew's monotone chain, lower half
    for k in range(a.size):
        while len(hull) >= 2:
            i, j = hull[-2], hull[-1]
            cross = (a[j] - a[i]) * (n[k] - n[i]) - (n[j] - n[i]) * (a[k] - a[i])
            if cross > 0:
                break
            hull.pop()
        hull.append(k)
    ha, hn = a[hull], n[hull]
    return float(np.interp(target, ha, hn))


def prompt_bound(
    running_best: np.ndarray, fixed_curve: np.ndarray, target: float, min_samples: int
) -> PromptBound:
    """The bound for one prompt at one target (see :class:`PromptBound`)."""
    acceptance, samples = threshold_frontier(running_best, min_samples)
    floor_at = float(acceptance.min())  # every threshold rule reaches at least Best-of-m
    delivered = max(float(target), floor_at)
    if delivered > acceptance.max():
        nan = float("nan")
        return PromptBound(target, nan, nan, nan, nan)
    least = lower_hull_at(acceptance, samples, delivered)
    matched, _ = matched_fixed_n(fixed_curve, delivered)
    return PromptBound(target, delivered, least, matched, (matched - least) / matched)


def target_bound(
    rewards: np.ndarray,
    targets: tuple[float, ...],
    *,
    min_samples: int,
    orderings: int,
    seed: int = 0,
    max_samples: int | None = None,
    alpha: float = 0.99,
) -> dict[float, list[PromptBound]]:
    """Per target, each prompt's :class:`PromptBound` on the replayed streams."""
    batch = deployment_batch(
        rewards, orderings=orderings, seed=seed, alpha=alpha, max_samples=max_samples
    )
    curves = fixed_acceptance_curves(batch)
    running = np.maximum.accumulate(batch.stream_acceptance, axis=1)
    running = running.reshape(batch.prompts, batch.permutations, -1)
    budgets = batch.budget.reshape(batch.prompts, batch.permutations)[:, 0]
    out: dict[float, list[PromptBound]] = {t: [] for t in targets}
    for i in range(batch.prompts):
        horizon = int(budgets[i])
        best, curve = running[i, :, :horizon], curves[i, :horizon]
        for t in targets:
            out[t].append(prompt_bound(best, curve, t, min_samples))
    return out


def _median(values: list[float]) -> float:
    kept = [v for v in values if not np.isnan(v)]
    return float(np.median(kept)) if kept else float("nan")


def render_bound(
    pools: dict[str, np.ndarray],
    targets: tuple[float, ...],
    min_samples: tuple[int, ...],
    *,
    orderings: int,
    seed: int = 0,
    max_samples: int | None = None,
) -> str:
    """Markdown rows: per pool and min samples, the bound's median save and samples."""
    lines = [
        "| pool | min samples | bound: save at "
        + " / ".join(f"{t:g}" for t in targets)
        + " (median) | samples at "
        + " / ".join(f"{t:g}" for t in targets)
        + " (median) | N* at the same |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, rewards in pools.items():
        for m in min_samples:
            bound = target_bound(
                rewards,
                targets,
                min_samples=m,
                orderings=orderings,
                seed=seed,
                max_samples=max_samples,
            )
            cells = [
                " / ".join(
                    f"{_median([getattr(b, key) for b in bound[t]]):{spec}}" for t in targets
                )
                for key, spec in (("save", "+.2f"), ("samples", ".1f"), ("matched_fixed_n", ".1f"))
            ]
            lines.append(f"| {name} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
