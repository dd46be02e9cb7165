"""Cost-mode stopping on a GPD tail: Weitzman's rule with a tail model that fits any shape.

Same skeleton as the paper's Algorithm "Adaptive Best-of-N Sampling via UCB Pandora's Box"
(Section 4.2): estimate the reward distribution, derive the benchmark kappa_hat and the utility
u_kappa = AR_kappa (Definition "Utility Function", B = 1), stop when the best utility reaches the
fair cap tau of (utility distribution, c). Using the monotonicity of E[(U - t)+] in t, the stop
test needs no root: u(M) >= tau  <=>  E[(u(V) - u(M))+] <= c  (Definitions "Fair-cap value",
"Weitzman's Algorithm").

What changes is the distribution estimate: a peaks-over-threshold GPD fit on the raw rewards
(:mod:`stoppers.robust.gpd_tail`) instead of a shifted exponential on exp(reward) above the
median. Optimism (the "UCB" of UCB Pandora's Box) enters as a widened tail scale
sigma * (1 + z / sqrt(k)) - a confidence schedule that shrinks as exceedances accumulate -
applied both to kappa_hat and to the tail over which the expected gain is integrated. Stopping
too early on a heavy tail is what costs most profit; sampling one more costs only c. A tail the
deployment has learned to be bounded keeps only its fit's ``margin_share`` of both margins
(:meth:`~stoppers.robust.xi_prior.XiPrior.tail_posterior`): past its end there is nothing to
insure against. What such a deployment's posterior still gives open tails is weighed instead: the
test takes the larger of the fit's gain and the gain averaged over the posterior's shapes
(:meth:`TailPandora._averaged`).

Until the tail can be fitted (fewer than two distinct rewards above the threshold) the policy
keeps sampling - unless the ties say the best is the top of the support (stop reason "tied",
:meth:`stoppers.robust.tracker.TailTracker.tied_ceiling`). Rewards all at the deployment's
floor are no point mass: they stop (reason "floor") once the rule of succession bounds one more
draw's gain by the cost (:func:`stoppers.robust.ceiling.floor_gain_bound`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import replace

from stoppers.robust.ceiling import FloorBound, floor_gain_bound
from stoppers.robust.gpd_tail import TailFit
from stoppers.robust.pile import PileBound, PileRule
from stoppers.robust.policy import TailPolicy
from stoppers.robust.prior import TailPrior
from stoppers.robust.tracker import COST_ALL_TIED, cost_all_tied
from stoppers.robust.xi_prior import XiPrior

__all__ = [
    "BOTTOM_PILE_SHARE",
    "HIDDEN_MODE_MASS",
    "TailPandora",
    "default_kappa_z",
    "hidden_mode_draws",
]

# The better mode a fresh deployment's request may hide above every reward it has drawn
# (hidden_mode_draws): its mass, and the share of the request's rewards that must sit at their
# lowest value (a judge's losing answers at the bottom of its scale) for the wait to apply.
HIDDEN_MODE_MASS = 0.05
BOTTOM_PILE_SHARE = 0.2


class TailPandora(TailPolicy):
    """Stop when one more sample's expected acceptance gain is worth less than ``cost``.

    Parameters
    ----------
    cost: price of one sample in utility units (B = 1), > 0.
    alpha: benchmark percentile, in (0, 1).
    min_samples: rewards to see before any stop (default 8, or max_samples if smaller).
    max_samples: hard budget, stop reason "budget".
    kappa_z, scale_z: confidence margins on kappa_hat and on the tail integrated for the gain;
        kappa_z=None picks :func:`default_kappa_z` for the cost. Each fit applies its
        ``margin_share`` of them (1 unless an XiPrior says the tail is bounded).
    xi_z: optimism on the tail shape for the gain: xi + xi_z * (1 + xi) / sqrt(k + w), the
        GPD shape's standard error with w prior pseudo-exceedances (0: off).
    prior: cross-prompt shape prior: a :class:`TailPrior` (pooled xi0) or a learned
        :class:`~stoppers.robust.xi_prior.XiPrior` (posterior mean of xi plus one sd); None uses
        ``TailPrior()``.
    floor: the deployment's established reward floor (:func:`~stoppers.robust.ceiling.floor_of`)
        or None.
    tie_ceiling: stop when the best is tied 3 times above lower rewards (a clip the request
        guesses); False once the deployment's ceiling is established
        (:class:`~stoppers.robust.tracker.BestTies`).
    full_margins: keep both margins whole where the learned xi distribution says the tail is
        bounded (:class:`~stoppers.robust.shape_cost.ShapePandora` sets it where a floor the
        rewards pile up at holds interiors with two clusters: the tail seen may end a losing
        cluster below a winning one not drawn yet).
    pile: the deployment's learned :class:`~stoppers.robust.pile.PileBound`
        (:func:`~stoppers.robust.pile.pile_of`) or None: stop at a repeated best once it bounds
        one more draw's gain by the cost.
    search_min: rewards to draw before the tail fit's test may stop (stop reason "threshold")
        while the request's rewards pile up at their lowest value (``BOTTOM_PILE_SHARE`` of
        them); the other stops keep ``min_samples``.
        :class:`~stoppers.robust.shape_cost.ShapePandora` sets :func:`hidden_mode_draws` where
        the deployment is fresh.
    """

    all_tied = COST_ALL_TIED
    precision_weighted = True
    stops_on_repeats = False
    two_level_cells = True

    def __init__(
        self,
        cost: float,
        *,
        alpha: float = 0.99,
        min_samples: int | None = None,
        max_samples: int | None = None,
        kappa_z: float | None = None,
        scale_z: float = 1.0,
        xi_z: float = 0.0,
        prior: TailPrior | XiPrior | None = None,
        floor: FloorBound | None = None,
        tie_ceiling: bool = True,
        full_margins: bool = False,
        pile: PileBound | None = None,
        search_min: int = 0,
    ) -> None:
        cost = float(cost)
        if not (cost > 0.0 and math.isfinite(cost)):
            raise ValueError(f"cost must be finite and > 0, got {cost!r}")
        if kappa_z is None:
            kappa_z = default_kappa_z(cost)
        self.cost = cost  # before the base builds the pile rule (_pile_rule)
        super().__init__(
            alpha=alpha,
            min_samples=min_samples,
            max_samples=max_samples,
            kappa_z=kappa_z,
            prior=prior,
            floor=floor,
            tie_ceiling=tie_ceiling,
            full_margins=full_margins,
            pile=pile,
        )
        for name, z in (("scale_z", scale_z), ("xi_z", xi_z)):
            if not (z >= 0.0 and math.isfinite(z)):
                raise ValueError(f"{name} must be finite and >= 0, got {z!r}")
        self.all_tied = cost_all_tied(cost)  # a point mass: later the cheaper a draw is
        self.scale_z = float(scale_z)
        self.xi_z = float(xi_z)
        if isinstance(search_min, bool) or not isinstance(search_min, int) or search_min < 0:
            raise ValueError(f"search_min must be an integer >= 0, got {search_min!r}")
        self.search_min = search_min
        self._optimistic: TailFit | None = None
        self._shape_fits: list[tuple[float, TailFit, float]] = []  # (weight, fit, kappa offset)
        self._gain = math.nan

    @property
    def expected_gain(self) -> float | None:
        """E[(u(V) - u(best))+] under the optimistic fit; the policy stops when <= cost."""
        return None if math.isnan(self._gain) else self._gain

    def _on_new_fit(self, fit: TailFit) -> None:
        widen = 1.0 + self._margin_share(fit) * self.scale_z / math.sqrt(fit.k)
        xi_up = fit.xi + self.xi_z * (1.0 + fit.xi) / math.sqrt(fit.k + self.prior.weight)
        self._optimistic = replace(fit, sigma=fit.sigma * widen, xi=min(xi_up, 0.9))
        self._shape_fits = [(w, f, f.kappa_offset(self.alpha)) for w, f in fit.shape_fits()]

    def _test(self, fit: TailFit, *, refresh: bool) -> str | None:
        if refresh:
            assert self._optimistic is not None  # set with the fit
            m = self._tracker.judged_best() - fit.u  # the best on a lattice: tracker docstring
            self._gain = max(self._optimistic.expected_gain(m, self._kappa_off), self._averaged(m))
            lone = self._lone_best_tail()
            if lone is not None:  # the search goes on while either tail says it pays
                self._gain = max(self._gain, lone.expected_gain(0.0, lone.kappa_offset(self.alpha)))
        if self._gain > self.cost:
            return None
        return None if self._n < self.search_min and self._bottom_piles() else "threshold"

    def _bottom_piles(self) -> bool:
        """Do the request's rewards pile up at their lowest value (``BOTTOM_PILE_SHARE`` of
        them, at least two)? What makes the hidden-mode wait apply (:func:`hidden_mode_draws`)."""
        values = self._tracker.sorted
        at_bottom = bisect.bisect_right(values, values[0])
        return at_bottom >= 2 and at_bottom >= BOTTOM_PILE_SHARE * len(values)

    def _averaged(self, m_offset: float) -> float:
        """The gain averaged over the deployment's posterior of this tail's shape (0 without
        one): each shape with its own sigma and benchmark, no margins, the sigma spread over its
        posterior (``xi_prior.SIGMA_NODES``: the gain is a hinge in sigma, and k exceedances
        leave log sigma uncertain by about 1 / sqrt(k), a fifth to a quarter at a cold start).

        Why, beside the margins: the margins shrink to the fit's ``margin_share``, the posterior
        chance of an open tail, and the shape is one point of the posterior. Where a deployment
        has learned bounded tails - the better mode's cluster above a gap of two-mode prompts,
        read as a short tail - a request's benchmark could land on its best while a tenth of
        the posterior still held an open tail, and the search ended well below the benchmark
        (`mixture` prompts at c = 1e-4: acceptance 0.77 after 80 draws, where the open shapes'
        share of the gain was 2e-4). Averaged, those shapes count by their probability: at
        c = 1e-3 that rarely buys a draw, at 1e-4 it does (docs/robust-stopping.md, "The gain
        averaged over the shape posterior").
        """
        return sum(w * f.expected_gain(m_offset, kappa) for w, f, kappa in self._shape_fits)

    def _lone_best_tail(self) -> TailFit | None:
        """The tail above a best that the other rewards' tail cannot explain, else None.

        Why: a judge's rewards often hold a few responses far above the rest (AlpacaEval: one
        model of 49 beats the reference by 8 logits where the others lose by 6). The first of
        them to arrive sits alone above a gap. The fit takes it in, its kappa_hat lands below
        it, and the rule stopped - while the mode that reward opened has an unknown spread
        and may hold the benchmark far higher (each such miss cost about 0.5-1 of acceptance).

        The test: the tail fitted to every reward but the best
        (:meth:`~stoppers.robust.tracker.TailTracker.fit_without_best`) gives n draws a chance
        under 1 - alpha of reaching it. Left out, the best often leaves a bounded fit (xi < 0)
        whose end lies below it - 8-10% of normal and exponential streams of 40 failed the test
        so - and the best itself refutes that bound: such a tail is judged as an exponential one
        with the fit's mean exceedance, sigma / (1 - xi) (the observed one until 2026-11-29,
        when a bounded fit's sigma came to be read from where its exceedances end). The test
        then fires on 0-4% of normal, exponential and
        Gumbel streams of 20-80 rewards, on 7-15% of Student-t (3) and lognormal ones (the cold
        start's prior pulls their shape towards 0).

        Above a lone best the only evidence is exchangeability (the next draw beats it with
        chance 1 / (n + 1)) and the one spacing seen there, the gap: an exponential tail of
        that scale above the best. On a lattice a best one level above the rest is the
        rounding's gap and is left to the cells; a wider gap is tested on the dequantized
        rewards (AlpacaEval's duplicated logits make a fine "lattice" of steps 0.004-0.06, and
        skipping every lattice left 9 of its lone bests to end the search).
        """
        tracker = self._tracker
        values = tracker.sorted
        n, best = len(values), values[-1]
        gap = best - values[-2]
        if gap <= 0.0 or (tracker.step is not None and gap <= 1.5 * tracker.step):
            return None  # on a lattice the next level up is the rounding's gap, not a mode's
        rest = tracker.fit_without_best()
        if rest is None:
            return None
        if rest.xi < 0.0:  # a bound the best itself refutes: exponential, the fit's mean
            rest = replace(rest, sigma=rest.sigma / (1.0 - rest.xi), xi=0.0)
        beats = rest.p_u * rest.excess_survival(best - rest.u)  # one draw beats the best
        if -math.expm1(n * math.log1p(-min(beats, 0.5))) >= 1.0 - self.alpha:
            return None  # n draws reach it often enough: the best belongs to the tail
        return TailFit(u=best, p_u=1.0 / (n + 1), sigma=gap, xi=0.0, k=1)

    def _floor_test(self, n: int) -> bool:
        assert self.floor is not None  # only called at the floor
        return floor_gain_bound(n, self.alpha, self.floor) <= self.cost

    def _pile_rule(self, pile: PileBound) -> PileRule:
        return PileRule(pile, self.alpha, cost=self.cost)


def default_kappa_z(cost: float) -> float:
    """Benchmark margin (standard errors) for a cost: 0.3 at c >= 1e-3, 0.65 at c = 1e-4, <= 1.

    Why it grows as c falls: the smaller the cost, the closer the fair cap sits to utility 1, so
    the rule stops as soon as the best passes kappa_hat - an under-estimated kappa (heavy tails)
    then ends the search early. Measured on the replay families: at c = 1e-4 a margin of 0.3
    left Student-t rewards at 0.96x the best fixed N, 0.65 brought them to ~1.0x at no cost on
    normal rewards; at c = 1e-3 a margin of 1.0 cost normal and mixture rewards 8-15% profit.
    """
    decades = max(0.0, math.log10(1e-3 / cost))
    return min(0.3 + 0.35 * decades, 1.0)


def hidden_mode_draws(cost: float, mass: float = HIDDEN_MODE_MASS) -> int:
    """Draws before a request that knows nothing of its deployment, and whose rewards pile up
    at their lowest value, ends its search on the tail fit: the n at which a better mode of
    ``mass``, above every reward drawn, is worth no more than ``cost`` to look for (77 at
    c = 1e-3, 122 at c = 1e-4 with mass 0.05).

    Why: the tail fit reads only the rewards drawn, and a mode not drawn yet leaves no trace in
    them. Under a two-point prior - no such mode, or one of ``mass`` whose draws beat the
    benchmark (one more draw lifts acceptance by up to 1) - the mode's weight after n draws
    without it is about (1 - mass)^n, and one more draw is worth (1 - mass)^n * mass. A judge's
    rewards hold such modes where most answers lose: on the real pool redrawn, a request with
    no deployment behind it stopped on the fit after a median 48 draws on a prompt with half
    its rewards at the judge's floor and its best 2% near +8 logits, 90% of the rest under
    -5. Only where the rewards pile up at their bottom (``BOTTOM_PILE_SHARE``): on continuous
    and low-temperature shapes the wait cost more than it found (docs/robust-stopping.md,
    "A fresh deployment's hidden modes"). The same two-point prior with a mass of one in ten
    sets the tied wait (:func:`~stoppers.robust.tracker.cost_all_tied`)."""
    return max(1, math.ceil(math.log(cost / mass) / math.log1p(-mass)))
