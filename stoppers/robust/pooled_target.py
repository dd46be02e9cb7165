"""Target mode with a deployment prior: deliver the asked acceptance at the fewest samples.

Why: with the prompt's distribution known, the cheapest rule whose kept reward has mean
acceptance ``t`` stops at the first reward whose standardised value (v - mean) / scale reaches
z_star(scale, t) (:mod:`stoppers.robust.shape_prior`). One request cannot know its tail, but a
deployment can: the :class:`~stoppers.robust.shape_prior.ShapePrior` the gateway keeps per model
supplies z_star, a prior on the scale and a Monte Carlo correction of the small-sample bias.
Per observation this policy updates a running mean and variance (Welford), shrinks its log sd
towards the learned scales, and compares (best - mean) / scale with the tabulated threshold:
a few float operations, no fit.

Multimodal shapes: where the deployment's fitted shape has more than one mode (a bulk and a
better mode) the mean and sd mix the modes, and the request decides instead with
:class:`~stoppers.robust.multiplier_target.MultiplierTargetRule` - its location and scale
integrated out by likelihood, a Lagrange multiplier per posterior node, no Monte Carlo offset
(docs/robust-stopping.md, "Target mode on a deployment") - unless the streams end the shape's
upper tail: a flat top that ends (uniform rewards) fits with bumps, and is no better mode
(:meth:`~stoppers.robust.shape_prior.ShapePrior.multimodal_shape`).

Prompts that each hold their own few lumps (answers that agree, a judge's levels): where the
deployment's kept streams read so (:attr:`~stoppers.robust.stream_bootstrap.StreamPrompts.lumpy`)
and its tails light, the table is calibrated on streams drawn from them
(:func:`~stoppers.robust.shape_prior.streams_calibrated`): its rule's offset, its Best-of-N and
the cap that ends either rule's run (docs/robust-stopping.md, "Lumps: the table calibrated on
the streams"). Where the tails read heavy the kernels would place a heavy tail's benchmark too
low, and the smooth shape's table stays, capped. Prompts whose one better answer comes back now
and then, scored alike, on a smooth bulk read so too: their streams' tops cluster
(docs/robust-stopping.md, "A top answer scored alike: the streams read in target mode").

Best-of-N where the table rule does not pay: where the table's own simulation finds that its rule
draws about as many rewards as the Best-of-N that delivers the same (``StopTable.fixed_n``,
:func:`~stoppers.robust.stop_table.fixed_n_for`; rewards with a hard upper end), a request the
table rule would decide draws that N - the N that delivers the target on the simulated streams -
and stops (reason ``"fixed"``). The multiplier rule is not simulated, so where it decides it
keeps deciding. The simulation's Best-of-N also ends either rule's run: at ``TABLE_CAP_FACTOR``
(2) times it on the plain table, at it on the censored one (``cap``, reason ``"fixed"``).

A floor the rewards pile up at (a judge's clipped scores): where the prior builds a
:class:`~stoppers.robust.floor_table.FloorTable` (:meth:`ShapePrior.censoring_floor`), the request
runs the table rule on its rewards above the floor - their mean, sd and best, the threshold read
at its posterior share of rewards above the floor - with the floor rule for a request all at
the floor and the table's Best-of-N as its last draw (docs/robust-stopping.md, "The floor read
as censoring"). Where the kept streams read as one latent shape cut at the floor (a Tobit), the
table's interiors are that shape's upper tails (:mod:`stoppers.robust.cut_interior`). Until the
censored table can be built (too few kept interiors), or while the newest table predates it,
the request runs the cold start: the plain table's shape holds the pile, and on a Tobit
deployment (`floored --loc-mean -2`, sd 1) the prompts with few rewards at the floor ran to the
budget on it (docs/robust-stopping.md, "The cut read in target mode").

Cold start: until the prior has learned from ``cold_start`` requests, the request is delegated
to :class:`~stoppers.robust.target.TailTargetAcceptance` (its own GPD tail fit), with the tail
shape of the deployment's earlier requests (the prior's ``xi``, as cost mode's cold start since
2026-11-25): on requests 3-10 of a deployment of seed-0 pools it moved the delivered acceptance
towards the target on both sides - less on bimodal, normal and clipped prompts, which
over-deliver, more on Student-t, lognormal and Gumbel ones, which under-deliver
(docs/robust-stopping.md, "The cold start learns the deployment's tail shapes").

The table comes from ``prior.table(...)``: built here when missing or stale (~0.1-0.3 s, offline
replay), unless the prior has a ``schedule_build`` hook (the gateway) - then the newest cached
table is used, stale or not, and with none yet the request runs the cold-start policy while the
table is built on the gateway's worker thread.
"""

from __future__ import annotations

import math

import numpy as np

from stoppers.base import StoppingPolicy
from stoppers.robust.ceiling import ceiling_of, floor_acceptance_bound, floor_of
from stoppers.robust.floor_table import AbovePosterior, FloorTable
from stoppers.robust.gpd_tail import acceptance
from stoppers.robust.likelihood_cost import evaluation_due
from stoppers.robust.multiplier_target import MultiplierTargetRule
from stoppers.robust.pile import PileRule, pile_of
from stoppers.robust.policy import _default_min_samples
from stoppers.robust.shape_prior import ShapePrior
from stoppers.robust.stop_table import MAX_HORIZON, StopTable, scale_prior
from stoppers.robust.target import TailTargetAcceptance
from stoppers.robust.tracker import BestTies

__all__ = ["COLD_START", "PooledTargetAcceptance"]

COLD_START = 10


class PooledTargetAcceptance(StoppingPolicy):
    """Stop once (best - mean) / scale reaches the deployment's calibrated threshold.

    Parameters
    ----------
    target: acceptance rate to deliver, in (0, 1].
    prior: the deployment's :class:`ShapePrior` (None: always the cold-start policy).
    alpha: benchmark percentile (Definition "Benchmark Reward").
    min_samples: rewards to see before any stop (default 8, or max_samples if smaller).
    max_samples: hard budget, stop reason "budget".
    cold_start: requests the prior must have learned from before its table is trusted.
    multimodal: where the prior's fitted shape has more than one mode, decide with the
        multiplier rule (module docstring); False: the table rule everywhere (the policy
        before 2026-11-26).
    """

    def __init__(
        self,
        target: float,
        *,
        prior: ShapePrior | None = None,
        alpha: float = 0.99,
        min_samples: int | None = None,
        max_samples: int | None = None,
        cold_start: int = COLD_START,
        multimodal: bool = True,
    ) -> None:
        target = float(target)
        if not (0.0 < target <= 1.0):
            raise ValueError(f"target must be in (0, 1], got {target!r}")
        if not (0.0 < alpha < 1.0):
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        super().__init__(max_samples=max_samples)
        self.target = target
        self.alpha = float(alpha)
        self.min_samples = _default_min_samples(min_samples, max_samples)
        self.prior = prior
        self._table: StopTable | None = None
        self._fallback: TailTargetAcceptance | None = None
        if prior is not None and prior.requests >= cold_start:
            horizon = min(max_samples or MAX_HORIZON, MAX_HORIZON)
            self._table = prior.table(
                target, min_samples=self.min_samples, horizon=horizon, alpha=self.alpha
            )
        self._floor = floor_of(prior)
        pile = pile_of(prior)
        self._pile = None if pile is None else PileRule(pile, self.alpha, target=self.target)
        # a floor the deployment's rewards pile up at: the censored rule (module docstring)
        self._censored: FloorTable | None = None
        self._p_above: AbovePosterior | None = None  # its posterior of P(above the floor)
        if isinstance(self._table, FloorTable):
            table, self._table = self._table, None
            if self._floor is not None and self._floor.value == table.floor:
                self._censored = table
                self._p_above = AbovePosterior(table.log_g)
            # else a cached table for a floor the deployment has since gone below (the gateway
            # uses stale tables while the new one is built): the cold start, until it is
        elif self._table is not None and prior is not None and prior.piled_floor() is not None:
            # a floor the rewards pile up at, before the censored table can be built (too few
            # interiors) or while the newest table predates it: the plain table's shape holds
            # the pile, and prompts with few rewards at the floor ran to the budget on it (module
            # docstring): the cold start, until the censored table is there
            self._table = None
        self._multiplier: MultiplierTargetRule | None = None
        if self._table is not None and multimodal:
            assert prior is not None
            shape = prior.multimodal_shape()
            if shape is not None:
                scale_mu, scale_precision = scale_prior(prior.s_counts)
                self._multiplier = MultiplierTargetRule(
                    shape,
                    target,
                    alpha=self.alpha,
                    scale_mu=scale_mu,
                    scale_precision=scale_precision,
                )
        # Best-of-N where the table finds its rule does not pay, and as the rule's last draw
        # (module docstring)
        self._fixed_n: int | None = None
        self._cap: int | None = None
        if self._table is not None:
            self._cap = self._table.cap
            if self._multiplier is None:
                self._fixed_n = self._table.fixed_n
        elif self._censored is not None:
            self._cap = self._censored.cap
            self._fixed_n = self._censored.fixed_n
        self._seen: list[float] = []  # the rewards, kept for the multiplier rule only
        self._eval_n = 0
        self._eval_best = -math.inf
        self._margin = math.inf
        self._accepted = math.nan  # the multiplier rule's posterior acceptance of the best
        if self._table is None and self._censored is None:
            self._fallback = TailTargetAcceptance(
                target,
                alpha=alpha,
                min_samples=self.min_samples,
                floor=self._floor,
                prior=None if prior is None else prior.xi,
                pile=pile,
            )
        self._mean = 0.0  # of the rewards above the floor on the censored rule
        self._m2 = 0.0
        self._above = 0  # the censored rule's rewards above the floor
        self._scale = math.nan
        self._ties = BestTies(repeats_alpha=self.alpha, repeats_target=self.target)
        self._ceiling = ceiling_of(prior)

    deployment_prior = ShapePrior  # what sequential replay / the gateway keeps for this policy

    @property
    def cold(self) -> bool:
        """True while the request runs the cold-start policy (prior not yet trusted)."""
        return self._fallback is not None

    @property
    def uses_learned_prior(self) -> bool:
        """True when the learned table decides (False: the cold start)."""
        return self._fallback is None

    @property
    def multimodal(self) -> bool:
        """True when the multiplier rule decides (the deployment's shape has several modes)."""
        return self._multiplier is not None

    @property
    def fixed_n(self) -> int | None:
        """The Best-of-N this request runs instead of a stopping rule (None: a rule decides)."""
        return self._fixed_n

    @property
    def cap(self) -> int | None:
        """The rule's last draw: a multiple of the table's Best-of-N (None: the budget)."""
        return self._cap

    @property
    def acceptance_estimate(self) -> float | None:
        """The multiplier rule's posterior mean acceptance of the best at its last evaluation
        (None on the table rule and the cold start, as before)."""
        return None if math.isnan(self._accepted) else self._accepted

    @property
    def threshold(self) -> float | None:
        """The reward the best must reach to stop now (None before min_samples / when cold, and
        on the multiplier rule, which has no single threshold)."""
        if self._fallback is not None:
            return self._fallback.threshold
        if self._multiplier is not None or math.isnan(self._scale):
            return None
        log_s = math.log(self._scale)
        if self._censored is not None:
            assert self._p_above is not None
            p = self._p_above.mean
            return self._mean + self._scale * self._censored.threshold(log_s, p, self._above)
        assert self._table is not None
        return self._mean + self._scale * self._table.threshold(log_s, self._n)

    def _decide(self, reward: float) -> str | None:
        if self._near_ceiling():
            return "ceiling"  # within the target's reach of the top of the reward scale
        if self._fallback is not None:
            return self._fallback.stop_reason if self._fallback.observe(reward) else None
        if self._censored is not None:
            return self._censored_decide(reward)
        n = self._n
        if self._multiplier is not None:
            self._seen.append(reward)
        self._ties.note(reward)
        pile = self._pile
        if pile is not None:
            pile.note(reward)
        delta = reward - self._mean
        self._mean += delta / n
        self._m2 += delta * (reward - self._mean)
        if n < self.min_samples:
            return None
        if self._floor is not None and self._best == self._floor.value:  # all at the bottom
            accepted = floor_acceptance_bound(n, self.alpha, self._floor)
            return "floor" if accepted >= self.target else None
        if pile is not None and pile.stops():
            return "repeated"  # the deployment's repeated bests were its prompts' tops (pile)
        sd = math.sqrt(self._m2 / (n - 1)) if n > 1 and self._m2 > 0.0 else 0.0
        if self._ties.ceiling(self._mean, self._best, sd):
            return "tied"  # a pile-up at the best (a clip), or every value repeated (BestTies)
        if self._fixed_n is not None:
            return "fixed" if n >= self._fixed_n else None
        if self._cap is not None and n >= self._cap:
            return "fixed"  # the Best-of-N that delivers the target ends the rule's run too
        if self._multiplier is not None:
            return self._multiplier_decide(n)
        table = self._table
        scale = table.scale(n, sd)
        self._scale = scale
        if (self._best - self._mean) / scale >= table.threshold(math.log(scale), n):
            return "target"
        return None

    def _censored_decide(self, reward: float) -> str | None:
        """The table rule on the rewards above the floor (:mod:`stoppers.robust.floor_table`)."""
        table, posterior = self._censored, self._p_above
        assert table is not None and posterior is not None
        n = self._n
        posterior.note(reward > table.floor)
        pile = self._pile
        if pile is not None:
            pile.note(reward)
        if reward > table.floor:
            self._above += 1
            self._ties.note(reward)
            delta = reward - self._mean
            self._mean += delta / self._above
            self._m2 += delta * (reward - self._mean)
        if n < self.min_samples:
            return None
        if self._above == 0:  # all at the bottom
            accepted = floor_acceptance_bound(n, self.alpha, self._floor)
            return "floor" if accepted >= self.target else None
        if pile is not None and pile.stops():
            return "repeated"  # the deployment's repeated bests were its prompts' tops (pile)
        above = self._above
        sd = math.sqrt(self._m2 / (above - 1)) if above > 1 and self._m2 > 0.0 else 0.0
        if self._ties.ceiling(self._mean, self._best, sd):
            return "tied"
        if self._fixed_n is not None:
            return "fixed" if n >= self._fixed_n else None
        if self._cap is not None and n >= self._cap:
            return "fixed"  # the Best-of-N that delivers the target ends the rule's run too
        if above < 2:
            return None
        scale = table.scale(above, sd)
        self._scale = scale
        if (self._best - self._mean) / scale >= table.threshold(
            math.log(scale), posterior.mean, above
        ):
            return "target"
        return None

    def _near_ceiling(self) -> bool:
        """The best's acceptance against the deployment's ceiling already meets the target.

        Every reward is at most the ceiling C (the top of the scale), so the prompt's benchmark
        kappa (a quantile of its rewards) is too, and AR(best - kappa) >= AR(best - C): a best
        with AR(best - C) >= t keeps the promise whatever the prompt - at the ceiling itself
        (AR 1) or, for t < 1, up to ln(2 / t - 1) below it. Before 2026-11-27 only a best equal
        to C stopped here, so prompts pressed against the clip drew until they hit it and
        delivered 1 whatever the target (docs/robust-stopping.md, "Target mode on a deployment")."""
        ceiling = self._ceiling
        if ceiling is None or self._n < self.min_samples or self._best > ceiling:
            return False  # a best above it disproves the ceiling for this request
        return self._best == ceiling or acceptance(self._best - ceiling) >= self.target

    def _multiplier_decide(self, n: int) -> str | None:
        rule = self._multiplier
        assert rule is not None
        # its posterior (~0.1-0.6 ms) on cost mode's likelihood-path schedule
        if evaluation_due(n, self._best, self._eval_n, self._eval_best):
            if not self._m2 > 0.0:
                return None  # all tied so far: no scale to judge the best against yet
            self._margin, self._accepted = rule.evaluate(np.asarray(self._seen), self._best)
            self._eval_n = n
            self._eval_best = self._best
        return "target" if self._margin <= 0.0 else None
