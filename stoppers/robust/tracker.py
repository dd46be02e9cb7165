"""Streaming state shared by the GPD-tail policies: the sorted rewards and a cached tail fit.

Why a cache: a tail fit costs ~30-80 µs (Zhang-Stephens on up to ~100 exceedances), far more
than the <= 20 µs per observation the gateway can afford at n = 960. But the fit only moves
when the tail moves: we refit after every reward while n <= ``exact_until`` (16 by default),
afterwards only when a reward lands above the current tail threshold u (probability ~p_u, about
11% at n = 960) or when n has grown by 1/8 since the last fit. Between refits the fit is that
of an earlier prefix - a prefix of the same stream, so nothing from the future leaks in.
Insertion into the sorted list is a C-level memmove (``bisect.insort``): O(n) bytes but
microseconds at n = 960.

Scores on a lattice (integer or coarsely rounded judge ratings) are fitted *dequantized*: a GPD
fitted to a handful of levels sees a bounded tail ending at the top level seen, puts the
benchmark above it and keeps sampling for a level that is rarely there. Where a value other than
the lowest and highest seen repeats - or, in cost mode, the stream holds two values, each seen
three times (:func:`~stoppers.robust.gpd_tail.fit_cell`) - each level's copies are spread
evenly across its rounding cell (the smallest gap between the values seen;
:func:`~stoppers.robust.gpd_tail.dequantize`) before the fit, and the policies judge the
highest spread copy of the best (:meth:`TailTracker.judged_best`): the fit then describes the
continuous scores the lattice rounds. Rewards that repeat only at their extremes (a clip, a
floor) are fitted as they are.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import numpy as np
from scipy.special import bdtrc

from stoppers.robust.gpd_tail import (
    TailFit,
    TailPosterior,
    dequantize,
    fit_cell,
    fit_tail,
    lattice_step,
)

__all__ = [
    "BestTies",
    "Levels",
    "SeenValues",
    "TailTracker",
    "cost_all_tied",
    "is_pile_up",
    "level_ratio",
]

# Fit the tail without the current best (judge the best against the others)? Measured on the
# training families it made the target rule stop earlier but not more efficiently, so off.
LEAVE_OUT_BEST = False
TIES_AT_MAX = 3
# A tied best is taken for the top of the support only where it is a pile-up: more of the
# rewards sit at it than at the next lower value seen, by a one-sided binomial test at this
# level (:func:`is_pile_up`). A clip collects the whole tail above it; on a lattice (integer or
# coarsely rounded scores) the tail thins towards its top level, which the rewards seen
# repeat long before the levels above it appear. Before 2026-11-28 three ties were enough, and
# on normal rewards rounded to 0.5 / 1.0 (`rounded` pools) target mode delivered 0.77 / 0.69 for a
# target of 0.9 and cost mode earned 0.84 / 0.74 of the best fixed N at c = 1e-3; with this test
# and the dequantized fit below, 0.93 / 0.95 and 0.99 / 0.98, with `clipped`, `mixed` and
# AlpacaEval within noise of before in cost mode. It earned more in cost mode than a test at 0.05
# or than keeping three ties against a next value seen once (docs/robust-stopping.md "Coarse
# scores: a tie is not a clip"). The test allows a lattice's top level more mass than the next
# one, by the ratio a smooth density gives adjacent levels (:func:`level_ratio`): on coarse
# lattices the mode's level still piled up by chance at 5 ties against 1 (rounded-1.0 cost mode
# 0.975 / 0.968 of the best fixed N at 1e-3 / 1e-4 -> 1.008 / 1.004; "The pile-up test learns the
# lattice's step", 2026-11-28).
PILE_UP_P = 0.125
ALL_TIED = 16
# Cost mode waits longer at a point mass: on the AlpacaEval pool, where most responses sit at
# the judge's lower clip and ~1 in 10 is much better, stopping after 16 identical rewards cost
# TailPandora 2 points of the oracle's profit at c = 1e-3 (0.942 vs 0.963 with 32), and `clipped`
# lost 0.1 point (docs/robust-stopping.md "Cost mode by backward induction", the tie rule).
COST_ALL_TIED = 32
# ... at c = 1e-3; at other costs the wait moves by log(10) / -log(1 - TIED_MODE_MASS) draws per
# decade (:func:`cost_all_tied`).
COST_ALL_TIED_AT = 1e-3
TIED_MODE_MASS = 0.1


class SeenValues:
    """How often each reward value has been seen, and how many were seen exactly once: the
    Good-Turing estimate of the chance that the next reward is a value not seen yet.

    Why: where rewards repeat because responses do (a generator that often returns the same
    answer, a judge with few distinct scores), the best can be known to be the top of the
    support without being a pile-up: once (singletons + 1) / n <= 1 - alpha, a value above the
    best seen has less than the benchmark's tail mass, so the benchmark kappa is at most the best
    and one more reward cannot raise AR(best - kappa) above 1. Continuous rewards are all
    singletons, so it never fires for them; the + 1 keeps it from firing before n reaches
    1 / (1 - alpha) (100 rewards at alpha = 0.99).

    With a ``target`` (target mode) it also fires once kappa <= best is likely enough that the
    acceptance, at least P(kappa <= best), meets the target: not every unseen value lies above
    the best. If responses repeat as draws of a Dirichlet process do, each new response's reward
    is a fresh draw of one continuous law, and the D distinct rewards seen are D such draws; the
    share of that law above their best is Beta(1, D). The mass above the best is the unseen mass
    M (Good-Turing, as above) times that share, and kappa <= best when it is at most 1 - alpha:
    P = 1 - (1 - (1 - alpha) / M)^D. On continuous rewards (M ~ 1, D = n) this is the exact
    chance that the best of n exceeds the alpha-quantile, 1 - alpha^n: a bound that needs no
    shape (0.9 at 229 rewards, 0.7 at 120), far above where the shape's rule stops. Where a
    prompt's responses repeat it ends the search that the shape's rule, whose threshold a
    prompt's few distinct rewards may never reach, would run to the budget
    (docs/robust-stopping.md, "Responses that repeat verbatim").
    """

    __slots__ = ("_lattice", "alpha", "counts", "n", "singletons", "target")

    def __init__(self, alpha: float, target: float | None = None) -> None:
        self.alpha = alpha  # the benchmark's percentile
        self.target = target  # target mode's acceptance (None: only the point rule)
        self.counts: dict[float, int] = {}
        self.n = 0
        self.singletons = 0
        self._lattice = (0, False)  # (distinct values, whether they sit on a lattice) when read

    def note(self, reward: float) -> None:
        seen = self.counts.get(reward, 0)
        self.counts[reward] = seen + 1
        self.n += 1
        self.singletons += 1 if seen == 0 else -1 if seen == 1 else 0

    def exhausted(self) -> bool:
        """Is the estimated chance of a new value at most the benchmark's tail, 1 - alpha (or,
        with a target, is kappa <= best at least that likely)?"""
        tail = 1.0 - self.alpha
        unseen = (self.singletons + 1) / self.n
        if unseen <= tail:
            return True
        if self.target is None:
            return False
        distinct = len(self.counts)
        if -math.expm1(distinct * math.log1p(-tail / unseen)) < self.target:
            return False
        return not self._on_a_lattice(distinct)

    def _on_a_lattice(self, distinct: int) -> bool:
        """Do the distinct values fill at least half the grid their smallest gap spans?

        Why: rounded scores repeat because their levels do, and the levels not seen yet are
        the extremes past both ends, about half of them above the best - not the Beta(1, D)
        share of a fresh draw's rank (on normal scores rounded to 0.75 sd the target-aware
        rule delivered 0.754 for 0.8). Continuous values that repeat are spread at random, and
        D of them span about D^2 of their smallest gap. Read once per new distinct value."""
        if self._lattice[0] != distinct:
            values = np.sort(np.fromiter(self.counts, dtype=np.float64, count=distinct))
            step = float(np.diff(values).min()) if distinct > 1 else 0.0
            span = (values[-1] - values[0]) / step + 1.0 if step > 0.0 else 1.0
            self._lattice = (distinct, 2 * distinct >= span)
        return self._lattice[1]


def cost_all_tied(cost: float) -> int:
    """Identical rewards after which cost mode takes the stream for a point mass, at ``cost``.

    Why it depends on the cost: a prompt whose rewards repeat one value may hide a better mode
    of mass p. Under a two-point prior - a point mass, or a better mode of mass p0 - one more
    draw is worth its price while the posterior weight of the mode, which falls by (1 - p0)
    per tie, times p0 and the mode's acceptance lift exceeds the cost. The tied count that
    balances them grows by log(10) / -log(1 - p0) draws per decade the cost falls: with
    p0 = ``TIED_MODE_MASS`` (the better mode of one response in ten that set the 32 at
    c = 1e-3 on AlpacaEval, :data:`COST_ALL_TIED`), 22 draws. At c = 1e-4, 54 ties: the chance
    of missing a mode of 5% falls from 0.19 to 0.06."""
    extra = math.log(COST_ALL_TIED_AT / cost) / -math.log1p(-TIED_MODE_MASS)
    return max(1, round(COST_ALL_TIED + extra))


def new_value_gap(values: list[float], at: int, reward: float) -> float:
    """The smallest gap between ``reward`` and its neighbours in ascending ``values``, where
    ``at = bisect_left(values, reward)``; inf if ``reward`` is already there (no new gap)."""
    if at < len(values) and values[at] == reward:
        return math.inf
    below = reward - values[at - 1] if at > 0 else math.inf
    return min(below, values[at] - reward) if at < len(values) else below


class Levels:
    """The smallest gap between two distinct rewards seen (inf until two differ): a lattice's
    step, or on continuous rewards a gap that shrinks with every draw. Rewards are queued and
    merged into the sorted distinct values only when :attr:`step` is read - the pile-up test
    reads it only at a tied best - so a request that never ties pays one append per reward."""

    __slots__ = ("_pending", "_step", "_values")

    def __init__(self) -> None:
        self._values: list[float] = []
        self._pending: list[float] = []
        self._step = math.inf

    def note(self, reward: float) -> None:
        self._pending.append(reward)

    @property
    def step(self) -> float:
        values = self._values
        for reward in self._pending:
            at = bisect.bisect_left(values, reward)
            gap = new_value_gap(values, at, reward)
            if gap < math.inf or not values:
                self._step = min(self._step, gap)
                values.insert(at, reward)
        self._pending.clear()
        return self._step


def level_ratio(step: float, sd: float) -> float:
    """The largest ratio of the masses of two adjacent levels ``step`` apart that a normal-like
    density of spread ``sd`` gives the top level a request sees: exp(step / sd) (one sd below
    the mode; the best of >= 8 draws is almost never further down). ``step`` is the smallest
    gap between the distinct rewards seen: on a lattice its step, on continuous rewards a gap
    that shrinks with every draw, where the ratio tends to 1."""
    if not (sd > 0.0 and step > 0.0 and math.isfinite(step)):
        return 1.0
    return math.exp(min(step / sd, 50.0))


def is_pile_up(top: int, below: int, ratio: float = 1.0) -> bool:
    """Do ``top`` ties at the best, against ``below`` rewards at the next lower value seen, show a
    pile-up at the top of the support (a clip)? At least ``TIES_AT_MAX`` ties, and the one-sided
    binomial test of "the best's mass is at most ``ratio`` times the next value's" rejects at
    ``PILE_UP_P`` (given top + below rewards at the two values, P(Bin(top + below, r / (1 + r))
    >= top)). At ``ratio`` 1, against a next value seen once, 5 ties are needed (p = 0.109; 4
    give 0.19), against one seen twice 7 (0.090), three times 8 (0.113); at ``ratio`` e (a
    lattice one sd apart, :func:`level_ratio`) against one seen once 12 (p = 0.099)."""
    return top >= TIES_AT_MAX and bdtrc(top - 1, top + below, ratio / (1.0 + ratio)) <= PILE_UP_P


class BestTies:
    """The ceiling rule for policies that keep no sorted rewards (the learned-shape ones):
    counts how often the current best and the next lower value have been seen. Clipped judge
    scores repeat their upper clip; a best that piles up above lower rewards (:func:`is_pile_up`)
    is the top of the support, and no location-scale shape can say so (its benchmark may sit
    above the clip forever).

    Unlike :meth:`TailTracker.tied_ceiling` there is no point-mass rule (16 identical rewards):
    on the AlpacaEval pool, where most responses sit at the judge's lower clip, it stopped
    requests before their few good responses (ShapePandora 0.966 -> 0.946 of the oracle at
    c = 1e-3, frozen-prior replay, docs/robust-stopping.md "Cost mode by backward induction").

    ``enabled=False`` when the deployment's ceiling is established
    (:class:`~stoppers.robust.ceiling.RewardCeiling`): the top of the scale is then known, and
    ties below it are the scale's resolution (rounded or integer scores), not a clip - on
    `clipped` (scores rounded to 0.1) the rule stopped 134 of 720 requests at a rounded best,
    0.47 of profit per 24-prompt deployment at c = 1e-4 (``stoppers.robust.loss_report``)."""

    __slots__ = (
        "below",
        "below_count",
        "count",
        "enabled",
        "levels",
        "seen",
        "top",
    )

    def __init__(
        self,
        *,
        enabled: bool = True,
        repeats_alpha: float | None = None,
        repeats_target: float | None = None,
    ) -> None:
        # target mode's benchmark level and target: also stop once every value repeats
        self.seen = None if repeats_alpha is None else SeenValues(repeats_alpha, repeats_target)
        self.levels = Levels()
        self.top = -math.inf
        self.count = 0
        self.below = -math.inf
        self.below_count = 0
        self.enabled = enabled

    def note(self, reward: float) -> None:
        """Count one more reward (any order of calls relative to the base class's bookkeeping)."""
        if self.seen is not None:
            self.seen.note(reward)
        self.levels.note(reward)
        if reward > self.top:
            self.below, self.below_count = self.top, self.count
            self.top, self.count = reward, 1
        elif reward == self.top:
            self.count += 1
        elif reward > self.below:
            self.below, self.below_count = reward, 1
        elif reward == self.below:
            self.below_count += 1

    def ceiling(self, mean: float, best: float, sd: float = 0.0) -> bool:
        """Is the best a pile-up above lower rewards (``mean < best``; ``sd``, the rewards'
        standard deviation, with the smallest gap between them sets :func:`level_ratio`), or
        (with ``repeats_alpha``) have the rewards repeated enough that no unseen value can hold
        the benchmark (:class:`SeenValues`; this part also with ``enabled=False``)?"""
        if self.seen is not None and self.seen.exhausted():
            return True
        return (
            self.enabled
            and self.count >= TIES_AT_MAX
            and mean < best
            and is_pile_up(self.count, self.below_count, level_ratio(self.levels.step, sd))
        )


class TailTracker:
    """Sorted rewards of one request plus the latest :class:`TailFit` (None: no tail yet)."""

    def __init__(
        self,
        *,
        xi0: float,
        prior_weight: float,
        exact_until: int = 16,
        leave_out_best: bool = LEAVE_OUT_BEST,
        posterior: Callable[[np.ndarray], TailPosterior] | None = None,
        tie_ceiling: bool = True,
        precision_weighted: bool = False,
        repeats_alpha: float | None = None,
        two_level_cells: bool = False,
        repeats_target: float | None = None,
    ) -> None:
        self.leave_out_best = leave_out_best
        # two values each seen three times read as two cells (gpd_tail.fit_cell; cost mode)
        self._cell_of = fit_cell if two_level_cells else lattice_step
        self.precision_weighted = precision_weighted
        self.tie_ceiling = tie_ceiling
        self.posterior = posterior
        self.xi0 = xi0
        self.prior_weight = prior_weight
        self.exact_until = exact_until
        self.sorted: list[float] = []
        # the SeenValues rule at this benchmark level and target (None: off)
        self.seen = None if repeats_alpha is None else SeenValues(repeats_alpha, repeats_target)
        self.fit: TailFit | None = None
        self.step: float | None = None  # the lattice's cell at the last fit (None: continuous)
        self.refits = 0
        self.step_seen = math.inf  # the smallest gap between distinct rewards (is_pile_up)
        self._shift = math.nan  # the first reward: sums of shifted rewards keep the sd exact
        self._sum = 0.0
        self._sum_sq = 0.0
        self._fit_n = 0

    def judged_best(self) -> float:
        """The best as the fit sees it: on a lattice, the highest of its level's copies spread
        over the cell (:func:`~stoppers.robust.gpd_tail.dequantize`), else the best itself."""
        values = self.sorted
        top = values[-1]
        if self.step is None:
            return top
        m = len(values) - bisect.bisect_left(values, top)
        return top + self.step * (0.5 - 0.5 / m)

    def tied_ceiling(self, min_samples: int, all_tied: int = ALL_TIED) -> bool:
        """The ties say the best is (almost surely) the top of the support: stop.

        Two cases, both common in clipped judge scores: the best reward piled up above lower
        rewards (:func:`is_pile_up`: a ceiling, e.g. the upper clip), or
        every reward identical for ``max(2 min_samples, all_tied)`` draws (a point mass).
        Identical rewards at a *lower* clip also look like the second case; waiting for 16 of
        them keeps the chance of missing a better mode with >= 20% mass below 3%, waiting for
        32 (cost mode, :data:`COST_ALL_TIED`) the chance of missing one with >= 10% mass below 4%.
        A third with ``repeats_alpha`` (target mode), for repeated values anywhere
        (:class:`SeenValues`): so few values seen once that no unseen one can hold the
        benchmark. With ``tie_ceiling=False`` (the deployment's ceiling is known,
        :class:`BestTies`) the pile-up case does not apply.
        """
        values = self.sorted
        n = len(values)
        top = values[-1]
        if values[0] == top:
            return n >= max(2 * min_samples, all_tied)
        if n < min_samples:
            return False
        if self.seen is not None and self.seen.exhausted():
            return True  # every value repeated: none unseen can hold the benchmark
        if not self.tie_ceiling:
            return False
        at_top = bisect.bisect_left(values, top)
        if n - at_top < TIES_AT_MAX:
            return False
        below = at_top - bisect.bisect_left(values, values[at_top - 1])
        mean = self._sum / n
        sd = math.sqrt(max(self._sum_sq - n * mean * mean, 0.0) / (n - 1))
        return is_pile_up(n - at_top, below, level_ratio(self.step_seen, sd))

    def fit_without_best(self) -> TailFit | None:
        """The tail fitted to every reward but the best, as the last fit read them (on the
        lattice of :attr:`step`, if any; None: no tail)."""
        return self._fit(self.sorted[:-1])

    def _fit(self, values: list[float]) -> TailFit | None:
        """:func:`fit_tail` of ascending ``values``, on the lattice of :attr:`step` if any."""
        x = np.asarray(values)
        if self.step is not None:
            x = dequantize(x, self.step)
        return fit_tail(
            x,
            xi0=self.xi0,
            prior_weight=self.prior_weight,
            posterior=self.posterior,
            precision_weighted=self.precision_weighted,
        )

    def add(self, reward: float) -> bool:
        """Insert ``reward``; refit when due. Returns True when the fit was recomputed."""
        values = self.sorted
        at = bisect.bisect_left(values, reward)
        self.step_seen = min(self.step_seen, new_value_gap(values, at, reward))
        values.insert(at, reward)
        if len(values) == 1:
            self._shift = reward
        x = reward - self._shift
        self._sum += x
        self._sum_sq += x * x
        if self.seen is not None:
            self.seen.note(reward)
        n = len(self.sorted)
        fit = self.fit
        due = (
            n <= self.exact_until
            or fit is None
            or reward > fit.u
            or n >= self._fit_n + max(1, self._fit_n // 8)
        )
        if not due:
            return False
        values = self.sorted[:-1] if self.leave_out_best else self.sorted
        self.step = self._cell_of(self.sorted)
        self.fit = self._fit(values)
        self._fit_n = n
        self.refits += 1
        return True
