"""Replies that repeat: how often a best that keeps coming back hides a better reply, learned
across a deployment.

Why: a generator at low temperature, or asked a short question, returns one reply again and
again, and the reward model scores each copy identically. One request cannot tell a prompt whose
repeated best *is* its top (then the benchmark kappa, the alpha-quantile, is at most that best
and its acceptance is 1) from one with a better reply of a few percent not drawn yet; the
per-request rules wait for it by a fixed guess (16 identical rewards in target mode's cold
start, 32 in cost mode's, the Good-Turing count of 100 on the learned-shape paths). A deployment
can learn how often its prompts repeat one reply, as it learns its floor
(:class:`~stoppers.robust.ceiling.RewardFloor`):

* Each finished request, read from its *first* reward v1 (a fair draw of the prompt, whatever
  stopped it), counts the draws after it that differ from v1: binomial with the prompt's chance
  q = P(a draw differs from v1). :class:`RewardPile` fits the distribution ``g`` of q across
  prompts on :data:`~stoppers.robust.ceiling.P_GRID` by EM (the floor's NPMLE); the stopping
  rule's requests are ignorable, since the likelihood holds whatever rule on observed rewards
  ended them. ``lift`` is the acceptance a reward above a repeated v1 brought (the best standing
  in for kappa), as the floor's.
* A draw that differs lies above with chance r, and r is *not* learned: for a random reward of
  a continuous law it is uniform on [0, 1] (the probability integral transform), and learned from
  short streams whose first reward happened to be their best it piled up at 0, which read a
  repeated best as a top five times too often on the ``repeats`` family (a learned (q, r) grid,
  tried first; docs/robust-stopping.md, "A deployment learns its piles").
* A request whose best has come back (``same`` copies after it first came, ``below`` lower
  rewards since) reads the posterior of q under ``g``, times q^below (1 - q)^same, and of r,
  Beta(1, below + 1). While p_above = q r <= 1 - alpha, kappa <= best and the best's
  acceptance is 1. Target mode stops once 1 - lift P(p_above > 1 - alpha) reaches the target
  (:func:`pile_acceptance_bound`), cost mode once lift E[p_above 1{p_above > 1 - alpha}], one
  more draw's gain at most, is under the cost (:func:`pile_gain_bound`): the floor's two rules
  with the floor replaced by the best. Stop reason ``"repeated"``. A best that came after the
  first reward was selected for being high, so its r is smaller than a uniform one: reading it
  so waits longer, not shorter.

With no requests that repeat, ``g`` is the uniform base measure, whose posterior after a few
copies still puts most of its weight on a better reply of some percent: the rule only stops
earlier than the per-request rules once the deployment's own requests say its piles are tops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoppers.robust.ceiling import P_GRID, LearnedRows, uniform_on_grid

__all__ = [
    "BestRun",
    "PileBound",
    "PileRule",
    "RewardPile",
    "pile_acceptance_bound",
    "pile_gain_bound",
    "pile_of",
]


@dataclass
class RewardPile(LearnedRows):
    """What a deployment's requests say about a repeated first reward (module docstring).

    ``counts``: per request (newest last, at most ``P_ROWS``) the draws after its first reward
    and how many of them differ from it; ``g``: the grid NPMLE of q over
    :data:`~stoppers.robust.ceiling.P_GRID`; ``lift_sum`` / ``lift_weight``: over requests whose
    first reward repeated and was passed, 1 - AR(first - best), weighted by the share of copies
    of the first reward (:class:`~stoppers.robust.ceiling.LearnedRows`, as the floor's)."""

    def note(self, rewards: Any) -> None:
        """Learn from one finished request's rewards, in observation order."""
        x = np.asarray(rewards, dtype=np.float64)
        if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)):
            return
        first, rest = float(x[0]), x[1:]
        differ = int(np.count_nonzero(rest != first))
        self.learn_row(
            rest.size, differ, first, float(rest.max()), (rest.size - differ) / rest.size
        )

    @property
    def requests(self) -> int:
        """Requests learned from (at most ``P_ROWS``)."""
        return len(self.counts)

    def to_dict(self) -> dict[str, Any]:
        return self.rows_to_dict()

    @classmethod
    def from_dict(cls, data: Any) -> RewardPile:
        """Restore :meth:`to_dict`; ValueError on anything it could not have written (a
        snapshot from before the pile was learned has none: it starts afresh)."""
        pile = cls()
        if data is None:
            return pile
        if not isinstance(data, dict):
            raise ValueError("pile must be an object")
        pile.restore_rows(data, "pile", "differ")
        return pile


@dataclass(frozen=True)
class PileBound:
    """What a request reads from its deployment's :class:`RewardPile` when it starts: the
    lift and the learned ``g`` (None: the uniform base measure)."""

    lift: float = 1.0
    g: tuple[float, ...] | None = None

    def posterior_above(self, same: int, below: int, alpha: float) -> tuple[float, float]:
        """After the best came back ``same`` times with ``below`` lower rewards since it first
        came: (P(p_above > 1 - alpha), E[p_above 1{p_above > 1 - alpha}]), p_above = q r, q
        under ``g`` and r uniform a priori (module docstring)."""
        return _Posterior(self, alpha).above(same, below) or (1.0, 1.0)  # None: nothing known


with np.errstate(divide="ignore"):
    _LOG_SAME = np.log1p(-P_GRID)  # a copy of the best: -inf where every draw differs
    _LOG_DIFFER = np.log(P_GRID)  # a lower reward: -inf where none can come


class _Posterior:
    """The posterior of p_above = q r given a repeated best's counts, under one pile and alpha.

    q's posterior is g q^below (1 - q)^same (r integrated out, a constant); r | below is
    Beta(1, c), c = below + 1, so P(r > x) = (1 - x)^c and
    E[r 1{r > x}] = (1 - x)^c - c / (c + 1) (1 - x)^(c + 1), at x = (1 - alpha) / q; only the
    nodes with q > 1 - alpha (a suffix of the ascending P_GRID) can pass. What depends on
    ``below`` alone is kept until it changes, so a run of copies pays ~5 us a reading."""

    __slots__ = ("_below", "_first_open", "_gain_r", "_log_base", "_log_g", "_passed", "alpha")

    def __init__(self, pile: PileBound, alpha: float) -> None:
        g = np.asarray(pile.g) if pile.g is not None else uniform_on_grid()
        with np.errstate(divide="ignore"):
            self._log_g = np.log(g)
        self.alpha = alpha
        self._first_open = int(np.searchsorted(P_GRID, 1.0 - alpha, side="right"))
        self._below = -1  # the lower-reward count the kept terms are for
        self._log_base = self._log_g
        self._passed = self._gain_r = np.empty(0)

    def above(self, same: int, below: int) -> tuple[float, float] | None:
        """(P(p_above > 1 - alpha), E[p_above 1{p_above > 1 - alpha}]) after ``same`` copies and
        ``below`` lower rewards (both >= 0; 0 log 0 = 0); None where g gives the counts no
        chance (a restored g all at q = 0 or 1): nothing is known, and no rule stops on it."""
        if below != self._below:
            self._keep(below)
        log_post = self._log_base + same * _LOG_SAME if same else self._log_base
        top = log_post.max()
        if not math.isfinite(top):
            return None
        weight = np.exp(log_post - top)
        open_ = weight[self._first_open :]
        total = weight.sum()
        return float(open_ @ self._passed) / total, float(open_ @ self._gain_r) / total

    def _keep(self, below: int) -> None:
        self._below = below
        self._log_base = self._log_g + below * _LOG_DIFFER if below else self._log_g
        q = P_GRID[self._first_open :]
        c = below + 1.0
        rest = 1.0 - (1.0 - self.alpha) / q  # 1 - x
        self._passed = rest**c
        self._gain_r = q * self._passed * (1.0 - c / (c + 1.0) * rest)


def pile_acceptance_bound(same: int, below: int, alpha: float, pile: PileBound) -> float:
    """Expected acceptance of a best seen ``same`` more times (``below`` lower since): 1 while
    p_above <= 1 - alpha, at least 1 - lift above (the floor's bound,
    :func:`~stoppers.robust.ceiling.floor_acceptance_bound`, at the best)."""
    return 1.0 - pile.lift * pile.posterior_above(same, below, alpha)[0]


def pile_gain_bound(same: int, below: int, alpha: float, pile: PileBound) -> float:
    """Upper bound on one more draw's expected acceptance gain at a repeated best: lift E[p_above
    1{p_above > 1 - alpha}] (:func:`~stoppers.robust.ceiling.floor_gain_bound` at the best)."""
    return pile.lift * pile.posterior_above(same, below, alpha)[1]


def pile_of(prior: object) -> PileBound | None:
    """The learned pile of a deployment prior that keeps one, once it has learned from a
    request, else None (read once, when a request starts)."""
    pile = getattr(prior, "pile", None)
    if not isinstance(pile, RewardPile) or not pile.requests:
        return None
    return PileBound(pile.lift, tuple(pile.g))


class BestRun:
    """The current best of one request, how often it came back and how many lower rewards came
    since it first did: the counts :class:`PileBound` reads. Three comparisons per reward."""

    __slots__ = ("below", "best", "same")

    def __init__(self) -> None:
        self.best = -math.inf
        self.same = 0
        self.below = 0

    def note(self, reward: float) -> None:
        if reward > self.best:
            self.best, self.same, self.below = reward, 0, 0
        elif reward == self.best:
            self.same += 1
        else:
            self.below += 1


class PileRule:
    """One request's stop at a repeated best (module docstring): target mode with ``target``,
    cost mode with ``cost``. The posterior is read when the best comes back, not on every
    reward: a request whose rewards never repeat pays three comparisons per reward, and a lower
    reward's verdict waits for the next copy."""

    __slots__ = ("_posterior", "_read_at", "_verdict", "cost", "lift", "run", "target")

    def __init__(
        self,
        pile: PileBound,
        alpha: float,
        *,
        target: float | None = None,
        cost: float | None = None,
    ) -> None:
        if (target is None) == (cost is None):
            raise ValueError("give exactly one of target and cost")
        self.target, self.cost, self.lift = target, cost, pile.lift
        self._posterior = _Posterior(pile, alpha)
        self.run = BestRun()
        self._read_at = (-math.inf, 0)  # (best, copies) of the last reading
        self._verdict = False

    def note(self, reward: float) -> None:
        self.run.note(reward)

    def stops(self) -> bool:
        """Does the deployment's pile say the repeated best keeps the promise (target mode), or
        that one more draw gains less than its cost (cost mode)? The verdicts of
        :func:`pile_acceptance_bound` and :func:`pile_gain_bound`."""
        run = self.run
        if run.same == 0:
            return False
        if self._read_at == (run.best, run.same):
            return self._verdict
        self._read_at = (run.best, run.same)
        reading = self._posterior.above(run.same, run.below)
        if reading is None:
            self._verdict = False
            return False
        chance, gain = reading
        if self.target is not None:
            self._verdict = 1.0 - self.lift * chance >= self.target
        else:
            assert self.cost is not None
            self._verdict = self.lift * gain <= self.cost
        return self._verdict
