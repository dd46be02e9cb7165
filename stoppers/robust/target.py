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
the support (stop reason "tied", :meth:`TailTracker.tied_ceiling`). Rewards all at the
deployment's floor are no point mass: they stop (reason "floor") once the floor's expected
acceptance reaches the target (:func:`stoppers.robust.ceiling.floor_acceptance_bound`).
"""

from __future__ import annotations

import math

from stoppers.robust.ceiling import FloorBound, floor_acceptance_bound
from stoppers.robust.gpd_tail import TailFit, acceptance
from stoppers.robust.pile import PileBound, PileRule
from stoppers.robust.policy import TailPolicy
from stoppers.robust.prior import TailPrior
from stoppers.robust.xi_prior import XiPrior

__all__ = ["TailTargetAcceptance"]


class TailTargetAcceptance(TailPolicy):
    """Stop once the best reward's expected delivered acceptance reaches ``target``.

    Parameters
    ----------
    target: acceptance rate to deliver, in (0, 1].
    alpha: benchmark percentile (Definition "Benchmark Reward"), in (0, 1).
    min_samples: rewards to see before any stop (default 8, or max_samples if smaller).
    max_samples: hard budget, stop reason "budget".
    kappa_z: confidence margin on the benchmark quantile, in standard errors (see
        :func:`~stoppers.robust.policy.kappa_offset`); with an XiPrior, each fit applies its
        ``margin_share`` of it, as TailPandora does.
    overshoot: True (default) stops when h(best) >= target (module docstring); False uses the
        paper's plain test AR_kappa_hat(best) >= target.
    prior: cross-prompt :class:`TailPrior` giving the shape prior xi0 and its weight, or a
        learned :class:`~stoppers.robust.xi_prior.XiPrior`; None uses ``TailPrior()``
        (xi0 = 0, the exponential-tail / Gumbel domain).
    floor: the deployment's established reward floor (:func:`~stoppers.robust.ceiling.floor_of`)
        or None.
    pile: the deployment's learned :class:`~stoppers.robust.pile.PileBound`
        (:func:`~stoppers.robust.pile.pile_of`) or None: stop at a repeated best once it says
        the best keeps the target.
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
        prior: TailPrior | XiPrior | None = None,
        floor: FloorBound | None = None,
        pile: PileBound | None = None,
    ) -> None:
        target = float(target)
        if not (0.0 < target <= 1.0):
            raise ValueError(f"target must be in (0, 1], got {target!r}")
        self.target = target  # before the base builds the tracker (_repeats_target)
        super().__init__(
            alpha=alpha,
            min_samples=min_samples,
            max_samples=max_samples,
            kappa_z=kappa_z,
            prior=prior,
            floor=floor,
            pile=pile,
        )
        self.overshoot = bool(overshoot)
        self._h = math.nan

    def _repeats_target(self) -> float | None:
        return self.target

    def _pile_rule(self, pile: PileBound) -> PileRule:
        return PileRule(pile, self.alpha, target=self.target)

    @property
    def expected_delivered_acceptance(self) -> float | None:
        """h(best): mean acceptance of the threshold rule stopping at the current best."""
        return None if math.isnan(self._h) else self._h

    def _test(self, fit: TailFit, *, refresh: bool) -> str | None:
        if refresh:
            m_off = self._tracker.judged_best() - fit.u  # the best on a lattice: tracker
            if self.overshoot:
                self._h = fit.conditional_acceptance(m_off, self._kappa_off)
            else:
                self._h = acceptance(m_off - self._kappa_off)
        return "target" if self._h >= self.target else None

    def _floor_test(self, n: int) -> bool:
        assert self.floor is not None  # only called at the floor
        return floor_acceptance_bound(n, self.alpha, self.floor) >= self.target
