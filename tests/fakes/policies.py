"""Simple, predictable stopping policies for gateway tests (the real ones live in `stoppers`)."""

from __future__ import annotations

from stoppers.base import StoppingPolicy

__all__ = ["StopAbove"]


class StopAbove(StoppingPolicy):
    """Stop as soon as a reward reaches ``threshold`` (reason "threshold")."""

    def __init__(self, threshold: float, *, max_samples: int | None = None) -> None:
        super().__init__(max_samples=max_samples)
        self._threshold = threshold

    @property
    def threshold(self) -> float:
        return self._threshold

    def _decide(self, reward: float) -> str | None:
        return "threshold" if reward >= self._threshold else None
