"""Streaming statistics of every ordering's prefix, advanced for all orderings at once.

Algorithm 1 (line 7) needs, after each sample, the median of the rewards seen so far and the
sum of the exponentiated rewards strictly above it (for the mean excess), plus the running max
(line 4). This module produces exactly those, for every row (prompt x ordering) and every step,
in blocks of ``block`` steps so that each numpy call covers all rows and a whole block:

* Rewards are replaced by their *rank* in the prompt's sorted pool (distinct integers, ties
  broken by position), so order statistics are unambiguous; tied values are handled when mapping
  back (``first_greater``: the first rank whose value is strictly larger).
* Each row keeps its prefix as a sorted array of ranks (all rows in one flat array, row r's
  ranks offset by ``r * width`` so one ``searchsorted`` serves every row). Within a block, the
  union rank of each new element is its count of smaller prefix elements (``searchsorted``)
  plus its count of smaller block elements so far (a small ``block x block`` comparison); the
  k-th smallest of prefix + block is then either a block element of union rank k-1 or prefix
  element ``k-1-c`` (c = block elements below it). The tail count and the tail sum of
  ``exp(v - reference)`` (reference = the prompt's max, so nothing overflows) come from a
  suffix sum over the sorted prefix plus the block elements above the cut.
* After the block its elements are merged into the sorted prefix at their union ranks (linear).

:func:`run_streaming` drives any number of *deciders* (functions of a :class:`StreamStats`
block returning "stop now" booleans) over the same statistics: several costs or targets cost
one pass, and rows whose every decider has stopped are dropped.

(A first version advanced one Fenwick tree per row one step at a time; the block merge does the
same work with far fewer numpy calls: ~5x faster on 2,500 rows x 960 steps.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from stoppers.replay.batch import Outcome, PromptBatch

__all__ = ["Decider", "StreamStats", "run_streaming"]

BLOCK = 32


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

    def take(self, rows: np.ndarray, cols: slice) -> StreamStats:
        """The entries of the given (local) rows and step columns."""
        return StreamStats(
            **{name: getattr(self, name)[rows, cols] for name in self.__dataclass_fields__}
        )


# A decider maps a StreamStats block to "stop now" booleans of the same shape. It may carry a
# ``min_samples`` attribute: it is then never asked about steps with n < min_samples.
Decider = Callable[[StreamStats], np.ndarray]

SUB_BLOCK = 8  # columns per decider call: rows that stopped are not asked again


class _SortedPrefix:
    """Each active row's prefix as sorted ranks (+ aligned weights), all rows in flat arrays."""

    def __init__(self, rows: int, width: int) -> None:
        self.width = width
        self.length = 0
        self.ranks = np.zeros((rows, 0), dtype=np.int64)
        self.weights = np.zeros((rows, 0), dtype=np.float64)

    @property
    def rows(self) -> int:
        return self.ranks.shape[0]

    def keys(self) -> np.ndarray:
        return (self.ranks + (np.arange(self.rows, dtype=np.int64) * self.width)[:, None]).ravel()

    def count_below(self, keys_flat: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Per row (rows, k): how many prefix ranks are < ``rank`` (rows, k)."""
        offset = np.arange(self.rows, dtype=np.int64)[:, None]
        pos = np.searchsorted(keys_flat, rank + offset * self.width)
        return pos - offset * self.length

    def merge(self, ranks: np.ndarray, weights: np.ndarray, union_rank: np.ndarray) -> None:
        """Insert a block (rows, b) whose final positions in the merged row are ``union_rank``."""
        rows, b = ranks.shape
        total = self.length + b
        slots = (np.arange(rows, dtype=np.int64) * total)[:, None] + union_rank
        is_new = np.zeros(rows * total, dtype=bool)
        is_new[slots.ravel()] = True
        new_ranks = np.empty(rows * total, dtype=np.int64)
        new_weights = np.empty(rows * total, dtype=np.float64)
        new_ranks[slots.ravel()] = ranks.ravel()
        new_weights[slots.ravel()] = weights.ravel()
        old = ~is_new
        new_ranks[old] = self.ranks.ravel()
        new_weights[old] = self.weights.ravel()
        self.ranks = new_ranks.reshape(rows, total)
        self.weights = new_weights.reshape(rows, total)
        self.length = total

    def keep(self, mask: np.ndarray) -> None:
        self.ranks = self.ranks[mask]
        self.weights = self.weights[mask]


def run_streaming(
    batch: PromptBatch,
    deciders: Sequence[Decider],
    *,
    median: str = "mean",
    block: int = BLOCK,
    prefix_max: np.ndarray | None = None,
) -> list[Outcome]:
    """Run every decider on every row until it says stop or the row's budget is used up.

    ``median`` picks the convention for even n: ``"lower"`` (the n/2-th smallest),
    ``"upper"`` (the n/2+1-th) or ``"mean"`` (their average, numpy's median).
    """
    if median not in {"lower", "upper", "mean"}:
        raise ValueError(f"unknown median convention {median!r}")
    k_count = len(deciders)
    stop_n = np.zeros((k_count, batch.rows), dtype=np.int64)
    if prefix_max is None:
        prefix_max = np.maximum.accumulate(batch.values, axis=1)
    if batch.rows == 0 or k_count == 0:
        return [Outcome(n=s, best=np.zeros(0)) for s in stop_n]
    # Key stride: pool ranks, plus the distinct padding ranks past a row's budget.
    prefix = _SortedPrefix(batch.rows, batch.sorted_pool.shape[1] + batch.horizon)
    active = np.arange(batch.rows)
    t0 = 0
    while t0 < batch.horizon and active.size:
        steps = min(block, batch.horizon - t0)
        stats = _block_stats(batch, prefix, active, t0, steps, median, prefix_max)
        budget_col = batch.budget[active] - 1 - t0  # block column of the last allowed step
        still = np.zeros(active.size, dtype=bool)
        for k, decide in enumerate(deciders):
            open_rows = stop_n[k, active] == 0
            if not open_rows.any():
                continue
            first = _first_stop(decide, stats, open_rows, budget_col, t0, steps)
            hit = first >= 0
            stop_n[k, active[hit]] = t0 + first[hit] + 1
            still |= open_rows & ~hit
        t0 += steps
        if not still.all():
            prefix.keep(still)
            active = active[still]
    rows = np.arange(batch.rows)
    return [Outcome(n=s, best=prefix_max[rows, s - 1]) for s in stop_n]


def _first_stop(
    decide: Decider,
    stats: StreamStats,
    open_rows: np.ndarray,
    budget_col: np.ndarray,
    t0: int,
    steps: int,
) -> np.ndarray:
    """Per row, the first block column where ``decide`` (or the budget) stops it; -1 if none.

    The decider only sees open rows, steps at or past its ``min_samples``, and columns up to
    the row's first stop (sub-blocks of SUB_BLOCK columns): kernels are the costly part.
    """
    first = np.full(open_rows.size, -1, dtype=np.int64)
    # The budget stops a row at budget_col whatever the decider says.
    at_budget = open_rows & (budget_col < steps)
    first[at_budget] = budget_col[at_budget]
    start = max(0, int(getattr(decide, "min_samples", 1)) - 1 - t0)
    col = start
    while col < steps:
        end = min(col + SUB_BLOCK, steps)
        ask = np.flatnonzero(open_rows & ((first < 0) | (first >= col)))
        if ask.size == 0:
            break
        said = np.asarray(decide(stats.take(ask[:, None], slice(col, end))), dtype=bool)
        said = said.reshape(ask.size, end - col)
        found = said.any(axis=1)
        at = col + np.argmax(said, axis=1)
        rows = ask[found]
        current = first[rows]
        first[rows] = np.where((current < 0) | (at[found] < current), at[found], current)
        col = end
    return first


def _block_stats(
    batch: PromptBatch,
    prefix: _SortedPrefix,
    active: np.ndarray,
    t0: int,
    steps: int,
    median: str,
    prefix_max: np.ndarray,
) -> StreamStats:
    """Statistics after samples t0+1 .. t0+steps of every active row; merges the block."""
    rows = active.size
    prompt = batch.prompt[active]
    ref = batch.reference[active]
    new_rank = batch.ranks[active, t0 : t0 + steps]  # (rows, b)
    new_value = batch.values[active, t0 : t0 + steps]
    with np.errstate(under="ignore"):
        new_weight = np.exp(new_value - ref[:, None])
    keys = prefix.keys()
    below_prefix = prefix.count_below(keys, new_rank)  # (rows, b)
    # less[r, i, l]: block element l is smaller than block element i.
    less = new_rank[:, None, :] < new_rank[:, :, None]
    # seen[i, j]: element i is in the prefix after block step j (i <= j).
    seen = np.tri(steps, dtype=bool).T  # seen[i, j] = i <= j
    # union_rank[r, i, j]: 0-based rank of element i among prefix + block[: j + 1].
    # int32: these (rows, b, b) arrays are the bulk of a block's memory traffic (~8% faster).
    union_rank = below_prefix.astype(np.int32)[:, :, None] + np.cumsum(less, axis=2, dtype=np.int32)
    n = t0 + 1 + np.arange(steps)  # (b,)

    def kth(k: np.ndarray) -> np.ndarray:
        """Pool rank of the k-th smallest (1-based k per step) after each step, (rows, b)."""
        q = (k - 1).astype(np.int32)[None, None, :]
        is_answer = seen & (union_rank == q)
        from_block = is_answer.any(axis=1)
        block_rank = new_rank[np.arange(rows)[:, None], np.argmax(is_answer, axis=1)]
        below = (seen & (union_rank < q)).sum(axis=1)  # block elements below the answer
        index = np.clip(k[None, :] - 1 - below, 0, max(prefix.length - 1, 0))
        if prefix.length:
            prefix_rank = prefix.ranks[np.arange(rows)[:, None], index]
        else:
            prefix_rank = np.zeros_like(block_rank)
        return np.where(from_block, block_rank, prefix_rank)

    if median == "upper":
        k_low = k_high = n // 2 + 1
    else:
        k_low, k_high = (n + 1) // 2, n // 2 + 1
    p2 = prompt[:, None]
    last = batch.sorted_pool.shape[1] - 1  # padding ranks (steps past the budget) clip here
    r_low = np.minimum(kth(k_low), last)
    v_low = batch.sorted_pool[p2, r_low]
    cut = batch.first_greater[p2, r_low]
    med = v_low
    if median == "mean":
        r_high = np.where(k_high != k_low, np.minimum(kth(k_high), last), r_low)
        v_high = batch.sorted_pool[p2, r_high]
        med = np.where(k_high != k_low, 0.5 * (v_low + v_high), v_low)
        # Strictly above an averaged median: everything from the upper middle value up,
        # unless rounding put the average on it (then strictly above it).
        split = v_high > v_low
        cut = np.where(split, batch.first_not_less[p2, r_high], cut)
        cut = np.where(split & (med >= v_high), batch.first_greater[p2, r_high], cut)
    # Tail: prefix elements with rank >= cut (suffix sums) plus block elements seen so far.
    pos = prefix.count_below(keys, cut)  # (rows, b)
    count = prefix.length - pos
    if prefix.length:
        suffix = np.zeros((rows, prefix.length + 1))
        suffix[:, :-1] = np.cumsum(prefix.weights[:, ::-1], axis=1)[:, ::-1]
        total = suffix[np.arange(rows)[:, None], pos]
    else:
        total = np.zeros((rows, steps))
    above = seen[None, :, :] & (new_rank[:, :, None] >= cut[:, None, :])  # (rows, i, j)
    count = count + above.sum(axis=1)
    total = total + np.einsum("ri,rij->rj", new_weight, above)
    stats = StreamStats(
        n=np.broadcast_to(n, (rows, steps)),
        median=med,
        tail_count=count,
        tail_sum=total,
        reference=np.broadcast_to(ref[:, None], (rows, steps)),
        best=prefix_max[active, t0 : t0 + steps],
        row=np.broadcast_to(active[:, None], (rows, steps)),
    )
    prefix.merge(new_rank, new_weight, union_rank[:, :, -1])
    return stats
