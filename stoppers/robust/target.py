"""Target-acceptance stopping on a GPD tail: deliver the acceptance rate the user asked for.

The paper's variant (Section 4.3) stops when AR_kappa_hat(M) >= target, with kappa_hat from a
shifted exponential fit of exp(reward). Two things make that miss its target: the tail model
(wrong shape -> wrong kappa_hat), and the overshoot of a first-crossing rule (the reward it stops
with is typically *above* the threshold, so the delivered acceptance exceeds the target whenever
kappa_hat is right).

This policy fixes both:

* kappa_hat is the alpha-percentile of a peaks-over-threshold GPD fit on the raw rewards
  (:mod:`stoppers.robust.gpd_tail`), widened by a confidence margin that shrinks with evidence:
  the tail scale used for kappa is sigma * (1 + z / sqrt(k)) with k the number of exceedances.
* The stop test accounts for the overshoot. A rule "stop at the first reward >= t" returns a
  reward distributed as V | V >= t, so its mean acceptance is h(t) = E[AR_kappa(V) | V >= t].
  h increases in t, so the cheapest threshold rule that delivers the target on average stops
  at the first M with h(M) >= target - the constrained (Lagrangian) form of Weitzman's rule.
  We evaluate h at the current best under the fitted tail: one 24-point quadrature, no root.

Until the tail can be fitted (fewer than two distinct rewards above the threshold, e.g. every
reward tied at a clip) the policy keeps sampling - unless the ties say the best is the top of
the support (stop reason "tied", :meth:`TailTracker.tied_ceiling`).
"""

from __future__ import annotations

import math

from stoppers.base import StoppingPolicy
from stoppers.robust.gpd_tail import TailFit, acceptance
from stoppers.robust.prior import TailPrior
from stoppers.robust.tracker import TailTracker

__all__ = ["TailTargetAcceptance"]


class TailTargetAcceptance(StoppingPolicy):
    """Stop once the best reward's expected delivered acceptance reaches ``target``.

    Parameters
    ----------
    target: acceptance rate to deliver, in (0, 1].
    alpha: benchmark percentile (Definition "Benchmark Reward"), in (0, 1).
    min_samples: rewards to see before any stop (default 8, or max_samples if smaller).
    max_samples: hard budget, stop reason "budget".
    kappa_z: confidence margin on the benchmark quantile, in standard errors (see
        :func:`kappa_offset`).
    overshoot: True (default) stops when h(best) >= target (module docstring); False uses the
        paper's plain test AR_kappa_hat(best) >= target.
    prior: cross-prompt :class:`TailPrior` giving the shape prior xi0 and its weight;
        None uses ``TailPrior()`` (xi0 = 0, the exponential-tail / Gumbel domain).
    """

    def __init__(
        self,
        target: float,
        *,
        alpha: float = 0.99,
        min_samples: int | None = None,
        max_samples: int | None = None,
        kappa_z: float = 0.3,
        overshoot: bool = True,
        prior: TailPrior | None = None,
    ) -> None:
        super().__init__(max_samples=max_samples)
        target = float(target)
        if not (0.0 < target <= 1.0):
            raise ValueError(f"target must be in (0, 1], got {target!r}")
        if not (0.0 < alpha < 1.0):
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        min_samples = _default_min_samples(min_samples, max_samples)
        if not (kappa_z >= 0.0 and math.isfinite(kappa_z)):
            raise ValueError(f"kappa_z must be finite and >= 0, got {kappa_z!r}")
        self.target = target
        self.alpha = float(alpha)
        self.min_samples = min_samples
        self.kappa_z = float(kappa_z)
        self.overshoot = bool(overshoot)
        self.prior = prior if prior is not None else TailPrior()
        self._tracker = TailTracker(xi0=self.prior.xi0, prior_weight=self.prior.weight)
        self._fit_seen: TailFit | None = None
        self._kappa_off = math.nan
        self._h = math.nan

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
        return acceptance(self._best - fit.u - self._kappa_off)

    @property
    def expected_delivered_acceptance(self) -> float | None:
        """h(best): mean acceptance of the threshold rule stopping at the current best."""
        return None if math.isnan(self._h) else self._h

    def _decide(self, reward: float) -> str | None:
        tracker = self._tracker
        refit = tracker.add(reward)
        fit = tracker.fit
        if tracker.tied_ceiling(self.min_samples):
            return "tied"
        if fit is None:
            return None
        if refit or fit is not self._fit_seen:
            self._fit_seen = fit
            self._kappa_off = kappa_offset(fit, self.alpha, self.kappa_z, self.prior.weight)
        if self._n < self.min_samples:
            return None
        if refit or reward >= self._best:
            m_off = self._best - fit.u
            if self.overshoot:
                self._h = fit.conditional_acceptance(m_off, self._kappa_off)
            else:
                self._h = acceptance(m_off - self._kappa_off)
        return "target" if self._h >= self.target else None


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
