"""Known-distribution oracle (Weitzman) and the theory algorithm for Exponential rewards (UCB).

* :class:`Weitzman` — Definition "Weitzman's Algorithm for infinitely-many identical boxes":
  with D known, stop at the first reward >= tau(D, c).
* :class:`UCBExponential` — Algorithm "UCB Pandora's Box" (Appendix C) with the bound of
  Theorem "Anytime-valid Upper Confidence Bound for Exponential Fair-cap value":
  tau+ = mu_n (1 + r_delta(n)) log(mu_n (1 + r_delta(n)) / c),
  r_delta(n) = min{1/2, sqrt(6/n log(2n(n+1)/delta))}; stop once max >= tau+.

The cap at 1/2 makes that bound NOT anytime-valid for small n: the Lemma's Chernoff step only
covers r = sqrt(...) <= 1/2, and at n = 1 already P(mu_1 (1 + 1/2) < mu) = 1 - e^(-2/3) = 0.49.
Simulated on Exp(1) with c = 0.05, tau+ falls below tau on ~2/3 of streams, all at small n (the
bound holds, <= delta, over the n where the cap is inactive). ``radius="exact"`` fixes this
with the same Chernoff bound solved exactly instead of capped: s_n solves
n psi_-(s) = log(2n(n+1)/delta), psi_-(s) = log(1 + s) - s/(1 + s), i.e.
1 + s_n = -1 / W_0(-exp(-1 - log(2n(n+1)/delta) / n)) (Lambert W), which is anytime-valid.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import special

from stoppers import elementwise as ew
from stoppers.base import StoppingPolicy
from stoppers.faircap import _check_cost, fair_cap

__all__ = [
    "UCBExponential",
    "Weitzman",
    "exact_radius",
    "exponential_radius",
    "ucb_exponential_tau_plus",
]


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


def exact_radius(n: Any, delta: float) -> Any:
    """s_n with n psi_-(s_n) = log(2n(n+1)/delta): the uncapped, valid Chernoff radius."""
    a = np.log(2.0 * np.asarray(n, float) * (np.asarray(n, float) + 1.0) / delta) / np.asarray(
        n, float
    )
    u = -special.lambertw(-np.exp(-1.0 - a), 0).real
    out = 1.0 / u - 1.0
    return float(out) if np.ndim(out) == 0 else out


def ucb_exponential_tau_plus(
    n: Any, mean: Any, cost: float, delta: float, radius: str = "paper"
) -> Any:
    """tau+_delta(n) = mu_n (1 + r) log(mu_n (1 + r) / c); -inf when mu_n (1 + r) <= 0.

    ``radius="paper"`` uses r_delta(n) of the theorem (capped at 1/2), ``"exact"`` the valid
    uncapped :func:`exact_radius`.
    """
    if radius == "paper":
        r = exponential_radius(n, delta)
    elif radius == "exact":
        r = exact_radius(n, delta)
    else:
        raise ValueError(f"radius must be 'paper' or 'exact', got {radius!r}")
    with ew.quiet(n, mean):
        upper = mean * (1.0 + r)
        positive = upper > 0
        safe = ew.where(positive, upper, 1.0)
        return ew.where(positive, safe * ew.log(safe / cost), -math.inf)


class UCBExponential(StoppingPolicy):
    """UCB Pandora's Box for Exponential rewards (stop reason ``"threshold"``).

    Assumes rewards are Exp(lambda) draws with lambda <= 1/(c e) (the theorem's family); the
    running mean is the only state (O(1) per observation). ``radius`` as in
    :func:`ucb_exponential_tau_plus` (the module docstring explains why "exact" exists).
    """

    def __init__(
        self,
        cost: float,
        delta: float = 0.05,
        *,
        max_samples: int | None = None,
        radius: str = "paper",
    ) -> None:
        _check_cost(cost)
        if not (isinstance(delta, int | float) and 0 < delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if radius not in ("paper", "exact"):
            raise ValueError(f"radius must be 'paper' or 'exact', got {radius!r}")
        self.radius = radius
        super().__init__(max_samples=max_samples)
        self.cost = float(cost)
        self.delta = float(delta)
        self._sum = 0.0
        self._tau_plus = math.inf  # the Algorithm's large initial M_0

    def _decide(self, reward: float) -> str | None:
        self._sum += reward
        self._tau_plus = float(
            ucb_exponential_tau_plus(
                self._n, self._sum / self._n, self.cost, self.delta, self.radius
            )
        )
        return "threshold" if self._best >= self._tau_plus else None

    @property
    def threshold(self) -> float | None:
        """The current tau+ (None before the first reward)."""
        return None if self._n == 0 else self._tau_plus

    @property
    def tau_plus(self) -> float:
        return self._tau_plus
