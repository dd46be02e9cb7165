"""Streaming statistics for the adaptive policies: running median and the strict upper tail.

Two heaps (the paper's "priority queue", Section 4.2 "Implementation Efficiency"): ``low`` holds
the smaller ceil(n/2) rewards, ``high`` the larger floor(n/2). Each observation costs O(log n)
heap work and O(1) bookkeeping; nothing re-sorts or re-scans the history (except an exact
re-summation of ``high`` when n reaches a power of two, O(1) amortised, which stops round-off of
the running sum from drifting over long streams).

The quantities are exactly those :mod:`stoppers.adaptive_math` documents: ``median`` (mean of the
two middle values for even n), ``tail_count`` and ``tail_sum`` over the rewards STRICTLY above
the median, with ``ref`` = the running maximum (so every exp term is <= 1).
"""

from __future__ import annotations

import math
from heapq import heappop, heappush

__all__ = ["MedianTailStats"]


class MedianTailStats:
    """Running median, running max, and count/sum of exp(r - max) over rewards > median."""

    __slots__ = ("_high", "_high_counts", "_high_sum", "_low", "n", "ref")

    def __init__(self) -> None:
        self._low: list[float] = []  # max-heap of negated values: the smaller ceil(n/2)
        self._high: list[float] = []  # min-heap: the larger floor(n/2)
        self._high_counts: dict[float, int] = {}  # multiplicity of each value in ``high``
        self._high_sum = 0.0  # sum of exp(v - ref) over ``high``
        self.n = 0
        self.ref = -math.inf  # running maximum, the reference point of the exp sums

    def add(self, reward: float) -> None:
        # The per-observation hot path, flat: a push to one side, then only the rebalancing
        # that side can need (before the push len(low) - len(high) is 0 or 1). ``high`` is
        # updated with its multiplicities and its running sum (+ exp(v - ref) in, - out).
        ref = self.ref
        if reward > ref:
            if self.n:
                self._high_sum *= math.exp(ref - reward)
            self.ref = ref = reward
        n = self.n = self.n + 1
        low, high, counts = self._low, self._high, self._high_counts
        if low and reward > -low[0]:
            heappush(high, reward)
            counts[reward] = counts.get(reward, 0) + 1
            self._high_sum += math.exp(reward - ref)
            if len(high) > len(low):
                value = heappop(high)
                left = counts[value] - 1
                if left:
                    counts[value] = left
                else:
                    del counts[value]
                self._high_sum -= math.exp(value - ref)
                heappush(low, -value)
        else:
            heappush(low, -reward)
            if len(low) > len(high) + 1:
                value = -heappop(low)
                heappush(high, value)
                counts[value] = counts.get(value, 0) + 1
                self._high_sum += math.exp(value - ref)
        if n & (n - 1) == 0:  # power of two: re-sum exactly, O(1) amortised
            self._high_sum = math.fsum(math.exp(v - ref) for v in high)

    @property
    def median(self) -> float:
        """Median of the rewards so far (mean of the two middle ones for even n)."""
        if not self.n:
            raise ValueError("no rewards observed yet")
        if self.n & 1:
            return -self._low[0]
        return (-self._low[0] + self._high[0]) / 2.0

    def tail(self) -> tuple[float, int, float]:
        """(median, tail_count, tail_sum): count and sum of exp(r - ref) over r > median.

        Every reward above the median is in ``high``; the only ``high`` members that are not
        strictly above it are copies of the median value itself, which can only sit at the top
        of ``high``; they are removed by multiplicity.
        """
        median = self.median
        high = self._high
        count = len(high)
        total = self._high_sum
        if count and high[0] == median:
            ties = self._high_counts[median]
            count -= ties
            total = total - ties * math.exp(median - self.ref) if count else 0.0
        return median, count, max(total, 0.0)
