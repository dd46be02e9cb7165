"""The one interface the gateway uses to score candidates, whatever the backend.

Backends: the batching worker over HTTP, a vLLM pooling server, or a model loaded in-process.
The gateway depends on this Protocol only, so tests inject a fake backend without monkeypatching.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["RewardBackend", "RewardError", "RewardInputError"]


class RewardError(RuntimeError):
    """The reward backend could not score: unreachable, timed out, or answered nonsense
    (an error status, the wrong number of scores, non-finite values)."""


class RewardInputError(RewardError, ValueError):
    """The inputs themselves cannot be scored (e.g. a non-text content part, a chat template that
    rejects the dialogue); retrying will not help. The worker answers these with 400."""


@runtime_checkable
class RewardBackend(Protocol):
    """Scores responses to one prompt. Scores are raw reward-model logits, in input order."""

    async def score(
        self, messages: Sequence[Mapping[str, Any]], responses: Sequence[str]
    ) -> list[float]:
        """Score each response as the assistant's reply to ``messages``.

        Raises :class:`RewardError` when the backend cannot produce one finite score per response.
        """
        ...

    async def ready(self) -> bool:
        """True when the backend answers (for the gateway's ``/ready``)."""
        ...

    async def aclose(self) -> None:
        """Release connections or the model."""
        ...
