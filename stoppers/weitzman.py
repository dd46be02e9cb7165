"""Known-distribution oracle (Weitzman) and the theory algorithm for Exponential rewards (UCB).

* :class:`Weitzman` — Definition "Weitzman's Algorithm for infinitely-many identical boxes":
  with D known, stop at the first reward >= tau(D, c).
* :class:`UCBExponential` — Algorithm "UCB Pandora's Box" (Appendix C) with the bound of
  Theorem "Anytime-valid Upper Confidence Bound for Exponential Fair-cap value":
  tau+ = mu_n (1 + r_delta(n)) log(mu_n (1 + r_delta(n)) / c),
  r_delta(n) = min{1/2, sqrt(6/n log(2n(n+1)/delta))}; stop once max >= tau+.
"""

from __future__ import annotations

import math
from typing import Any

from stoppers import elementwise as ew
from stoppers.base import StoppingPolicy
from stoppers.faircap import _check_cost, fair_cap

__all__ = ["UCBExponential", "Weitzman", "exponential_radius", "ucb_exponential_tau_plus"]


class Weitzman(StoppingPolicy):
    """Oracle: stop at the first reward >= tau(D, cost) (stop reason ``"threshold"``).

    ``distribution`` is a scipy.stats frozen distribution or a 1-d array of samples taken as
    the empirical distribution (:func:`stoppers.faircap.fair_cap`).
    """

    def __init__(self, distribution: Any, cost: float, *, max_samples: int | None = None) -> None:
        _check_cost(cost)
        super().__init__(max_samples=max_samples)
        self.cost = float(cost)
        self.tau = fair_cap(distribution, cost)

    def _decide(self, reward: float) -> str | None:
        return "threshold" if self._best >= self.tau else None

    @property
    def threshold(self) -> float:
        return self.tau


def exponential_radius(n: Any, delta: float) -> Any:
    """r_delta(n) = min{1/2, sqrt(6/n log(2n(n+1)/delta))} (Lemma "Anytime-valid Confidence
    Sequence for Exponential distribution"). Floats or arrays."""
    return ew.minimum(0.5, ew.sqrt(6.0 / n * ew.log(2.0 * n * (n + 1.0) / delta)))


def ucb_exponential_tau_plus(n: Any, mean: Any, cost: float, delta: float) -> Any:
    """tau+_delta(n) = mu_n (1 + r) log(mu_n (1 + r) / c); -inf when mu_n (1 + r) <= 0."""
    with ew.quiet(n, mean):
        upper = mean * (1.0 + exponential_radius(n, delta))
        positive = upper > 0
        safe = ew.where(positive, upper, 1.0)
        return ew.where(positive, safe * ew.log(safe / cost), -math.inf)


class UCBExponential(StoppingPolicy):
    """UCB Pandora's Box for Exponential rewards (stop reason ``"threshold"``).

    Assumes rewards are Exp(lambda) draws with lambda <= 1/(c e) (the theorem's family); the
    running mean is the only state (O(1) per observation).
    """

    def __init__(self, cost: float, delta: float = 0.05, *, max_samples: int | None = None) -> None:
        _check_cost(cost)
        if not (isinstance(delta, int | float) and 0 < delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        super().__init__(max_samples=max_samples)
        self.cost = float(cost)
        self.delta = float(delta)
        self._sum = 0.0
        self._tau_plus = math.inf  # the Algorithm's large initial M_0

    def _decide(self, reward: float) -> str | None:
        self._sum += reward
        self._tau_plus = float(
            ucb_exponential_tau_plus(self._n, self._sum / self._n, self.cost, self.delta)
        )
        return "threshold" if self._best >= self._tau_plus else None

    @property
    def threshold(self) -> float | None:
        """The current tau+ (None before the first reward)."""
        return None if self._n == 0 else self._tau_plus

    @property
    def tau_plus(self) -> float:
        return self._tau_plus
