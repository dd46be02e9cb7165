"""Streaming statistics of every ordering's prefix, advanced for all orderings at once.

Algorithm 1 (line 7) needs, after each sample, the median of the rewards seen so far and the
mean excess of the exponentiated rewards above it, plus the running max (line 4). For a batch
of rows this module maintains exactly those quantities with one :class:`BatchFenwick` over the
ranks of each prompt's pool: counts give the k-th order statistic (the median) and the number
of rewards above it; weights ``exp(v - reference)`` (reference = the prompt's max, so nothing
overflows) give the sum of the exponentiated tail. Decisions are evaluated in blocks of steps so
that the decision kernel runs on whole ``(rows, block)`` arrays, and rows whose every decision
is made are dropped from the trees.

:func:`run_streaming` drives any number of *deciders* (functions of a :class:`StreamStats`
block returning "stop now" booleans) over the same statistics: several costs or targets cost
one pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from stoppers.replay.batch import Outcome, PromptBatch
from stoppers.replay.fenwick import BatchFenwick

__all__ = ["Decider", "StreamStats", "run_streaming"]

BLOCK = 16


@dataclass(frozen=True)
class StreamStats:
    """Statistics after the n-th sample, for ``rows`` x ``steps`` (all arrays that shape)."""

    n: np.ndarray  # samples seen (int)
    median: np.ndarray  # median of the n rewards (convention: see ``median``)
    tail_count: np.ndarray  # rewards strictly above the median
    tail_sum: np.ndarray  # sum of exp(v - reference) over those rewards
    reference: np.ndarray  # the exponent reference of tail_sum (per row)
    best: np.ndarray  # running max
    row: np.ndarray  # batch row of each entry (int)


Decider = Callable[[StreamStats], np.ndarray]


def run_streaming(
    batch: PromptBatch,
    deciders: Sequence[Decider],
    *,
    median: str = "lower",
    block: int = BLOCK,
    prefix_max: np.ndarray | None = None,
    on_step: Callable[[int], None] | None = None,
) -> list[Outcome]:
    """Run every decider on every row until it says stop or the row's budget is used up.

    ``median`` picks the convention for even n: ``"lower"`` (the (n+1)//2-th smallest),
    ``"upper"`` (the n//2+1-th) or ``"mean"`` (their average, numpy's median).
    """
    if median not in {"lower", "upper", "mean"}:
        raise ValueError(f"unknown median convention {median!r}")
    k_count = len(deciders)
    stop_n = np.zeros((k_count, batch.rows), dtype=np.int64)
    if batch.rows == 0 or k_count == 0:
        return [Outcome(n=s, best=np.zeros(0)) for s in stop_n]
    width = batch.sorted_pool.shape[1]
    tree = BatchFenwick(batch.rows, width)
    active = np.arange(batch.rows)
    best = np.full(batch.rows, -np.inf)
    horizon = batch.horizon
    t0 = 0
    while t0 < horizon and active.size:
        steps = min(block, horizon - t0)
        shape = (active.size, steps)
        stats = {name: np.empty(shape) for name in ("median", "tail_sum", "best")}
        tail_count = np.empty(shape, dtype=np.int64)
        prompt = batch.prompt[active]
        ref = batch.reference[active]
        for j in range(steps):
            t = t0 + j
            n = t + 1
            value = batch.values[active, t]
            tree.add(batch.ranks[active, t], np.exp(value - ref))
            np.maximum(best, value, out=best)
            stats["best"][:, j] = best
            med, cut = _median_and_cut(batch, tree, prompt, n, median)
            below_count, below_sum = tree.prefix(cut)
            total_count, total_sum = tree.prefix(np.full(active.size, width))
            stats["median"][:, j] = med
            tail_count[:, j] = total_count - below_count
            stats["tail_sum"][:, j] = total_sum - below_sum
        n_grid = np.broadcast_to(np.arange(t0 + 1, t0 + steps + 1), shape)
        view = StreamStats(
            n=n_grid,
            median=stats["median"],
            tail_count=tail_count,
            tail_sum=stats["tail_sum"],
            reference=np.broadcast_to(ref[:, None], shape),
            best=stats["best"],
            row=np.broadcast_to(active[:, None], shape),
        )
        at_budget = n_grid >= batch.budget[active][:, None]
        still = np.zeros(active.size, dtype=bool)
        for k, decide in enumerate(deciders):
            open_rows = stop_n[k, active] == 0
            if not open_rows.any():
                continue
            stop = np.asarray(decide(view), dtype=bool) | at_budget
            hit = stop.any(axis=1) & open_rows
            first = np.argmax(stop, axis=1)
            stop_n[k, active[hit]] = t0 + first[hit] + 1
            still |= open_rows & ~hit
        t0 += steps
        if on_step is not None:
            on_step(steps)
        if not still.all():
            tree.keep(still)
            active = active[still]
            best = best[still]
    if prefix_max is None:
        prefix_max = np.maximum.accumulate(batch.values, axis=1)
    rows = np.arange(batch.rows)
    return [Outcome(n=s, best=prefix_max[rows, s - 1]) for s in stop_n]


def _median_and_cut(
    batch: PromptBatch, tree: BatchFenwick, prompt: np.ndarray, n: int, median: str
) -> tuple[np.ndarray, np.ndarray]:
    """The median value and the first pool rank strictly above it, per active row."""
    rows = tree.rows
    if median == "upper":
        k_low = k_high = n // 2 + 1
    else:
        k_low, k_high = (n + 1) // 2, n // 2 + 1
    r_low = tree.kth(np.full(rows, k_low))
    v_low = batch.sorted_pool[prompt, r_low]
    if median == "mean" and k_high != k_low:
        r_high = tree.kth(np.full(rows, k_high))
        v_high = batch.sorted_pool[prompt, r_high]
        med = 0.5 * (v_low + v_high)
        # Above an averaged median: everything from the upper middle value up, unless the two
        # middle values are equal (then only values strictly above them).
        cut = np.where(
            v_high > v_low,
            batch.first_not_less[prompt, r_high],
            batch.first_greater[prompt, r_low],
        )
        # Guard against rounding pushing the average onto v_high.
        cut = np.where((v_high > v_low) & (med >= v_high), batch.first_greater[prompt, r_high], cut)
        return med, cut
    return v_low, batch.first_greater[prompt, r_low]
