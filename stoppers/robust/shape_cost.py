"""Cost mode with a deployment-learned reward shape: Weitzman's rule, parameters integrated out.

Why: Weitzman's rule (Definitions "Fair-cap value", "Weitzman's Algorithm") stops at M as soon
as one more sample's expected gain E[(u_kappa(V) - u_kappa(M))+] is <= c. The oracle knows the
prompt's distribution; a request knows only its own few rewards. The prompts of one deployment
share a generator and a reward model, so they share the *shape* of their standardised rewards
z = (v - mean) / sd: a :class:`stoppers.robust.shape_prior.ShapePrior` learns that shape (and
the spread of scales) from finished requests. What is left for one request is its location and
scale, estimated from its own rewards - and their error is what separates a plug-in rule from
the oracle (measured: told the exact normal shape, the plug-in rule earned 0.92 of the oracle's
profit at c = 1e-3, the same rule with the parameters integrated out 0.95-0.96; scratch
harness, 30 prompts x 20 orderings).

So the test here is the posterior-predictive gain: with V = m + s Z (Z from the learned shape)
and the benchmark kappa = m + s z_alpha (Definition "Benchmark Reward": the shape's
alpha-quantile), the gain is averaged over the uncertainty of the true (m, s) given the
request's n rewards - m ~ N(mean, s^2 / n), log s ~ N(posterior mean, 1 / precision), both
widened by ``inflation`` (optimism: stopping early costs more than sampling once more) - on a
5 x 5 Gauss-Hermite grid. The gain of one grid point is a sum over the shape's histogram bins
between the best and kappa, plus the bins past kappa, whose acceptance is exactly 1.

Since 2026-11-26, where the shared-shape tests below do not (yet) trust the recorded shape and the
rewards are continuous (or, since 2026-11-28, rounded with no clip established:
``_clipless_lattice``), the default does not fall back to the cold start once the prior keeps 8
requests' streams: it decides on the shape fitted by likelihood to those streams, with the request's
own m and s integrated out by likelihood rather than by normal-theory moments
(:mod:`stoppers.robust.likelihood_cost`; ``likelihood=False`` restores the cold start). On a
lattice the request's rewards are read as rounding cells and the gain is summed over the levels
(:mod:`stoppers.robust.lattice_gain`, since 2026-11-29). A two-mode
fit needs no shared-shape test: each request's own rewards place it under the pooled shape, which is
what made bimodal prompts with per-prompt mode weights work (docs/robust-stopping.md, "The
likelihood path") - but it needs most of its streams to be bimodal on their own (``TWO_MODE_SHARE``,
2026-11-27): a minority of bimodal prompts among unimodal ones also fits two modes, a blend
(docs/robust-stopping.md, "A two-mode fit must be the deployment's"). A one-mode fit decides only
until a shared-shape test finds the prompts differ (2026-11-27): fitted to prompts of different
families it is a blend that fits none of them (``_untrusted_shape``; docs/robust-stopping.md,
"Heterogeneous continuous deployments"). A fit that keeps a far better mode in its top tenth
decides as a two-mode fit does, before trust and after (2026-12-01: prompts with a rare far mode,
each in its own weight; docs/robust-stopping.md, "A rare far mode decides on the fit"). Where the
tests do trust the shape, the moment path below stays: on exponential rewards it earned more (long
deployments, docs/robust-stopping.md). Where the learned shape may be a blend - a one-mode fit
before trust, any learned shape while the shared-shape tests are early - the cold start runs
alongside and caps the request at ``BLEND_CAP`` times its own stop: the learned shape may search
further than the request's own tail says, not without end.

Until the prior is trusted - ``warm_requests`` requests, 10 / (1 - alpha) pooled draws, and both
shared-shape tests passed - or without a prior, the policy is
:class:`stoppers.robust.cost.TailPandora` (GPD tail, no shape knowledge): the cold start. With a
:class:`~stoppers.robust.cost_prior.CostShapePrior` (the prior, with its shared-shape tests) the
cold start's tail shape comes from the deployment's learned distribution of xi
(:class:`~stoppers.robust.xi_prior.XiPrior`, once it has learned from 8 requests) instead of a
fixed shrinkage to xi = 0: prompts that do not share a standardised shape (bimodal rewards with
per-prompt weights) can still share a kind of tail.
It is the gateway's default cost policy (``stoppers.default_cost_policy``).

Lumpy deployments (2026-12-01): where the cold start would decide and the deployment's kept
streams read as the target tables read them - continuous, light-tailed, lumpy (a judge's
prompts, answers scored alike; :meth:`~stoppers.robust.shape_prior.ShapePrior.lumpy_streams`) -
the request runs the Best-of-N that earns most on the streams read as pseudo-prompts
(:meth:`~stoppers.robust.cost_prior.CostShapePrior.streams_best_of_n`; stop reason ``"fixed"``),
stopping sooner only at the deployment's ceiling or on its floor's bound. Why: on such prompts
the cold start's GPD tail is fitted to a few lumps and a floor, and it stopped both too soon and
too late: on the real pool redrawn to 960 (`ap05`) it earned 0.958 of the best fixed N at
c = 1e-3, while the N read from the kept streams is within a few draws of that best N
(docs/robust-stopping.md, "Cost mode on lumpy streams: the Best-of-N they say pays"). It is read
from the fifth request on: four kept streams,
:data:`~stoppers.robust.cost_prior.STREAMS_N_MIN_STREAMS` ("The streams' Best-of-N from four
requests"). Where the rewards pile up at a floor it is read from smooth streams too: there the
cold start that would decide keeps its margins whole and no fitted shape is in play ("Smooth
streams on a piled floor"), and from two streams once the floor is established
(:data:`~stoppers.robust.cost_prior.STREAMS_N_FLOOR_MIN`, "The streams' Best-of-N from two
streams on a piled floor").

Cost per observation: the gain (~25 x the bins between best and kappa) is recomputed on every
reward while n <= ``EXACT_UNTIL``, later only when the best rises or n has grown by 1/32 since
the last evaluation (the parameters drift slowly); the median observe is a few microseconds.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass

import numpy as np

from stoppers.base import StoppingPolicy
from stoppers.robust.ceiling import (
    FloorBound,
    ceiling_of,
    clipped_floor_of,
    floor_gain_bound,
    floor_of,
)
from stoppers.robust.censored_cost import CensoredGain, CensoredShape
from stoppers.robust.cost import TailPandora, hidden_mode_draws
from stoppers.robust.cost_prior import (
    EARLY_REQUESTS,
    CostShapePrior,
    cost_shape_prior,
    shapes_differ,
)
from stoppers.robust.gpd_tail import acceptance
from stoppers.robust.lattice_gain import lattice_posterior_gain
from stoppers.robust.likelihood_cost import TIED_MAX, FittedShape, evaluation_due, sd_precision
from stoppers.robust.pile import PileRule, pile_of
from stoppers.robust.policy import _default_min_samples
from stoppers.robust.prior import TailPrior
from stoppers.robust.shape_prior import ShapePrior
from stoppers.robust.stop_table import MAX_HORIZON, Z_BINS, Z_HI, Z_LO, scale_prior
from stoppers.robust.tracker import TIES_AT_MAX, BestTies
from stoppers.robust.xi_prior import XiPrior

__all__ = ["CostShape", "LearnedShapeCost", "ShapePandora", "tail_excess"]

_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(5)
_GH_W = _GH_W / _GH_W.sum()
_NODE_X = np.repeat(_GH_X, _GH_X.size)  # location error, in posterior standard deviations
_NODE_Y = np.tile(_GH_X, _GH_X.size)  # log-scale error, in posterior standard deviations
_NODE_W = np.repeat(_GH_W, _GH_W.size) * np.tile(_GH_W, _GH_W.size)
_Z_CENTRES = Z_LO + (np.arange(Z_BINS) + 0.5) * (Z_HI - Z_LO) / Z_BINS

WARM_REQUESTS = 8
INFLATION = 1.0
# The shape's alpha-quantile (the benchmark, Definition "Benchmark Reward") is trusted once the
# pooled draws put this many above it: 10 / (1 - alpha) draws, 1000 at alpha = 0.99. Without
# it, at a budget of 32 samples (<= 8 pooled draws per request) the learned shape lost 0.8-1.9
# points of profit to TailPandora on every family replayed, up to 1.0 at 64 (sequential replay,
# 40 prompts x 100 deployments); with it those keep to TailPandora, and at 960 samples the
# shape is trusted after ~16-24 requests instead of 8 (docs/robust-stopping.md "Budgets").
DRAWS_ABOVE_QUANTILE = 10.0
# A two-mode fit decides before the shape is trusted only where at least this share of its
# streams show two modes on their own (bimodality.two_mode_share): a deployment whose
# prompts all have a better mode, not one where a minority of bimodal prompts bends the fit of
# all (a blend that fits none of them). The share is 0.74-0.89 on mixture streams of 48-96
# rewards, 0.02-0.28 on the unimodal families' (bimodality's docstring); at 0.6, the held-out
# ``mixed-continuous`` seed 7 (a third of its prompts bimodal) went 0.9850 -> 0.9956 at
# c = 1e-3, 24 prompts x 100 deployments (docs/robust-stopping.md "A two-mode fit must be the
# deployment's").
TWO_MODE_SHARE = 0.6
# A one-mode fit decides before the shape is trusted only until a shared-shape test finds the
# prompts differ, and the early tests are noisy: a deployment of different families passes by
# chance, and under the blend its light-tailed requests expect far better rewards than they have (on
# every mixed-continuous draw 0-7, normal requests on the likelihood path drew 280-960 rewards where
# the best fixed N was ~100: 0.05-0.88 of its profit). So on that path the cold start (TailPandora,
# the request's own tail) runs alongside, and the request stops once it has drawn BLEND_CAP times
# the rewards at which the cold start stopped: the learned shape may search further than the
# request's own tail says, not without end. Heterogeneous draws gained 0.16-0.36 point at c = 1e-3,
# single families moved by -0.08 to +0.12 (docs/robust-stopping.md "A cap on a one-mode blend"). The
# trusted shape and two-mode fits pass the early tests by chance too, so while those are early
# (EARLY_REQUESTS) they are capped as well: up to +0.15 point more on the heterogeneous draws and
# mixture (``_may_be_blend``).
BLEND_CAP = 2.0
# A deployment prior taught by fewer requests than this is fresh: its cold start waits
# hidden_mode_draws before it ends a search on the tail fit where the rewards pile up at their
# bottom (_search_min). Three: the floor is established from the third request on
# (ceiling.CEILING_REQUESTS), and the streams' Best-of-N read from two streams on it after.
FRESH_REQUESTS = 3
# The moment path's recorded shape is pooled from draws standardised by their request's running
# mean and sd. That noise, about 0.1-0.2 standard units at 25-100 draws, spreads a hard upper end
# over a tail that is not there: on `reflected-exponential` rewards (end at z = 1) the recorded
# shape put 3.6% of its mass above 1.05, the truth 0.07%, and requests chased it (230 rewards
# each where the best fixed N was 22, 0.80 of its profit, in 120-prompt deployments). A shape
# that fits the rewards puts about one draw's worth of mass above each stream's largest reward,
# n P(Z > z_max) ~ Exp(1), so over S kept streams the mean is 1 +- 1 / sqrt(S); the moment path
# decides only while it stays under 1 + TAIL_EXCESS_Z / sqrt(S). Measured at S = 10 / 20 / 40 /
# 100 kept streams (6 deployments each, seed-0 pools; docs/robust-stopping.md, "Rewards that end
# abruptly"): at most 1.70 / 1.44 / 1.13 / 0.99 on ten open-tailed families, at least 1.20 /
# 1.31 / 1.56 / 1.72 on uniform, sigmoid and reflected gamma and exponential rewards. A two-mode
# fit (mixture: 1.53 at 40) decides on the likelihood path anyway.
TAIL_EXCESS_Z = 2.5


@dataclass(frozen=True)
class CostShape:
    """What the cost rule reads from a :class:`ShapePrior`: the shape and the scale prior.

    ``z`` / ``p``: the occupied histogram bins (centres, probabilities); ``z_alpha``: the
    shape's alpha-quantile; ``above_alpha``: P(Z >= z_alpha); ``sd_precision``: precision of
    log sd per sample, 4 / (kurtosis - 1) (the delta-method variance of a log sample sd);
    ``scale_mu`` / ``scale_precision``: mean and precision of log sd across requests.
    """

    z: np.ndarray
    p: np.ndarray
    z_alpha: float
    above_alpha: float
    sd_precision: float
    scale_mu: float
    scale_precision: float

    @classmethod
    def from_prior(cls, prior: ShapePrior, alpha: float) -> CostShape | None:
        counts = np.asarray(prior.z_counts, dtype=np.float64)
        total = counts.sum()
        scales = np.asarray(prior.s_counts, dtype=np.float64)
        if not (total > 0.0 and scales.sum() > 0.0):
            return None
        keep = counts > 0.0
        z, p = _Z_CENTRES[keep], counts[keep] / total
        cdf = np.cumsum(p)
        i = min(int(np.searchsorted(cdf, alpha)), z.size - 1)
        s_mu, s_precision = scale_prior(scales)
        return cls(
            z=z,
            p=p,
            z_alpha=float(z[i]),
            above_alpha=float(p[i:].sum()),
            sd_precision=sd_precision(z, p),
            scale_mu=s_mu,
            scale_precision=s_precision,
        )

    def expected_gain(self, b: float, s: float, loc_sd: float, log_s_sd: float) -> float:
        """E[(AR(V - kappa) - AR(best - kappa))+] averaged over the parameter grid.

        ``b`` = best - estimated mean, ``s`` = estimated scale; the true mean is off by
        N(0, loc_sd^2), the true log scale by N(0, log_s_sd^2).
        """
        b_j = b - _NODE_X * loc_sd  # best relative to each node's true mean
        s_j = s * np.exp(_NODE_Y * log_s_sd)
        za = self.z_alpha
        d_best = b_j - s_j * za
        e = np.exp(np.minimum(d_best, 0.0))
        base = np.minimum(2.0 * e / (1.0 + e), 1.0)
        # Bins past kappa accept with probability 1; between best and kappa integrate AR.
        gain = self.above_alpha * (1.0 - base)
        z, p = self.z, self.p
        lo = int(np.searchsorted(z, float(np.min(b_j / s_j))))
        hi = int(np.searchsorted(z, za))
        if hi > lo:
            zt = z[lo:hi]
            d = s_j[:, None] * (zt[None, :] - za)
            e = np.exp(d)
            ar = 2.0 * e / (1.0 + e)
            gain = gain + np.maximum(ar - base[:, None], 0.0) @ p[lo:hi]
        return float(_NODE_W @ gain)


def _tail_prior(prior: object) -> TailPrior | XiPrior | None:
    """The cold start's tail-shape prior: a cost prior's learned xi distribution, a
    :class:`TailPrior` as given, else None (fit_tail's fixed shrinkage)."""
    if isinstance(prior, CostShapePrior):
        return prior.xi
    return prior if isinstance(prior, TailPrior) else None


class LearnedShapeCost(StoppingPolicy):
    """What the learned-shape cost policies share (:class:`ShapePandora`,
    :class:`~stoppers.robust.bayes_cost.BayesShapePandora`): argument checks, the
    :class:`TailPandora` cold start, shifted running sums of the rewards and the ceiling rule.
    Subclasses decide when warm in :meth:`_warm_decide`; they call :meth:`_start_cold` when
    their prior is not (yet) trusted. A best at the prior's established ceiling
    (:mod:`stoppers.robust.ceiling`) stops, warm or cold; rewards all at its established floor
    stop once the rule of succession bounds one more draw's gain by the cost."""

    # replay --deployment: how to make a fresh prior per simulated deployment
    deployment_prior = staticmethod(cost_shape_prior)

    def __init__(
        self,
        cost: float,
        *,
        alpha: float,
        min_samples: int | None,
        max_samples: int | None,
        prior: object = None,
    ) -> None:
        super().__init__(max_samples=max_samples)
        cost = float(cost)
        if not (cost > 0.0 and math.isfinite(cost)):
            raise ValueError(f"cost must be finite and > 0, got {cost!r}")
        if not (0.0 < alpha < 1.0):
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        self.cost = cost
        self.alpha = float(alpha)
        self.min_samples = _default_min_samples(min_samples, max_samples)
        self._cold: TailPandora | None = None
        self._shift = 0.0  # first reward: sums of shifted rewards keep the variance exact
        self._ceiling = ceiling_of(prior)
        self._ties = BestTies(enabled=self._ceiling is None)  # a known top replaces the guess
        self._floor = floor_of(prior)
        pile = pile_of(prior)
        self._pile_bound = pile
        self._pile = None if pile is None else PileRule(pile, self.alpha, cost=cost)
        self._full_margins = False  # the cold start's (TailPandora's full_margins)
        self._sum = 0.0
        self._sum_sq = 0.0

    @property
    def uses_learned_prior(self) -> bool:
        """True when the learned shape decides (False: the TailPandora cold start)."""
        return self._cold is None

    def _start_cold(self, prior: object) -> None:
        self._cold = self._cold_start(prior)

    def _cold_start(self, prior: object) -> TailPandora:
        """The cold-start policy this request would run with ``prior``."""
        return TailPandora(
            self.cost,
            alpha=self.alpha,
            min_samples=self.min_samples,
            max_samples=self.max_samples,
            prior=_tail_prior(prior),
            floor=self._floor,
            tie_ceiling=self._ceiling is None,
            full_margins=self._full_margins,
            pile=self._pile_bound,
            search_min=_search_min(prior, self.cost, self.max_samples),
        )

    def _mean_var(self, n: int) -> tuple[float, float]:
        """Mean of the shifted rewards and the sample variance (n >= 2)."""
        mean = self._sum / n
        return mean, (self._sum_sq - n * mean * mean) / (n - 1)

    def _decide(self, reward: float) -> str | None:
        if self._best == self._ceiling and self._n >= self.min_samples:
            return "ceiling"  # the top of the deployment's reward scale: nothing can beat it
        cold = self._cold
        if cold is not None:
            stop = cold.observe(reward)
            return cold.stop_reason if stop and cold.stop_reason != "budget" else None
        n = self._n
        if n == 1:
            self._shift = reward
        x = reward - self._shift
        self._sum += x
        self._sum_sq += x * x
        self._ties.note(reward)
        pile = self._pile
        if pile is not None:
            pile.note(reward)
        if n < self.min_samples:
            return None
        floor = self._floor
        if floor is not None and self._best == floor.value:  # every reward at the bottom
            return "floor" if floor_gain_bound(n, self.alpha, floor) <= self.cost else None
        if pile is not None and pile.stops():
            return "repeated"  # the deployment's repeated bests were its prompts' tops (pile)
        ties = self._ties
        sd = 0.0
        if ties.count >= TIES_AT_MAX:  # the pile-up test's spread, only where it can run
            sd = math.sqrt(max(self._mean_var(n)[1], 0.0))
        if ties.ceiling(self._shift + self._sum / n, self._best, sd):
            return "tied"  # the best piled up above lower rewards: a clip (BestTies)
        return self._warm_decide(n)

    @abstractmethod
    def _warm_decide(self, n: int) -> str | None:
        """The stop reason once warm, past min_samples and the ceiling rule (None: go on)."""


class ShapePandora(LearnedShapeCost):
    """Weitzman's rule with the deployment's learned shape (cold start: :class:`TailPandora`).

    Parameters
    ----------
    cost: price of one sample in utility units (B = 1), > 0.
    alpha: benchmark percentile, in (0, 1).
    min_samples: rewards to see before any stop (default 8, or max_samples if smaller).
    max_samples: hard budget, stop reason "budget".
    prior: the deployment's :class:`ShapePrior` (``new_deployment_prior("cost")``, a
        :class:`CostShapePrior`, whose learned xi distribution the cold start reads); a
        :class:`TailPrior` or None gives the cold-start policy.
    warm_requests: requests the prior must have learned from before its shape is trusted.
    inflation: factor on the parameters' posterior standard deviations (optimism; the
        moment path only).
    likelihood: where the prompts do not (yet) pass the shared-shape tests and the rewards
        are continuous, decide on the shape fitted by likelihood with the request's location
        and scale integrated out by likelihood (:mod:`stoppers.robust.likelihood_cost`) once
        the prior keeps ``LIKELIHOOD_MIN_REQUESTS`` streams, instead of the cold start: a
        two-mode fit where ``TWO_MODE_SHARE`` of its streams are bimodal on their own; a
        one-mode fit only until a shared-shape test finds the prompts differ. False: the
        policy of 2026-11-25 (the recorded shape with moment errors where the prompts pass
        the shared-shape tests, else the cold start).

    Where the learned shape may be a blend (``_may_be_blend``: a one-mode fit before trust,
    any learned shape in the first ``EARLY_REQUESTS``), the cold start runs alongside and the
    request stops by ``BLEND_CAP`` times the rewards at which the cold start stopped.
    """

    def __init__(
        self,
        cost: float,
        *,
        alpha: float = 0.99,
        min_samples: int | None = None,
        max_samples: int | None = None,
        prior: ShapePrior | TailPrior | None = None,
        warm_requests: int = WARM_REQUESTS,
        inflation: float = INFLATION,
        likelihood: bool = True,
    ) -> None:
        super().__init__(
            cost, alpha=alpha, min_samples=min_samples, max_samples=max_samples, prior=prior
        )
        if not (inflation > 0.0 and math.isfinite(inflation)):
            raise ValueError(f"inflation must be finite and > 0, got {inflation!r}")
        self.inflation = float(inflation)
        shape = fitted = None
        reading = _censored_reading(prior, self._floor) if likelihood else None
        # the floor read as censoring: the gain on the rewards above it (censored_cost), where
        # the interiors share a shape, or as cutting one latent shape (latent_shape) where the
        # streams say so; elsewhere on such a floor the cold start decides with its margins
        # whole (TailPandora's full_margins; see _floor_piles_up)
        censored = reading if reading is not None and (reading.shared or reading.cut) else None
        self._full_margins = censored is None and _floor_piles_up(prior, self._floor)
        self._censored = None if censored is None else CensoredGain(censored, self.alpha)
        self._prior = prior  # a reward under the floor hands the request to the cold start
        if censored is None:
            shape, fitted = _learned_shape(prior, warm_requests, self.alpha, likelihood)
        if fitted is not None:
            assert isinstance(prior, CostShapePrior)
            self._z_alpha = fitted.quantile(self.alpha)
            self._scale_prior = scale_prior(prior.s_counts)
            self._seen: list[float] = []
        # rounded scores: the gain is summed over the lattice's levels (lattice_gain)
        self._step = _clipless_lattice(prior) if fitted is not None else None
        self.fitted_shape = fitted
        self.shape = shape
        if shape is None and fitted is None and censored is None:
            self._start_cold(prior)
        # where the cold start would decide on a deployment whose kept streams read lumpy, the
        # Best-of-N they say earns most decides instead (module docstring)
        self._streams_n: int | None = None
        if self._cold is not None and isinstance(prior, CostShapePrior):
            self._streams_n = prior.streams_best_of_n(
                self.cost,
                min_samples=self.min_samples,
                horizon=min(self.max_samples or MAX_HORIZON, MAX_HORIZON),
                alpha=self.alpha,
            )
        # the cold start runs alongside and caps the request (BLEND_CAP) where a learned shape
        # decides that may be a blend: the censored reading's one-mode interior always may
        blend = censored is not None or _may_be_blend(prior, fitted, shape)
        self._shadow = self._cold_start(prior) if blend else None
        self._shadow_stop: int | None = None
        self._eval_n = 0
        self._eval_best = -math.inf
        self._gain = math.nan
        self._kappa = math.nan

    @property
    def warm(self) -> bool:
        """True when the learned shape decides (False: the cold-start TailPandora)."""
        return self._cold is None

    @property
    def streams_n(self) -> int | None:
        """The Best-of-N this request runs in place of the cold start, read from the kept
        streams (None: a rule decides)."""
        return self._streams_n

    @property
    def censored(self) -> bool:
        """True when the floor read as censoring decides (:mod:`stoppers.robust.censored_cost`)."""
        return self._censored is not None

    @property
    def floor_cuts(self) -> bool:
        """True when the floor read as cutting one latent shape decides
        (:mod:`stoppers.robust.latent_shape`)."""
        return self._censored is not None and self._censored.shape.cut

    @property
    def expected_gain(self) -> float | None:
        """The last posterior-predictive gain computed (None before the first)."""
        if self._cold is not None:
            return self._cold.expected_gain
        return None if math.isnan(self._gain) else self._gain

    @property
    def threshold(self) -> float | None:
        """kappa_hat = mean + scale * z_alpha at the last evaluation."""
        if self._cold is not None:
            return self._cold.threshold
        return None if math.isnan(self._kappa) else self._kappa

    @property
    def acceptance_estimate(self) -> float | None:
        kappa = self.threshold
        return None if kappa is None else acceptance(self._best - kappa)

    def _decide(self, reward: float) -> str | None:
        if self._streams_n is not None:
            return self._streams_decide()
        if self.fitted_shape is not None:
            self._seen.append(reward)
        censored = self._censored
        if censored is not None:
            censored.note(reward)
            if reward < censored.shape.floor:  # not a floor after all: the cold start decides
                self._censored = None
                self._start_cold(self._prior)
                assert self._cold is not None
                for seen in censored.rewards[:-1]:
                    self._cold.observe(seen)
        shadow = self._shadow
        if shadow is not None and self._shadow_stop is None and shadow.observe(reward):
            self._shadow_stop = self._n
        reason = super()._decide(reward)
        stopped = self._shadow_stop
        if reason is None and stopped is not None and self._n >= BLEND_CAP * stopped:
            return "threshold"  # the cold start's own rule, BLEND_CAP times over
        return reason

    def _streams_decide(self) -> str | None:
        """Best-of-``streams_n``, but a best at the deployment's ceiling, or rewards all at its
        floor once its bound says one more draw gains less than it costs, stop sooner, as on the
        other paths."""
        n = self._n
        if n < self.min_samples:
            return None
        if self._best == self._ceiling:
            return "ceiling"
        floor = self._floor
        all_at_floor = floor is not None and self._best == floor.value
        if all_at_floor and floor_gain_bound(n, self.alpha, floor) <= self.cost:
            return "floor"
        assert self._streams_n is not None
        return "fixed" if n >= self._streams_n else None

    def _warm_decide(self, n: int) -> str | None:
        if not evaluation_due(n, self._best, self._eval_n, self._eval_best):
            return "threshold" if self._gain <= self.cost else None
        censored = self._censored
        if censored is not None:
            if censored.above == 0:
                return None  # the floor rule decides while every reward is at the floor
            self._gain, self._kappa = censored.gain(self._best)
            self._eval_n = n
            self._eval_best = self._best
            return "threshold" if self._gain <= self.cost else None
        fitted = self.fitted_shape
        if fitted is not None:
            if self._step is None and not self._mean_var(n)[1] > 0.0:
                return None  # all tied so far: no scale to judge the best against yet
            if self._step is not None:  # all tied too: one cell, its scale from the prior
                self._gain, self._kappa = lattice_posterior_gain(
                    fitted,
                    np.asarray(self._seen),
                    self._best,
                    self.alpha,
                    self._step,
                    *self._scale_prior,
                )
            else:
                self._gain, self._kappa = fitted.posterior_gain(
                    np.asarray(self._seen), self._best, self._z_alpha, *self._scale_prior
                )
            self._eval_n = n
            self._eval_best = self._best
            return "threshold" if self._gain <= self.cost else None
        mean, var = self._mean_var(n)
        if not var > 0.0:
            return None  # all tied so far: no scale to judge the best against yet
        shape = self.shape
        assert shape is not None
        w = shape.sd_precision * (n - 1)
        precision = shape.scale_precision + w
        log_s = (shape.scale_precision * shape.scale_mu + w * 0.5 * math.log(var)) / precision
        s = math.exp(log_s)
        b = self._best - self._shift - mean
        infl = self.inflation
        self._gain = shape.expected_gain(b, s, infl * s / math.sqrt(n), infl / math.sqrt(precision))
        self._kappa = self._shift + mean + s * shape.z_alpha
        self._eval_n = n
        self._eval_best = self._best
        return "threshold" if self._gain <= self.cost else None


def _search_min(prior: object, cost: float, max_samples: int | None) -> int:
    """The draws a cold start waits before its tail fit may end the search where the request's
    rewards pile up at their bottom (:meth:`TailPandora._bottom_piles`): while the deployment
    prior is fresh (taught by fewer than ``FRESH_REQUESTS`` requests),
    :func:`~stoppers.robust.cost.hidden_mode_draws` capped at the budget; else 0.

    Why only there: the wait is what a deployment pays once, on its first requests, before its
    kept streams say whether its prompts hide better modes. Without a prior (a gateway that
    learns nothing, ``PANDORA_LEARN_PRIOR=false``) every request would pay it, and at a budget
    under the wait no request would save a generation."""
    if not isinstance(prior, ShapePrior) or prior.requests >= FRESH_REQUESTS:
        return 0
    wait = hidden_mode_draws(cost)
    return wait if max_samples is None else min(wait, max_samples)


def _learned_shape(
    prior: object, warm_requests: int, alpha: float, likelihood: bool
) -> tuple[CostShape | None, FittedShape | None]:
    """(recorded shape for the moment path, likelihood shape) a request decides on; both None:
    the cold start."""
    shape = fitted = None
    if _trusted(prior, warm_requests, alpha):
        if likelihood:
            fitted = _trusted_likelihood_shape(prior)
        if fitted is None:
            shape = CostShape.from_prior(prior, alpha)  # type: ignore[arg-type]
            if likelihood and shape is not None and tail_excess(prior, shape):
                fitted, shape = _continuous_shape(prior), None  # None: the cold start
    elif likelihood:
        fitted = _untrusted_shape(prior)
    return shape, fitted


def _floor_piles_up(prior: object, floor: FloorBound | None) -> bool:
    """Do the deployment's continuous rewards pile up at ``floor``, the floor this request starts
    with (:meth:`ShapePrior.piled_floor`)? There the cold start keeps its confidence margins
    whole, where a learned bounded tail would drop them (``XiPrior.margin_share``): the tail a
    request sees above such a floor may end a losing cluster below a winning one it has not
    drawn (the AlpacaEval judge: its interiors are two-mode on their own). Measured in
    deployments of 24 prompts at c = 1e-3 / 1e-4 (docs/robust-stopping.md, "Cost mode reads
    the floor as censoring"): the pool redrawn to 960 went 0.934 / 0.945 -> 0.956 / 0.980 of
    the best fixed N, and the judge family's cold-start requests earned more as well."""
    if not isinstance(prior, ShapePrior) or floor is None:
        return False
    piled = prior.piled_floor()
    return piled is not None and piled.value == floor.value


def _censored_reading(prior: object, floor: FloorBound | None) -> CensoredShape | None:
    """The prior's censored reading (:meth:`CostShapePrior.censored_shape`) where its floor is
    read as censoring and is the floor this request starts with, else None."""
    if not isinstance(prior, CostShapePrior) or floor is None:
        return None
    censored = prior.censored_shape()
    return censored if censored is not None and censored.floor == floor.value else None


def tail_excess(prior: object, shape: CostShape) -> bool:
    """Does the recorded ``shape`` put more mass above the kept streams' largest rewards than
    they allow (``TAIL_EXCESS_Z``)? Then a hard upper end has been smeared into a tail, and the
    likelihood path - each request placed by its own rewards under the fitted shape - decides
    instead of the moment path. Only for continuous deployments: a lattice's or a clip's ties
    are read by their own rules."""
    if not isinstance(prior, CostShapePrior) or prior.tied_streams() > TIED_MAX:
        return False
    n, z_max = prior.stream_maxima()
    if n.size < 2:
        return False
    above = np.cumsum(shape.p[::-1])[::-1]  # P(Z >= each occupied bin centre)
    at = np.searchsorted(shape.z, z_max, side="right")
    tail = np.where(at < shape.z.size, above[np.minimum(at, shape.z.size - 1)], 0.0)
    return float(np.mean(n * tail)) > 1.0 + TAIL_EXCESS_Z / math.sqrt(n.size)


def _continuous_shape(prior: object) -> FittedShape | None:
    """The prior's likelihood shape if it has one and its streams are continuous or on a
    lattice without a clip (:func:`_clipless_lattice`), else None."""
    if not isinstance(prior, CostShapePrior) or not np.asarray(prior.s_counts).sum() > 0.0:
        return None
    if prior.tied_streams() > TIED_MAX and _clipless_lattice(prior) is None:
        return None  # checked first: a clipped deployment never asks for a fit
    return prior.fitted_shape()


def _clipless_lattice(prior: CostShapePrior) -> float | None:
    """The lattice's step where the deployment scores on a lattice (integer or rounded ratings,
    :meth:`~stoppers.robust.shape_prior.ShapePrior.lattice_step`) with no ceiling established,
    else None. Such rewards are a smooth shape rounded, which the likelihood path reads once the
    shape is fitted dequantized; a clip's point mass is not (the cold start and the ceiling rule
    decide there). Measured (docs/robust-stopping.md, "Cost mode learns the shape of rounded
    scores"): rounded at 1.0, 1.008 -> 1.021 of the best fixed N at c = 1e-3; the clipped pools
    unchanged, where letting them in had cost clipped 1.010 -> 1.000 at 1e-4.

    A floor closes the path only where a request has piled up at it (``clipped_floor_of``, as
    a ceiling must; since 2026-11-29). The lowest level of a coarse lattice is reached by three
    requests as easily as a clip: with any established floor closing it, rounded at 2.0 (seed 7)
    ran 1,443 of 2,400 requests on the cold start, 0.972 of the best fixed N at 1e-3
    (docs/robust-stopping.md, "The floor does not close the lattice path"). With no floor read,
    AlpacaEval - a judge's continuous logits whose duplicates made a 0.016 "lattice" in some
    deployments, over a clip that holds most of its responses - went to the lattice path until
    its ceiling was established and lost 0.9984 -> 0.9963 of the best fixed N at 1e-3, 1.0000
    -> 0.9978 at 1e-4 (120 prompts; docs/robust-stopping.md, "A floor that piles up is a
    clip"). The floor rule itself ends requests whose rewards all sit at any established
    floor."""
    step = prior.lattice_step()
    if step is None or ceiling_of(prior) is not None or clipped_floor_of(prior) is not None:
        return None
    return step


def _trusted_likelihood_shape(prior: object) -> FittedShape | None:
    """The prior's likelihood shape where the moment path misreads it even once trusted, else
    None; there the likelihood path decides instead.

    - More than one mode: the moment errors (m ~ N(mean, s^2/n)) mislead however well the
      recorded shape is trusted - the sd mixes the modes. Measured (docs/robust-stopping.md
      "Two modes"; ``loss_report --by path``): in 24-prompt mixture deployments the requests
      whose recorded shape was trusted earned 0.893 of the best fixed N at c = 1e-3 on the
      moment path, the likelihood path's requests 1.012.
    - A tail the kept streams end (``FittedShape.ended``: rewards with a hard upper end): the
      recorded shape smears the end into a tail (each draw standardised by its request's
      running mean and sd), and ``tail_excess`` catches only the abrupt ends. In 120-prompt
      deployments at c = 1e-3 the trusted shape still decided on 185-206 requests of `uniform`
      and `reflected-gamma`, earning 0.947-0.956 of the best fixed N, where the likelihood path
      earned 0.999-1.001 (docs/robust-stopping.md, "A shape's end read from the streams").
    - A far better mode in the top tenth (``FittedShape.tail_mode``), for the first reason: in
      120-prompt `rare-mode` deployments (x 5) the pool went 1.0368 -> 1.0526 of the best fixed
      N at c = 1e-3 (docs/robust-stopping.md, "A rare far mode decides on the fit").
    """
    fitted = _continuous_shape(prior)
    if fitted is None:
        return None
    return fitted if fitted.modes > 1 or fitted.ended or fitted.tail_mode else None


def _untrusted_shape(prior: object) -> FittedShape | None:
    """Before the recorded shape is trusted, the likelihood shape the request decides on: a
    two-mode fit where most of its streams show two modes on their own (prompts that differ in
    the weight of a better mode share its modes; ``TWO_MODE_SHARE``), a fit that keeps a better
    mode in its top tenth (``FittedShape.tail_mode``: the same, for a rare far mode), a one-mode
    fit only where the shared-shape tests have not found the prompts to differ.

    The far mode: on `rare-mode` (1-5% of each prompt's answers five sds up) the shared-shape
    tests reject the deployment, and the cold start stops before the mode shows on a tenth of
    its requests. Deciding on the fit, in 120-prompt deployments (x 5) the pool went 0.9996 /
    0.9726 -> 1.0368 / 0.9984 of the best fixed N at c = 1e-3 / 1e-4 (docs/robust-stopping.md,
    "A rare far mode decides on the fit").

    A two-mode fit none of whose streams has ``bimodality.MIN_REWARDS`` (24) rewards - a small
    sample budget - cannot be tested (its share is None) and decides as before the test.

    A one-mode fit to prompts of different shapes is a blend whose tail fits none of them, and a
    request's own rewards move only its location and scale under it: on a deployment of normal,
    Gumbel, skew-normal, Student-t, exponential and two-mode prompts (``mixed`` without its clipped
    prompts) normal requests drew 266 rewards and two-mode ones 539 where the best fixed N was 106,
    0.85 of that N's profit at c = 1e-3 against 1.00 for the cold start (docs/robust-stopping.md
    "Heterogeneous continuous deployments"). There the cold start decides."""
    fitted = _continuous_shape(prior)
    if fitted is None:
        return None
    if fitted.modes > 1:
        share = fitted.two_mode_share
        return fitted if share is None or share >= TWO_MODE_SHARE else None
    if prior.tied_streams() > TIED_MAX:
        # a lattice (_continuous_shape): the shared-shape tests read each prompt's levels, which
        # fall at its own standardised places, as a shape of its own; the blend cap still runs
        return fitted
    if fitted.tail_mode:
        # a far better mode in the top tenth, a few percent of each prompt's answers in a weight
        # of its own: the shared-shape tests read the weights as different shapes, as they do a
        # two-mode fit's, and the cold start stops before the mode shows; the blend cap runs
        return fitted
    return None if shapes_differ(prior) else fitted


def _may_be_blend(prior: object, fitted: FittedShape | None, shape: CostShape | None) -> bool:
    """Is the learned shape a request decides on possibly a blend of different prompts' shapes,
    so that the cold start should cap it (``BLEND_CAP``)? A one-mode fit before trust always is; any
    learned shape (trusted, or a two-mode fit) while the shared-shape tests are early and noisy
    (``EARLY_REQUESTS``) may be. Capped for the whole deployment, the long mixture and Student-t
    deployments lost 0.26 / 0.13 point at c = 1e-3 (docs/robust-stopping.md "A cap on a one-mode
    blend")."""
    if fitted is None and shape is None:
        return False  # the cold start decides: nothing learned to cap
    if fitted is not None and fitted.modes == 1:
        return True
    return isinstance(prior, CostShapePrior) and prior.shape_requests < EARLY_REQUESTS


def _trusted(prior: object, warm_requests: int, alpha: float = 0.99) -> bool:
    """Has ``prior`` learned a shape from enough requests and draws, and do they share it?"""
    if isinstance(prior, CostShapePrior):
        if prior.shape_requests < warm_requests:
            return False
        if prior.tail_draws < DRAWS_ABOVE_QUANTILE / (1.0 - alpha):
            return False
        return prior.shape_dispersion is not None and not shapes_differ(prior)
    return isinstance(prior, ShapePrior) and prior.requests >= warm_requests
