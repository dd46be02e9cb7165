"""The top of a bounded reward model's scale, learned across a deployment's requests.

Why: bounded reward models return their upper bound again and again: a judge's logit clipped at
logit(0.9999) (562 of the 39,445 AlpacaEval entries in ``../shared/data``, in 143 of its 805
prompts, sit exactly at the pool's maximum), a sigmoid that saturates, integer scores. A request
whose best reward *is* that bound cannot improve by sampling more, whatever its prompt, but one
request cannot tell a bound from a value its own prompt merely repeats (the per-request rule
:class:`~stoppers.robust.tracker.BestTies` needs three ties above lower rewards, and says
nothing when a prompt's rewards all sit at the bound). A deployment can: the highest reward any
of its requests has seen, reached exactly by ``CEILING_REQUESTS`` different requests and never
exceeded, is the scale's top. Rewards from a continuous model never tie across requests, so for
them no ceiling is ever established and nothing changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CEILING_REQUESTS", "RewardCeiling", "ceiling_of"]

CEILING_REQUESTS = 3  # requests that must have reached the top before it counts as the bound


@dataclass
class RewardCeiling:
    """The highest reward seen in a deployment and how many requests reached it exactly."""

    top: float = -math.inf
    requests: int = 0  # requests whose rewards include ``top`` (each counted once)

    def note(self, rewards: Any) -> None:
        """Learn from one finished request's rewards (any length; non-finite ones ignored)."""
        x = np.asarray(rewards, dtype=np.float64).ravel()
        x = x[np.isfinite(x)]
        if x.size == 0:
            return
        best = float(x.max())
        if best > self.top:
            self.top, self.requests = best, 1
        elif best == self.top:
            self.requests += 1

    @property
    def bound(self) -> float | None:
        """The established top of the scale (None until ``CEILING_REQUESTS`` requests reached
        it)."""
        return self.top if self.requests >= CEILING_REQUESTS else None

    def to_dict(self) -> dict[str, Any]:
        return {"top": self.top if math.isfinite(self.top) else None, "requests": self.requests}

    @classmethod
    def from_dict(cls, data: Any) -> RewardCeiling:
        """Restore :meth:`to_dict`; ValueError on anything it could not have written."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError("ceiling must be an object")
        top, requests = data.get("top"), data.get("requests", 0)
        if top is None:
            top = -math.inf
        if isinstance(top, bool) or not isinstance(top, int | float) or math.isnan(top):
            raise ValueError("ceiling.top must be a number or null")
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
            raise ValueError("ceiling.requests must be an integer >= 0")
        if not math.isfinite(top) and (top > 0 or requests):
            raise ValueError("ceiling.top must be finite once requests reached it")
        return cls(top=float(top), requests=requests)


def ceiling_of(prior: object) -> float | None:
    """The established ceiling of a deployment prior that keeps one, else None. Policies read
    it once, when a request starts: the value they stop at cannot move under them."""
    ceiling = getattr(prior, "ceiling", None)
    return ceiling.bound if isinstance(ceiling, RewardCeiling) else None
