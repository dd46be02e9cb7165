"""Baselines: fixed Best-of-N and the patience heuristic."""

from __future__ import annotations

from stoppers.base import StoppingPolicy, _check_positive_int

__all__ = ["FixedN", "Patience"]


class FixedN(StoppingPolicy):
    """Best-of-N (Section 2.2): always draw exactly ``n`` samples; stops with ``"budget"``."""

    def __init__(self, n: int) -> None:
        _check_positive_int("n", n)
        super().__init__(max_samples=n)

    def _decide(self, reward: float) -> str | None:
        return None

    @property
    def threshold(self) -> float | None:
        return None


class Patience(StoppingPolicy):
    """Stop after ``k`` consecutive samples that do not strictly improve on the best.

    A common early-stopping heuristic (the authors' repository compares against it): stop reason
    ``"patience"``; ``max_samples`` ends the stream with ``"budget"``.
    """

    def __init__(self, k: int, *, max_samples: int | None = None) -> None:
        _check_positive_int("k", k)
        super().__init__(max_samples=max_samples)
        self.k = k
        self._since_improvement = 0

    def _decide(self, reward: float) -> str | None:
        if self._best_index == self._n - 1:  # this reward is the new best
            self._since_improvement = 0
            return None
        self._since_improvement += 1
        return "patience" if self._since_improvement >= self.k else None
