"""An in-process reward backend for tests: the score is the quality the fake upstream wrote.

``FakeReward`` implements :class:`reward.base.RewardBackend`. A response ``"answer 0.73 ..."``
scores 0.73 (anything else scores ``default``), so a test knows which candidate is best.
``scorer`` replaces that rule (e.g. ``len`` for a real upstream's text).
Failures are injectable: ``down`` (raises RewardError), ``nan``, ``wrong_count``, ``delay``.
Every call's batch is recorded in ``calls``.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reward.base import RewardError

__all__ = ["FakeReward", "quality_of"]

_QUALITY = re.compile(r"answer (-?\d+(?:\.\d+)?)")


def quality_of(text: str, default: float = 0.0) -> float:
    match = _QUALITY.search(text)
    return float(match.group(1)) if match else default


class FakeReward:
    def __init__(
        self,
        *,
        delay: float = 0.0,
        default: float = 0.0,
        scorer: Callable[[str], float] | None = None,
    ) -> None:
        self.delay = delay
        self.scorer = scorer
        self.default = default
        self.down = False
        self.nan = False
        self.wrong_count = False
        self.is_ready = True
        self.calls: list[list[str]] = []
        self.closed = False

    async def score(
        self, messages: Sequence[Mapping[str, Any]], responses: Sequence[str]
    ) -> list[float]:
        self.calls.append(list(responses))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.down:
            raise RewardError("fake reward backend is down")
        if self.nan:
            return [math.nan for _ in responses]
        score = self.scorer or (lambda text: quality_of(text, self.default))
        scores = [score(text) for text in responses]
        return scores[:-1] if self.wrong_count else scores

    async def ready(self) -> bool:
        return self.is_ready and not self.down

    async def aclose(self) -> None:
        self.closed = True

    @property
    def scored(self) -> int:
        return sum(len(batch) for batch in self.calls)
