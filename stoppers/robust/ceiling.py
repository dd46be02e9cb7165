"""The ends of a bounded reward model's scale, learned across a deployment's requests.

Why: bounded reward models return their bounds again and again: a judge's logit clipped at
logit(0.9999) (562 of the 39,445 AlpacaEval entries in ``../shared/data``, in 143 of its 805
prompts, sit exactly at the pool's maximum) and at logit(0.0001) below (most of its entries), a
sigmoid that saturates, integer scores. One request cannot tell a bound from a value its own
prompt merely repeats; a deployment can: the highest (lowest) reward any of its requests has
seen, reached exactly by ``CEILING_REQUESTS`` different requests and never passed, is an end of
the scale. Rewards from a continuous model never tie across requests, so for them no end is ever
established and nothing changes.

* The **ceiling** (:class:`RewardCeiling`): a request whose best reward *is* the top cannot
  improve by sampling more, whatever its prompt (stop reason ``"ceiling"``; the per-request rule
  :class:`~stoppers.robust.tracker.BestTies` needs three ties above lower rewards, and says
  nothing when a prompt's rewards all sit at the bound).
* The **floor** (:class:`RewardFloor`): a request whose rewards all sit at the bottom is *not* a
  point mass - its prompt may have a few good responses the judge scores above the clip - so the
  cold-start point-mass rule (32 identical rewards) must not stop it; the rule of succession
  prices the chance of a better one instead (:func:`floor_gain_bound`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.stats import beta as beta_dist

__all__ = [
    "CEILING_REQUESTS",
    "RewardCeiling",
    "RewardFloor",
    "ceiling_of",
    "floor_acceptance_bound",
    "floor_gain_bound",
    "floor_of",
]

CEILING_REQUESTS = 3  # requests that must have reached an end before it counts as the bound


@dataclass
class _ScaleEnd:
    """The most extreme reward seen on one side and how many requests reached it exactly."""

    value: float
    requests: int = 0  # requests whose rewards include ``value`` (each counted once)

    SIGN: ClassVar[float]  # +1: the top, -1: the bottom
    NAME: ClassVar[str]  # what the prior calls it
    KEY: ClassVar[str]  # the value's key in to_dict

    def note(self, rewards: Any) -> None:
        """Learn from one finished request's rewards (any length; non-finite ones ignored)."""
        x = np.asarray(rewards, dtype=np.float64).ravel()
        x = x[np.isfinite(x)]
        if x.size == 0:
            return
        extreme = float(x.max() if self.SIGN > 0 else x.min())
        if self.SIGN * extreme > self.SIGN * self.value:
            self.value, self.requests = extreme, 1
        elif extreme == self.value:
            self.requests += 1

    @property
    def bound(self) -> float | None:
        """The established end of the scale (None until ``CEILING_REQUESTS`` requests reached
        it)."""
        return self.value if self.requests >= CEILING_REQUESTS else None

    def to_dict(self) -> dict[str, Any]:
        value = self.value if math.isfinite(self.value) else None
        return {self.KEY: value, "requests": self.requests}

    @classmethod
    def from_dict(cls, data: Any) -> _ScaleEnd:
        """Restore :meth:`to_dict`; ValueError on anything it could not have written."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"{cls.NAME} must be an object")
        value, requests = data.get(cls.KEY), data.get("requests", 0)
        if value is None:
            value = -cls.SIGN * math.inf
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ValueError(f"{cls.NAME}.{cls.KEY} must be a number or null")
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
            raise ValueError(f"{cls.NAME}.requests must be an integer >= 0")
        if not math.isfinite(value) and (cls.SIGN * value > 0 or requests):
            raise ValueError(f"{cls.NAME}.{cls.KEY} must be finite once requests reached it")
        return cls(value=float(value), requests=requests)


@dataclass
class RewardCeiling(_ScaleEnd):
    """The highest reward seen in a deployment and how many requests reached it exactly."""

    value: float = -math.inf
    SIGN: ClassVar[float] = 1.0
    NAME: ClassVar[str] = "ceiling"
    KEY: ClassVar[str] = "top"


@dataclass
class RewardFloor(_ScaleEnd):
    """The lowest reward seen in a deployment and how many requests reached it exactly."""

    value: float = math.inf
    SIGN: ClassVar[float] = -1.0
    NAME: ClassVar[str] = "floor"
    KEY: ClassVar[str] = "bottom"


def ceiling_of(prior: object) -> float | None:
    """The established ceiling of a deployment prior that keeps one, else None. Policies read
    it once, when a request starts: the value they stop at cannot move under them."""
    ceiling = getattr(prior, "ceiling", None)
    return ceiling.bound if isinstance(ceiling, RewardCeiling) else None


def floor_of(prior: object) -> float | None:
    """The established floor of a deployment prior that keeps one, else None (read once, when a
    request starts, like :func:`ceiling_of`)."""
    floor = getattr(prior, "floor", None)
    return floor.bound if isinstance(floor, RewardFloor) else None


def floor_gain_bound(n: int, alpha: float) -> float:
    """Upper bound on one more draw's expected acceptance gain after ``n`` draws all at the floor.

    Let p be the prompt's chance of a reward above the floor; after n draws at the floor, with a
    uniform prior (Laplace's rule of succession), p ~ Beta(1, n + 1). While p <= 1 - alpha the
    benchmark kappa (the alpha-quantile) *is* the floor and the best already has acceptance 1;
    above it a draw gains at most 1, and only with probability p. So the gain is at most
    E[p 1{p > 1 - alpha}] = P(Beta(2, n + 1) > 1 - alpha) / (n + 2).
    """
    return float(beta_dist.sf(1.0 - alpha, 2.0, n + 1.0)) / (n + 2.0)


def floor_acceptance_bound(n: int, alpha: float) -> float:
    """P(the floor is already accepted) after ``n`` draws all at the floor: P(p <= 1 - alpha)
    under p ~ Beta(1, n + 1), i.e. 1 - alpha^(n + 1) (see :func:`floor_gain_bound`)."""
    return 1.0 - alpha ** (n + 1.0)
