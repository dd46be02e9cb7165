"""Adaptive Best-of-N (paper Section 4.2, Algorithm "Adaptive Best-of-N Sampling via UCB Pandora's
Box") and its target-acceptance variant (Section 4.3), one request at a time.

Each observation updates :class:`~stoppers.tail_stats.MedianTailStats` in O(log n) and then
calls the shared decision kernel :mod:`stoppers.adaptive_math` on Python floats, the same
functions the replay engine calls on arrays. Every choice the paper leaves open (percentile,
even-n median, ties/empty tail, delta schedule) is documented there and exposed here as a
keyword.

Defaults (``DEFAULT_DELTA``, ``DEFAULT_MIN_SAMPLES``, ``DEFAULT_EMPTY_TAIL``) were chosen on the
AlpacaEval judge pool (805 prompts x 49 responses, 10 random orderings each, utility = AR_kappa
of the best against each prompt's 0.99-quantile, minus c per sample; costs 0.02, 0.01, 0.005,
0.002, 0.001) and checked on Gaussian rewards (960 per prompt, costs 1e-2..1e-4):

* delta: the Algorithm's width w_n = sqrt(log n log(1/delta) / n) shrinks the *LCB* that sets
  the benchmark kappa, so a small delta lowers kappa and makes the policy stop sooner, not
  later. With delta <= 0.1 and t = 10 it stopped at ~10 samples whatever the cost; mean profit
  rose with delta at every cost (t = 10, empty tail continues: delta 0.05 -> 0.171 / 0.278 /
  0.332 / 0.364 / 0.375, delta 0.5 -> 0.188 / 0.343 / 0.428 / 0.486 / 0.506; delta 0.9 adds
  up to 0.055 more). 0.5 keeps a real confidence margin; the ordering mostly held on the
  Gaussian rewards.
* min_samples = 10, the authors' code's t: t = 5 was worse at every (delta, cost); t = 20 did
  better still on this small pool (the best fixed N there is ~all 49 samples for c <= 0.005),
  but costs a fixed 20 generations on every request, which the gateway's typical budgets
  (8-32) cannot afford.
* empty_tail = "continue": judge rewards tie heavily (half the pool sits at the lower clip), so
  "no reward above the median" usually means "all bad so far", not "converged"; continuing
  beat stopping at every (delta, t, cost) tried.

Even so the paper's rule stays below the best fixed N in hindsight on this pool at low cost
(0.506 vs 0.951 at c = 0.001): once the best passes the LCB-based kappa the capped utility is 1
and it stops. ``utility="bradley_terry"`` (the authors' code) keeps sampling longer (0.688 at
c = 0.001, delta 0.05).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from stoppers import adaptive_math as am
from stoppers.base import StoppingPolicy, _check_positive_int
from stoppers.elementwise import SCALAR
from stoppers.tail_stats import MedianTailStats

if TYPE_CHECKING:
    from stoppers.deployment import DeploymentPrior

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_DELTA",
    "DEFAULT_EMPTY_TAIL",
    "DEFAULT_MIN_SAMPLES",
    "AdaptiveBestOfN",
    "TargetAcceptance",
    "default_cost_policy",
    "default_target_policy",
]

DEFAULT_ALPHA = 0.99
DEFAULT_DELTA = 0.5
DEFAULT_MIN_SAMPLES = 10
DEFAULT_EMPTY_TAIL: am.EmptyTail = "continue"


class _AdaptiveBase(StoppingPolicy):
    """Shared state and validation of the two adaptive policies."""

    def __init__(
        self,
        *,
        alpha: float,
        delta: float,
        min_samples: int,
        max_samples: int | None,
        percentile: am.Percentile,
        delta_schedule: am.DeltaSchedule,
        empty_tail: am.EmptyTail,
    ) -> None:
        super().__init__(max_samples=max_samples)
        _check_open_unit("alpha", alpha)
        _check_open_unit("delta", delta)
        _check_positive_int("min_samples", min_samples)
        if max_samples is not None and min_samples > max_samples:
            raise ValueError(
                f"min_samples ({min_samples}) must not exceed max_samples ({max_samples})"
            )
        _check_choice("percentile", percentile, ("shifted_exp", "whole"))
        _check_choice("delta_schedule", delta_schedule, ("fixed", "anytime"))
        _check_choice("empty_tail", empty_tail, ("stop", "continue"))
        self.alpha = float(alpha)
        self.delta = float(delta)
        self.min_samples = min_samples
        self.percentile = percentile
        self.delta_schedule = delta_schedule
        self.empty_tail = empty_tail
        self._stats = MedianTailStats()
        self._acceptance: float | None = None
        self._kappa: float | None = None

    #: the stop reason when the kernel says stop ("threshold" or "target")
    _reason: str
    _kernel: am.CostKernel | am.TargetKernel

    def _decide(self, reward: float) -> str | None:
        """One O(log n) update of the streaming statistics, then the shared kernel's O(1)
        decision (Algorithm lines 5-16; nothing before ``min_samples``, the Algorithm's t)."""
        stats = self._stats
        stats.add(reward)
        n = stats.n
        if n < self.min_samples:
            return None
        median, count, total = stats.tail()
        decision = self._kernel.decide(SCALAR, n, median, count, total, stats.ref, self._best)
        self._acceptance = decision.acceptance
        self._kappa = decision.kappa
        return self._reason if decision.stop else None

    def _statistics(self) -> tuple[int, float, int, float, float]:
        median, count, total = self._stats.tail()
        return self._stats.n, median, count, total, self._stats.ref

    @property
    def acceptance_estimate(self) -> float | None:
        """AR_kappa(best) under the fitted benchmark kappa (None before ``min_samples``)."""
        return self._acceptance

    @property
    def kappa(self) -> float | None:
        """The estimated benchmark reward (the alpha-percentile, line 11), once fitted."""
        return self._kappa


class AdaptiveBestOfN(_AdaptiveBase):
    """Cost mode: stop when the best's utility reaches the UCB fair cap (Algorithm, line 14).

    ``cost`` is per sample, in units of the utility of an accepted answer (B = 1). Stop reason
    ``"threshold"``; ``max_samples`` ends the stream with ``"budget"``. ``utility`` is the
    paper's u = min(2 BT, 1) (Definition "Utility Function", default) or ``"bradley_terry"``,
    the uncapped e^v / (e^v + e^kappa) the authors' code uses.

    >>> policy = AdaptiveBestOfN(cost=0.01, max_samples=64)
    >>> for reward in [0.1, -0.3, 0.8, 0.2, 0.5, -1.0, 0.4, 0.0, 0.3, 0.6, 2.5]:
    ...     if policy.observe(reward):
    ...         break
    >>> policy.stop_reason, policy.n, policy.best
    ('threshold', 10, 0.8)
    """

    _reason = "threshold"

    def __init__(
        self,
        cost: float,
        *,
        alpha: float = DEFAULT_ALPHA,
        delta: float = DEFAULT_DELTA,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        max_samples: int | None = None,
        percentile: am.Percentile = "shifted_exp",
        delta_schedule: am.DeltaSchedule = "fixed",
        empty_tail: am.EmptyTail = DEFAULT_EMPTY_TAIL,
        utility: am.Utility = "acceptance",
    ) -> None:
        if isinstance(cost, bool) or not (
            isinstance(cost, int | float) and math.isfinite(cost) and cost > 0
        ):
            raise ValueError(f"cost must be a finite number > 0, got {cost!r}")
        _check_choice("utility", utility, ("acceptance", "bradley_terry"))
        self.utility = utility
        super().__init__(
            alpha=alpha,
            delta=delta,
            min_samples=min_samples,
            max_samples=max_samples,
            percentile=percentile,
            delta_schedule=delta_schedule,
            empty_tail=empty_tail,
        )
        self.cost = float(cost)
        self._threshold_cache: tuple[int, float, float] | None = None
        # the shared kernel with these settings bound once (validation, constants, w_n memo)
        self._kernel = am.cost_kernel(
            cost=self.cost,
            alpha=self.alpha,
            delta=self.delta,
            min_samples=self.min_samples,
            percentile=self.percentile,
            delta_schedule=self.delta_schedule,
            empty_tail=self.empty_tail,
            utility=self.utility,
        )

    def _solve_threshold(self) -> tuple[float, float] | None:
        if self._stats.n < self.min_samples:
            return None
        if self._threshold_cache is None or self._threshold_cache[0] != self._stats.n:
            tau, reward = am.cost_threshold(
                *self._statistics(),
                cost=self.cost,
                alpha=self.alpha,
                delta=self.delta,
                percentile=self.percentile,
                delta_schedule=self.delta_schedule,
                utility=self.utility,
            )
            self._threshold_cache = (self._stats.n, float(tau), float(reward))
        return self._threshold_cache[1], self._threshold_cache[2]

    @property
    def threshold(self) -> float | None:
        """The reward the best must reach to stop now: u_kappa^-1(tau) (root-solved on demand,
        cached per n; -inf when tau <= 0). None before ``min_samples``."""
        solved = self._solve_threshold()
        return None if solved is None else solved[1]

    @property
    def fair_cap(self) -> float | None:
        """tau, the fair cap of the fitted utility distribution (utility units)."""
        solved = self._solve_threshold()
        return None if solved is None else solved[0]


class TargetAcceptance(_AdaptiveBase):
    """Target mode (Section 4.3): stop when the best's estimated acceptance rate reaches
    ``target`` in (0, 1], kappa fitted with the UCB scale (the paper's footnote). Stop reason
    ``"target"``; ``max_samples`` ends the stream with ``"budget"``."""

    _reason = "target"

    def __init__(
        self,
        target: float,
        *,
        alpha: float = DEFAULT_ALPHA,
        delta: float = DEFAULT_DELTA,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        max_samples: int | None = None,
        percentile: am.Percentile = "shifted_exp",
        delta_schedule: am.DeltaSchedule = "fixed",
        empty_tail: am.EmptyTail = DEFAULT_EMPTY_TAIL,
    ) -> None:
        if not (isinstance(target, int | float) and 0 < target <= 1):
            raise ValueError(f"target must be in (0, 1], got {target!r}")
        super().__init__(
            alpha=alpha,
            delta=delta,
            min_samples=min_samples,
            max_samples=max_samples,
            percentile=percentile,
            delta_schedule=delta_schedule,
            empty_tail=empty_tail,
        )
        self.target = float(target)
        self._kernel = am.target_kernel(
            target=self.target,
            alpha=self.alpha,
            delta=self.delta,
            min_samples=self.min_samples,
            percentile=self.percentile,
            delta_schedule=self.delta_schedule,
            empty_tail=self.empty_tail,
        )

    @property
    def threshold(self) -> float | None:
        """The reward the best must reach: kappa + log(target / (2 - target))."""
        if self._kappa is None:
            return None
        return self._kappa + math.log(self.target / (2.0 - self.target))


def default_cost_policy(
    cost: float,
    *,
    max_samples: int,
    min_samples: int | None = None,
    prior: DeploymentPrior | None = None,
) -> StoppingPolicy:
    """The gateway's policy for a per-sample cost: :class:`stoppers.robust.ShapePandora`.

    Weitzman's rule on the reward shape the deployment learned across its requests, from
    ``prior`` (a :class:`~stoppers.robust.cost_prior.CostShapePrior`, what
    ``new_deployment_prior("cost")`` returns). Until that prior is trusted - 8 requests of >= 24
    rewards, >= 1000 pooled draws, and both shared-shape tests passed - and with no prior or a
    prior of another class, it *is* :class:`stoppers.robust.TailPandora` (GPD tail fit) decision
    for decision. TailPandora replaced :class:`AdaptiveBestOfN` after the replay in the README
    section "Stopping that keeps its promise" (profit ~1.0x the best fixed N in hindsight vs
    0.54-0.88x for the paper's rule); ShapePandora became the default once its trust tests kept
    it at or above TailPandora within 0.3 point on every replayed pool and budget (same
    section). ``min_samples`` defaults to 8 capped at ``max_samples``.
    """
    from stoppers.robust.cost_prior import CostShapePrior
    from stoppers.robust.shape_cost import ShapePandora

    _check_positive_int("max_samples", max_samples)
    return ShapePandora(
        cost,
        max_samples=max_samples,
        min_samples=min_samples,
        prior=prior if isinstance(prior, CostShapePrior) else None,
    )


def default_target_policy(
    target: float,
    *,
    max_samples: int,
    min_samples: int | None = None,
    prior: DeploymentPrior | None = None,
) -> StoppingPolicy:
    """The gateway's policy for a target acceptance rate:
    :class:`stoppers.robust.pooled_target.PooledTargetAcceptance`.

    It learns the reward shape across the deployment's requests from ``prior`` (a
    :class:`~stoppers.robust.shape_prior.ShapePrior`, what
    ``new_deployment_prior("target")`` returns); without one, or while the prior has seen
    fewer than ``COLD_START`` requests, it runs :class:`stoppers.robust.TailTargetAcceptance`.
    It replaced the paper's :class:`TargetAcceptance` after the sequential replay in
    docs/robust-stopping.md, "Target mode on a deployment". A prior of another class is ignored.
    """
    from stoppers.robust.pooled_target import PooledTargetAcceptance
    from stoppers.robust.shape_prior import ShapePrior

    _check_positive_int("max_samples", max_samples)
    return PooledTargetAcceptance(
        target,
        prior=prior if isinstance(prior, ShapePrior) else None,
        max_samples=max_samples,
        min_samples=min_samples,
    )


def _min_samples(min_samples: int | None, max_samples: int) -> int:
    if min_samples is not None:
        return min_samples
    _check_positive_int("max_samples", max_samples)
    return min(DEFAULT_MIN_SAMPLES, max_samples)


def _check_open_unit(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0 < value < 1):
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
