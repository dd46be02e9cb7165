"""Many Fenwick (binary indexed) trees advanced in lock-step, one per replayed ordering.

The replay needs, after every sample of every ordering, order statistics of the prefix (the
median of Algorithm 1, line 7) and sums over the values above it. Keeping one Fenwick tree of
counts and one of weights per ordering over the *ranks* of the prompt's pool turns each step
into ``O(log m)`` whole-array numpy operations shared by all orderings: an insertion, a k-th
smallest lookup by binary descent, and prefix sums. Rows are independent; a row's tree lives
at ``row * stride`` in one flat array so that fancy indexing touches each row once per level
(no duplicate indices, so plain ``+=`` is exact).
"""

from __future__ import annotations

import numpy as np

__all__ = ["BatchFenwick"]


class BatchFenwick:
    """``rows`` Fenwick trees over positions ``0..size-1``: counts (int) and weights (float)."""

    def __init__(self, rows: int, size: int) -> None:
        if rows < 0 or size < 1:
            raise ValueError("need rows >= 0 and size >= 1")
        self.rows = rows
        self.size = size
        # 1-based trees; column 0 is the zero sentinel of prefix queries, column size+1 the
        # dump slot for update paths that ran past the end.
        self.stride = size + 2
        self.levels = int(size).bit_length()
        self._base = np.arange(rows, dtype=np.int64) * self.stride
        self.counts = np.zeros(rows * self.stride, dtype=np.int64)
        self.weights = np.zeros(rows * self.stride, dtype=np.float64)
        self._top = 1 << (self.levels - 1)

    def add(self, position: np.ndarray, weight: np.ndarray) -> None:
        """Insert one item per row at ``position`` (0-based) carrying ``weight``."""
        i = np.asarray(position, dtype=np.int64) + 1
        w = np.asarray(weight, dtype=np.float64)
        dump = self.size + 1
        for _ in range(self.levels):
            flat = self._base + i
            self.counts[flat] += 1
            self.weights[flat] += w
            i = i + (i & -i)
            np.minimum(i, dump, out=i)
        # Anything that reached the dump slot is garbage; keep it from growing without bound.
        self.counts[self._base + dump] = 0
        self.weights[self._base + dump] = 0.0

    def prefix(self, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Count and weight of the items at positions ``< position`` (0..size), per row."""
        i = np.asarray(position, dtype=np.int64).copy()
        count = np.zeros(self.rows, dtype=np.int64)
        weight = np.zeros(self.rows, dtype=np.float64)
        for _ in range(self.levels):
            flat = self._base + i
            count += self.counts[flat]
            weight += self.weights[flat]
            i = i & (i - 1)
        return count, weight

    def kth(self, k: np.ndarray) -> np.ndarray:
        """0-based position of the k-th smallest item (k is 1-based, 1 <= k <= items) per row."""
        remaining = np.asarray(k, dtype=np.int64).copy()
        pos = np.zeros(self.rows, dtype=np.int64)
        step = self._top
        while step:
            nxt = pos + step
            inside = nxt <= self.size
            flat = self._base + np.where(inside, nxt, 0)
            here = self.counts[flat]
            take = inside & (here < remaining)
            pos = np.where(take, nxt, pos)
            remaining = remaining - np.where(take, here, 0)
            step >>= 1
        return pos

    def keep(self, rows: np.ndarray) -> None:
        """Drop every row not in ``rows`` (a boolean mask or index array), keeping order."""
        idx = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows)
        counts = self.counts.reshape(self.rows, self.stride)[idx]
        weights = self.weights.reshape(self.rows, self.stride)[idx]
        self.rows = len(idx)
        self._base = np.arange(self.rows, dtype=np.int64) * self.stride
        self.counts = counts.reshape(-1)
        self.weights = weights.reshape(-1)
