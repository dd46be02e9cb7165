"""What both GPD-tail policies share: validation, the tail tracker, the benchmark estimate.

Each observation: add the reward to the :class:`~stoppers.robust.tracker.TailTracker`, stop on a
tied ceiling (all rewards at the deployment's floor: on the mode's rule-of-succession test,
:mod:`stoppers.robust.ceiling`), and, whenever the tail fit changes, recompute the benchmark
offset kappa_hat - u (:func:`kappa_offset`). Subclasses add only their mode's stop tests
(:meth:`TailPolicy._test`, :meth:`TailPolicy._floor_test`).
"""

from __future__ import annotations

import math

from stoppers.base import StoppingPolicy
from stoppers.robust.ceiling import FloorBound
from stoppers.robust.gpd_tail import TailFit, acceptance
from stoppers.robust.pile import PileBound, PileRule
from stoppers.robust.prior import TailPrior
from stoppers.robust.tracker import ALL_TIED, TailTracker
from stoppers.robust.xi_prior import XiPrior

__all__ = ["DEFAULT_MIN_SAMPLES", "TailPolicy", "kappa_offset"]


class TailPolicy(StoppingPolicy):
    """Base of :class:`~stoppers.robust.TailPandora` and
    :class:`~stoppers.robust.TailTargetAcceptance` (not a policy on its own)."""

    all_tied = ALL_TIED  # identical rewards that make a point mass (tracker.tied_ceiling)
    # Shrink the request's tail shape by the precision of its estimate (gpd_tail.shape_weight)
    # rather than by its exceedance count; cost mode only, where it was measured.
    precision_weighted = False
    # Stop once rewards repeat so much that no unseen value can hold the benchmark, or that
    # kappa <= best is as likely as the target (tracker.SeenValues, _repeats_target). Target
    # mode only: in cost mode a value above the best with a chance under 1 - alpha can still
    # pay for a sample at small cost (measured worse).
    stops_on_repeats = True
    # Read two values each seen three times as two rounding cells (gpd_tail.fit_cell). Cost mode
    # only: there a two-level prompt had no tail to fit and drew to the budget; target mode stops
    # such prompts once both values repeat (stops_on_repeats).
    two_level_cells = False

    def __init__(
        self,
        *,
        alpha: float,
        min_samples: int | None,
        max_samples: int | None,
        kappa_z: float,
        prior: TailPrior | XiPrior | None,
        floor: FloorBound | None = None,
        tie_ceiling: bool = True,
        full_margins: bool = False,
        pile: PileBound | None = None,
    ) -> None:
        super().__init__(max_samples=max_samples)
        self.full_margins = bool(full_margins)
        if not (0.0 < alpha < 1.0):
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        self.min_samples = _default_min_samples(min_samples, max_samples)
        if not (kappa_z >= 0.0 and math.isfinite(kappa_z)):
            raise ValueError(f"kappa_z must be finite and >= 0, got {kappa_z!r}")
        self.alpha = float(alpha)
        self.kappa_z = float(kappa_z)
        self.prior = prior if prior is not None else TailPrior()
        if floor is not None and not (
            isinstance(floor, FloorBound) and math.isfinite(floor.value) and 0 <= floor.lift <= 1
        ):
            raise ValueError(f"floor must be a FloorBound (finite, lift in [0, 1]), got {floor!r}")
        self.floor = floor
        self._floor_value = None if floor is None else floor.value
        self._tracker = TailTracker(
            xi0=self.prior.xi0,
            prior_weight=self.prior.weight,
            posterior=self.prior.tail_posterior if isinstance(self.prior, XiPrior) else None,
            tie_ceiling=tie_ceiling,
            precision_weighted=self.precision_weighted,
            repeats_alpha=self.alpha if self.stops_on_repeats else None,
            two_level_cells=self.two_level_cells,
            repeats_target=self._repeats_target(),
        )
        self._fit_seen: TailFit | None = None
        self._kappa_off = math.nan
        if pile is not None and not isinstance(pile, PileBound):
            raise ValueError(f"pile must be a PileBound or None, got {pile!r}")
        self._pile = None if pile is None else self._pile_rule(pile)

    def _pile_rule(self, pile: PileBound) -> PileRule:
        """This mode's stop at a repeated best, on the deployment's learned pile."""
        raise NotImplementedError

    def _repeats_target(self) -> float | None:
        """The acceptance :class:`~stoppers.robust.tracker.SeenValues` may stop at (target
        mode's target; None: only when no unseen value can hold the benchmark)."""
        return None

    @property
    def rewards_sorted(self) -> list[float]:
        """The observed rewards, ascending (what a :class:`TailPrior` learns from)."""
        return self._tracker.sorted

    @property
    def threshold(self) -> float | None:
        """The estimated benchmark reward kappa_hat (None before the tail can be fitted)."""
        fit = self._tracker.fit
        return None if fit is None else fit.u + self._kappa_off

    @property
    def acceptance_estimate(self) -> float | None:
        """Estimated acceptance of the current best against kappa_hat."""
        fit = self._tracker.fit
        if fit is None:
            return None
        return acceptance(self._tracker.judged_best() - fit.u - self._kappa_off)

    def _decide(self, reward: float) -> str | None:
        tracker = self._tracker
        refit = tracker.add(reward)
        fit = tracker.fit
        pile = self._pile
        if pile is not None:
            pile.note(reward)
        if self._best == self._floor_value:  # every reward at the scale's bottom: no point mass
            return "floor" if self._n >= self.min_samples and self._floor_test(self._n) else None
        if pile is not None and self._n >= self.min_samples and pile.stops():
            return "repeated"  # the deployment's repeated bests were its prompts' tops (pile)
        if tracker.tied_ceiling(self.min_samples, self.all_tied):
            return "tied"
        if fit is None:
            return None
        if refit or fit is not self._fit_seen:
            self._fit_seen = fit
            z = self.kappa_z * self._margin_share(fit)  # no margin where the tail is bounded
            self._kappa_off = kappa_offset(fit, self.alpha, z, self.prior.weight)
            self._on_new_fit(fit)
        if self._n < self.min_samples:
            return None
        # the mode's statistic only changes with the fit or the best
        return self._test(fit, refresh=refit or reward >= self._best)

    def _margin_share(self, fit: TailFit) -> float:
        """The share of the confidence margins ``fit`` keeps: its ``margin_share`` (the learned
        chance of an open tail), 1 with ``full_margins``."""
        return 1.0 if self.full_margins else fit.margin_share

    def _on_new_fit(self, fit: TailFit) -> None:
        """Hook: derive what the stop test needs from a new fit (``self._kappa_off`` is set)."""

    def _test(self, fit: TailFit, *, refresh: bool) -> str | None:
        """The mode's stop test; ``refresh`` says the cached statistic is stale."""
        raise NotImplementedError

    def _floor_test(self, n: int) -> bool:
        """The mode's stop test after ``n`` rewards all at the deployment's floor."""
        raise NotImplementedError


def kappa_offset(fit: TailFit, alpha: float, z: float, prior_weight: float = 0.0) -> float:
    """kappa_hat - u plus z standard errors: the benchmark's upper confidence bound.

    The standard error is the delta-method one of the GPD quantile
    y = sigma / xi * (r**xi - 1), r = p_u / (1 - alpha), with the GPD's asymptotic covariance
    Var(sigma) = 2 sigma^2 (1 + xi) / k, Var(xi) = (1 + xi)^2 / (k + w), Cov = sigma (1 + xi) / k
    (w = prior pseudo-exceedances). It grows with the extrapolation distance log r and with the
    tail's heaviness and shrinks as 1/sqrt(k): heavier, less-observed tails get a wider margin,
    which is what stops the first-crossing rule from stopping on a lucky under-estimate.
    """
    tail = 1.0 - alpha
    if fit.p_u <= tail:
        return 0.0
    sigma, xi, k = fit.sigma, fit.xi, fit.k
    log_r = math.log(fit.p_u / tail)
    y = fit._excess_quantile(tail / fit.p_u)
    if z > 0.0:
        if abs(xi) < 1e-6:
            dy_dxi = sigma * log_r * log_r / 2.0
        else:
            r_xi = math.exp(xi * log_r)
            dy_dxi = sigma * (r_xi * log_r / xi - (r_xi - 1.0) / (xi * xi))
        dy_dsigma = y / sigma
        one = max(1.0 + xi, 0.05)
        var = (
            dy_dsigma**2 * 2.0 * sigma * sigma * one / k
            + dy_dxi**2 * one * one / (k + prior_weight)
            + 2.0 * dy_dsigma * dy_dxi * sigma * one / k
        )
        y += z * math.sqrt(max(var, 0.0))
    end = fit.endpoint_offset()
    return min(y, end) if math.isfinite(end) else y


DEFAULT_MIN_SAMPLES = 8


def _default_min_samples(min_samples: object, max_samples: int | None) -> int:
    """Validate min_samples; None means 8 (what a gateway can afford), capped at max_samples.

    Eight rewards give a four-point tail fit - the fewest on which the tail model is better
    than a guess; fewer made the target rule stop on noise in our replays.
    """
    if min_samples is None:
        return DEFAULT_MIN_SAMPLES if max_samples is None else min(DEFAULT_MIN_SAMPLES, max_samples)
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
        raise ValueError(f"min_samples must be a positive integer, got {min_samples!r}")
    if max_samples is not None and min_samples > max_samples:
        raise ValueError(f"min_samples ({min_samples}) must not exceed max_samples ({max_samples})")
    return min_samples
