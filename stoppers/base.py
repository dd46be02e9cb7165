"""The contract every stopping policy follows.

A policy is a small stateful object for one request: the caller feeds it rewards one at a time
with :meth:`StoppingPolicy.observe` and stops sampling when it returns True. The base class owns
the bookkeeping every policy shares (validation, best-so-far, the sample budget, the
stop-after-stop guard) so that subclasses only implement the decision itself in
:meth:`StoppingPolicy._decide`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

__all__ = ["PolicyStoppedError", "StoppingPolicy"]


class PolicyStoppedError(RuntimeError):
    """Raised when a policy that has already stopped is fed another reward."""


class StoppingPolicy(ABC):
    """One request's stopping rule.

    Subclasses implement :meth:`_decide`, which sees the state after the new reward has been
    recorded and returns a stop reason (a short string) or None to continue. The budget
    ``max_samples`` is enforced here, after ``_decide``, with reason ``"budget"``.
    """

    def __init__(self, *, max_samples: int | None = None) -> None:
        if max_samples is not None:
            _check_positive_int("max_samples", max_samples)
        self.max_samples = max_samples
        self._n = 0
        self._best = -math.inf
        self._best_index = -1
        self._stop_reason: str | None = None

    # -- read-only state -------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of rewards observed so far."""
        return self._n

    @property
    def best(self) -> float:
        """Best reward observed so far (-inf before the first)."""
        return self._best

    @property
    def best_index(self) -> int:
        """0-based position of :attr:`best` in the stream (-1 before the first reward)."""
        return self._best_index

    @property
    def stop_reason(self) -> str | None:
        """None while running; a short reason ("threshold", "budget", ...) once stopped."""
        return self._stop_reason

    @property
    def stopped(self) -> bool:
        return self._stop_reason is not None

    @property
    def threshold(self) -> float | None:
        """The reward the best must reach for the policy to stop now, where it has one.

        Reported as metadata by the gateway; None when the policy has no such threshold yet.
        """
        return None

    @property
    def acceptance_estimate(self) -> float | None:
        """Estimated acceptance rate of :attr:`best`, for policies that model one."""
        return None

    @property
    def uses_learned_prior(self) -> bool:
        """True when this request decides on what its deployment prior learned (False: no
        prior, or the policy's cold start). The gateway counts requests by it."""
        return False

    # -- the one mutating call ---------------------------------------------------------------
    def observe(self, reward: float) -> bool:
        """Record one reward; return True when sampling should stop now."""
        if self._stop_reason is not None:
            raise PolicyStoppedError(
                f"{type(self).__name__} already stopped ({self._stop_reason!r}) after "
                f"{self._n} rewards; create a new policy for a new request"
            )
        value = float(reward)
        if not math.isfinite(value):
            raise ValueError(f"reward must be finite, got {reward!r}")
        index = self._n
        self._n += 1
        if value > self._best:
            self._best = value
            self._best_index = index
        reason = self._decide(value)
        if reason is None and self.max_samples is not None and self._n >= self.max_samples:
            reason = "budget"
        self._stop_reason = reason
        return reason is not None

    @abstractmethod
    def _decide(self, reward: float) -> str | None:
        """Return a stop reason, or None to keep sampling. ``self.n`` already counts ``reward``."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n={self._n}, best={self._best!r}, "
            f"stop_reason={self._stop_reason!r})"
        )


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
