"""The ends of a bounded reward model's scale, learned across a deployment's requests.

Why: bounded reward models return their bounds again and again: a judge's logit clipped at
logit(0.9999) (562 of the 39,445 AlpacaEval entries in ``../shared/data``, in 143 of its 805
prompts, sit exactly at the pool's maximum) and at logit(0.0001) below (most of its entries), a
sigmoid that saturates, integer scores. One request cannot tell a bound from a value its own
prompt merely repeats; a deployment can: the highest (lowest) reward any of its requests has
seen, reached exactly by ``CEILING_REQUESTS`` different requests and never passed, is an end of
the scale. Rewards from a continuous model never tie across requests, so for them no end is ever
established and nothing changes.

* The **ceiling** (:class:`RewardCeiling`): a request whose best reward *is* the top cannot
  improve by sampling more, whatever its prompt (stop reason ``"ceiling"``; the per-request rule
  :class:`~stoppers.robust.tracker.BestTies` needs three ties above lower rewards, and says
  nothing when a prompt's rewards all sit at the bound).
* The **floor** (:class:`RewardFloor`): a request whose rewards all sit at the bottom is *not* a
  point mass - its prompt may have a few good responses the judge scores above the clip - so the
  cold-start point-mass rule (32 identical rewards) must not stop it; the rule of succession
  prices the chance of a better one instead (:func:`floor_gain_bound`), scaled by the
  acceptance that a reward above the floor has brought the deployment's other requests
  (:attr:`RewardFloor.lift`): large where the floor is far below the good responses (the
  AlpacaEval judge: ~10 logits), small where it is a clip just under them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from scipy import optimize, special
from scipy.special import betainc

from stoppers.robust.gpd_tail import acceptance, lattice_step
from stoppers.robust.npmle import npmle_em

__all__ = [
    "CEILING_REQUESTS",
    "FloorBound",
    "RewardCeiling",
    "RewardFloor",
    "ceiling_of",
    "clipped_floor_of",
    "em_p_grid",
    "floor_acceptance_bound",
    "floor_gain_bound",
    "floor_of",
    "piles_up",
    "restore_rows_and_lift",
    "uniform_on_grid",
]

CEILING_REQUESTS = 3  # requests that must have reached an end before it counts as the bound
# on a lattice a request piles up at its best where a rounded normal clipped there beats one that
# is not by this 2 log likelihood ratio (piles_up): chi-square(1) at 0.95, chosen once
# (docs/robust-stopping.md, "A false ceiling on a lattice", "Lattices built after")
PILE_UP_LR = 3.84


def _finite(rewards: Any) -> np.ndarray:
    """A request's rewards as a flat float array, non-finite ones dropped."""
    x = np.asarray(rewards, dtype=np.float64).ravel()
    return x[np.isfinite(x)]


@dataclass
class _ScaleEnd:
    """The most extreme reward seen on one side, how many requests reached it exactly, and how
    many of those piled up there (:func:`piles_up`, a clip's signature)."""

    value: float
    requests: int = 0  # requests whose rewards include ``value`` (each counted once)
    piled: int = 0  # of ``requests``, those whose rewards pile up at ``value``

    SIGN: ClassVar[float]  # +1: the top, -1: the bottom
    NAME: ClassVar[str]  # what the prior calls it
    KEY: ClassVar[str]  # the value's key in to_dict

    def note(self, rewards: Any, step: float | None = None) -> None:
        """Learn from one finished request's rewards (any length; non-finite ones ignored);
        ``step``, the deployment's lattice, judges a request on two levels (:func:`piles_up`)."""
        x = _finite(rewards)
        if x.size == 0:
            return
        extreme = float(x.max() if self.SIGN > 0 else x.min())
        if self.SIGN * extreme > self.SIGN * self.value:
            self.value, self.requests, self.piled = extreme, 1, int(self._piles_up(x, step))
        elif extreme == self.value:
            self.requests += 1
            self.piled += int(self._piles_up(x, step))

    def _piles_up(self, x: np.ndarray, step: float | None) -> bool:
        """Do the finite rewards ``x`` pile up at this end (:func:`piles_up` on ``SIGN x``)?"""
        return piles_up(self.SIGN * x, step)

    @property
    def bound(self) -> float | None:
        """The established end of the scale (None until ``CEILING_REQUESTS`` requests reached
        it)."""
        return self.value if self.requests >= CEILING_REQUESTS else None

    def to_dict(self) -> dict[str, Any]:
        value = self.value if math.isfinite(self.value) else None
        return {self.KEY: value, "requests": self.requests, "piled": self.piled}

    @classmethod
    def from_dict(cls, data: Any) -> _ScaleEnd:
        """Restore :meth:`to_dict`; ValueError on anything it could not have written. A
        snapshot from before ``piled`` counts every request that reached the end as piled: the
        rule an end was established by then (a floor closed the lattice path then too,
        ``shape_cost._clipless_lattice``)."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"{cls.NAME} must be an object")
        value, requests = data.get(cls.KEY), data.get("requests", 0)
        if value is None:
            value = -cls.SIGN * math.inf
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ValueError(f"{cls.NAME}.{cls.KEY} must be a number or null")
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
            raise ValueError(f"{cls.NAME}.requests must be an integer >= 0")
        if not math.isfinite(value) and (cls.SIGN * value > 0 or requests):
            raise ValueError(f"{cls.NAME}.{cls.KEY} must be finite once requests reached it")
        piled = data.get("piled", requests)
        if isinstance(piled, bool) or not isinstance(piled, int) or not 0 <= piled <= requests:
            raise ValueError(f"{cls.NAME}.piled must be an integer in [0, requests]")
        return cls(value=float(value), requests=requests, piled=piled)


@dataclass
class RewardCeiling(_ScaleEnd):
    """The highest reward seen in a deployment, how many requests reached it exactly, and how
    many of those piled up there (:func:`piles_up`). It is established once
    ``CEILING_REQUESTS`` requests reached it and at least one piled up: the top level of rounded
    scores with no clip is reached by a few requests too, and they rarely pile up there
    (2026-11-29; before, rounded at 1.25, seed 6, 88 of 2,400 requests stopped on such a false
    ceiling at c = 1e-4, 0.83 of the best fixed N's profit on them, and the deployment lost the
    likelihood path a clipless lattice decides on). :meth:`note` takes the deployment's lattice
    step, so that a request on two levels can be judged too."""

    value: float = -math.inf
    SIGN: ClassVar[float] = 1.0
    NAME: ClassVar[str] = "ceiling"
    KEY: ClassVar[str] = "top"

    @property
    def bound(self) -> float | None:
        return self.value if self.requests >= CEILING_REQUESTS and self.piled >= 1 else None


def piles_up(rewards: np.ndarray, step: float | None = None) -> bool:
    """Do a request's finite ``rewards`` pile up at their best, as they do at a clip?

    On a lattice - the request's own (:func:`~stoppers.robust.gpd_tail.lattice_step`, three
    levels or more) or, for a request on two levels, the deployment's ``step`` - the best piles
    up when it holds two copies or more and a rounded normal clipped at the best explains the
    levels' counts better than an unclipped one, by ``PILE_UP_LR`` (:func:`_clip_log_ratio`). A
    clip collects the whole tail above it; an unbounded lattice whose top level holds much of
    a prompt's mass predicts the level above too, and a request that never sees it is the
    evidence. Why not a count rule (the top level holding half the level below's count, the
    rule of the morning of 2026-11-29): on a lattice twice the median scale the top level of a
    prompt on two or three levels is often its mode, and rounded at 2.0, seed 7, established a
    false ceiling (docs/robust-stopping.md, "Lattices built after today's changes").
    Continuous rewards, or a request too short to tell: yes (a tie at the top is the signal
    there, as before)."""
    x = np.sort(np.asarray(rewards, dtype=np.float64))
    values, counts = np.unique(x, return_counts=True)
    own = lattice_step(x) if values.size >= 3 else None
    if own is not None:
        step = own
    elif step is None or values.size < 2 or not _whole_steps(values, step):
        return True
    if counts[-1] < 2:
        return False
    return 2.0 * _clip_log_ratio(values, counts, step) >= PILE_UP_LR


def _whole_steps(values: np.ndarray, step: float) -> bool:
    """Are the ascending distinct ``values`` whole steps apart (on the deployment's lattice)?"""
    k = np.diff(values) / step
    return bool(np.all(k > 0.5) and np.all(np.abs(k - np.round(k)) < 1e-6))


def _clip_log_ratio(values: np.ndarray, counts: np.ndarray, step: float) -> float:
    """max log L(clipped at the top level) - max log L(unclipped), >= 0: normals rounded to
    ``step`` fitted by Nelder-Mead to the levels' ``counts``, each level's likelihood the mass of
    its rounding cell (the top cell running to +inf where clipped)."""
    lo, hi = values - 0.5 * step, values + 0.5 * step

    def neg_log_lik(params: np.ndarray, clipped: bool) -> float:
        m, s = params[0], math.exp(params[1])
        upper = special.ndtr((hi - m) / s)
        if clipped:
            upper[-1] = 1.0
        p = upper - special.ndtr((lo - m) / s)
        return -float(counts @ np.log(np.maximum(p, 1e-300)))

    total = counts.sum()
    mean = float(counts @ values) / total
    var = max(float(counts @ (values - mean) ** 2) / total, step * step / 12.0)
    start = np.array([mean, 0.5 * math.log(var)])
    best = {
        clipped: optimize.minimize(
            neg_log_lik,
            start,
            args=(clipped,),
            method="Nelder-Mead",
            options={"xatol": 1e-4, "fatol": 1e-6},
        ).fun
        for clipped in (False, True)
    }
    return max(best[False] - best[True], 0.0)


# The support of g, the distribution of p = P(a reward above the floor) across the deployment's
# prompts: fine near 0, where an all-floor request's posterior lives.
P_GRID = np.array(
    [
        *(0.0, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2),
        *(0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    ]
)
P_BASE_WEIGHT = 2.0  # requests' worth of the uniform prior mixed into every EM step
P_ROWS = 256  # (draws, draws above the floor) of the newest requests kept
P_EM_STEPS = 25  # EM iterations per update, warm-started


def uniform_on_grid() -> np.ndarray:
    """Beta(1, 1) on P_GRID: each point weighted by its share of [0, 1] (midpoint cells)."""
    edges = np.concatenate([[0.0], (P_GRID[1:] + P_GRID[:-1]) / 2.0, [1.0]])
    return np.diff(edges)


@dataclass
class LearnedRows:
    """What :class:`RewardFloor` and :class:`~stoppers.robust.pile.RewardPile` learn the same
    way: per request (newest last, at most ``P_ROWS``) its draws and how many were the event of
    chance p (above the floor; differing from the first reward), the grid NPMLE ``g`` of p
    across prompts (:func:`em_p_grid`), and the lift, 1 - AR(base - best) over requests whose
    base was passed, weighted by their share at the base."""

    counts: list[list[int]] = field(default_factory=list, repr=False)
    g: list[float] = field(default_factory=lambda: uniform_on_grid().tolist(), repr=False)
    lift_sum: float = 0.0
    lift_weight: float = 0.0

    def learn_row(self, draws: int, events: int, base: float, best: float, share: float) -> None:
        """One request's row, the NPMLE refitted, and its lift where ``share`` of its draws sat
        at ``base`` and its ``best`` passed it."""
        self.counts.append([draws, events])
        del self.counts[:-P_ROWS]
        self.g = em_p_grid(np.asarray(self.counts, dtype=np.float64), np.asarray(self.g)).tolist()
        if share > 0.0 and best > base:
            self.lift_sum += share * (1.0 - acceptance(base - best))
            self.lift_weight += share

    def forget_rows(self) -> None:
        self.counts, self.g = [], uniform_on_grid().tolist()
        self.lift_sum, self.lift_weight = 0.0, 0.0

    @property
    def lift(self) -> float:
        """Mean acceptance gained above the base (1, the bounds' worst case, before any)."""
        return self.lift_sum / self.lift_weight if self.lift_weight > 0.0 else 1.0

    def rows_to_dict(self) -> dict[str, Any]:
        return {
            "counts": [list(c) for c in self.counts],
            "g": list(self.g),
            "lift_sum": self.lift_sum,
            "lift_weight": self.lift_weight,
        }

    def restore_rows(self, data: dict[str, Any], name: str, event: str) -> None:
        """Read :meth:`rows_to_dict`'s keys from ``data``; ValueError (naming ``name``) on
        anything it could not have written."""
        self.counts, self.g, self.lift_sum, self.lift_weight = restore_rows_and_lift(
            data, name, event
        )


@dataclass
class RewardFloor(_ScaleEnd, LearnedRows):
    """The lowest reward seen in a deployment, how many requests reached it exactly, and two
    things learned about it from every request since it was set:

    * ``counts``: per request (newest last, at most ``P_ROWS``) its draws and its draws above
      the floor; ``g``: the grid NPMLE (EM, as :class:`~stoppers.robust.xi_prior.XiPrior`) of
      the distribution of p = P(above the floor) across prompts, with a uniform base measure -
      a deployment whose all-floor prompts really are all floor (a clipped scale's worst
      prompts) learns mass at p = 0, one whose floor prompts have a few good responses (the
      AlpacaEval judge) does not. The stopping rule's requests are ignorable: the binomial
      likelihood holds whatever rule (on observed rewards) ended them.
    * ``lift_sum`` / ``lift_weight``: over requests with rewards both at and above the floor,
      1 - AR(floor - best) (the acceptance their best gained over the floor, the best standing
      in for the unknown benchmark), weighted by the request's fraction at the floor.
    """

    value: float = math.inf
    SIGN: ClassVar[float] = -1.0
    NAME: ClassVar[str] = "floor"
    KEY: ClassVar[str] = "bottom"

    def note(self, rewards: Any, step: float | None = None) -> None:
        x = _finite(rewards)
        if x.size == 0:
            return
        before = self.value
        super().note(x, step)
        if self.value != before:  # a new bottom: what was learned about the old one is moot
            self.forget_rows()
        at_floor = int(np.count_nonzero(x == self.value))
        self.learn_row(
            int(x.size), int(x.size) - at_floor, self.value, float(x.max()), at_floor / x.size
        )

    def _piles_up(self, x: np.ndarray, step: float | None) -> bool:
        # rewards all at one value tell a clip from a level no more than one draw does (a coarse
        # lattice's tied prompts); the ceiling counts them, as it was established by before
        return float(x.max()) > float(x.min()) and super()._piles_up(x, step)

    @property
    def clip(self) -> float | None:
        """The floor if it is established and a request has piled up at it (a clip below the
        scores, as on the AlpacaEval judge), else None: the lowest level of rounded scores is
        reached by three requests as easily, but rarely piles up (:func:`piles_up`)."""
        return self.bound if self.piled >= 1 else None

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | self.rows_to_dict()

    @classmethod
    def from_dict(cls, data: Any) -> RewardFloor:
        floor = super().from_dict(data)
        if data is not None:
            floor.restore_rows(data, "floor", "above")
        return floor


def restore_rows_and_lift(
    data: dict[str, Any], name: str, event: str
) -> tuple[list[list[int]], list[float], float, float]:
    """The learned state :class:`RewardFloor` and :class:`~stoppers.robust.pile.RewardPile`
    share, read from a snapshot: ``counts`` (at most ``P_ROWS`` [draws, ``event``] pairs), the
    NPMLE ``g`` on :data:`P_GRID` and the lift's sum and weight; ValueError (naming ``name``)
    on anything :meth:`RewardFloor.to_dict` could not have written."""
    lift = [data.get("lift_sum", 0.0), data.get("lift_weight", 0.0)]
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in lift):
        raise ValueError(f"{name}.lift_sum and {name}.lift_weight must be numbers")
    lift_sum, lift_weight = float(lift[0]), float(lift[1])
    if not (0.0 <= lift_sum <= lift_weight < math.inf):
        raise ValueError(f"{name}.lift_sum must be in [0, lift_weight], lift_weight finite")
    counts = data.get("counts", [])
    if not (isinstance(counts, list) and len(counts) <= P_ROWS) or not all(
        isinstance(c, list)
        and len(c) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in c)
        and 0 <= c[1] <= c[0]
        for c in counts
    ):
        raise ValueError(f"{name}.counts must be at most {P_ROWS} [draws, {event}] pairs")
    g = data.get("g", uniform_on_grid().tolist())
    if not (isinstance(g, list) and len(g) == P_GRID.size) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= v < math.inf for v in g
    ):
        raise ValueError(f"{name}.g must hold {P_GRID.size} probabilities")
    if abs(sum(g) - 1.0) > 1e-6:
        raise ValueError(f"{name}.g must sum to 1")
    return [list(c) for c in counts], [float(v) for v in g], lift_sum, lift_weight


def em_p_grid(counts: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``P_EM_STEPS`` EM iterations of the grid NPMLE of the distribution of p (binomial rows:
    draws n, of which a are the event of chance p), regularised by the uniform base measure."""
    n, a = counts[:, :1], counts[:, 1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_lik = a * np.log(P_GRID) + (n - a) * np.log1p(-P_GRID)  # 0 * log 0 -> nan
    log_lik = np.where((a == 0) & (P_GRID == 0.0), 0.0, log_lik)
    log_lik = np.where((n == a) & (P_GRID == 1.0), 0.0, log_lik)
    likelihood = np.exp(log_lik - np.nanmax(log_lik, axis=1, keepdims=True))
    likelihood = np.nan_to_num(likelihood)
    return npmle_em(likelihood, g, uniform_on_grid(), P_BASE_WEIGHT, P_EM_STEPS)


@dataclass(frozen=True)
class FloorBound:
    """What a request reads from the deployment's established floor when it starts: the value,
    the lift and the learned distribution ``g`` of p over :data:`P_GRID` (None: uniform)."""

    value: float
    lift: float = 1.0
    g: tuple[float, ...] | None = None

    def posterior_above(self, n: int, alpha: float) -> tuple[float, float]:
        """After n draws all at the floor: (P(p > 1 - alpha), E[p 1{p > 1 - alpha}])."""
        if self.g is None:
            # P(Beta(2, n + 1) > 1 - alpha) = I_alpha(n + 1, 2), the regularised incomplete beta
            return alpha ** (n + 1.0), float(betainc(n + 1.0, 2.0, alpha)) / (n + 2.0)
        with np.errstate(divide="ignore"):
            stay = n * np.log1p(-P_GRID) if n else np.zeros(P_GRID.size)  # n at the floor
            log_post = np.log(np.asarray(self.g)) + stay
        post = np.exp(log_post - np.max(log_post))
        post /= post.sum()
        above = 1.0 - alpha < P_GRID
        return float(post[above].sum()), float(post[above] @ P_GRID[above])


def ceiling_of(prior: object) -> float | None:
    """The established ceiling of a deployment prior that keeps one, else None. Policies read
    it once, when a request starts: the value they stop at cannot move under them."""
    ceiling = getattr(prior, "ceiling", None)
    return ceiling.bound if isinstance(ceiling, RewardCeiling) else None


def floor_of(prior: object) -> FloorBound | None:
    """The established floor of a deployment prior that keeps one, and its lift, else None
    (read once, when a request starts, like :func:`ceiling_of`)."""
    floor = getattr(prior, "floor", None)
    if not isinstance(floor, RewardFloor) or floor.bound is None:
        return None
    return FloorBound(floor.bound, floor.lift, tuple(floor.g))


def clipped_floor_of(prior: object) -> float | None:
    """The floor of a deployment prior that keeps one, where it is established and a request
    piled up at it (:attr:`RewardFloor.clip`), else None."""
    floor = getattr(prior, "floor", None)
    return floor.clip if isinstance(floor, RewardFloor) else None


def floor_gain_bound(n: int, alpha: float, floor: FloorBound | None = None) -> float:
    """Upper bound on one more draw's expected acceptance gain after ``n`` draws all at the floor.

    Let p be the prompt's chance of a reward above the floor. While p <= 1 - alpha the benchmark
    kappa (the alpha-quantile) *is* the floor and the best already has acceptance 1; above it a
    draw gains at most the floor's ``lift`` (1 - AR(floor - kappa), 1 at most), and only with
    probability p. So the gain is at most lift E[p 1{p > 1 - alpha} | n draws at the floor],
    under the deployment's learned distribution of p (``floor.g``), or - with no floor learned
    (``floor`` None or its ``g`` None) - under Laplace's rule of succession, p ~ Beta(1, n + 1):
    P(Beta(2, n + 1) > 1 - alpha) / (n + 2).
    """
    floor = floor if floor is not None else FloorBound(math.nan)
    return floor.lift * floor.posterior_above(n, alpha)[1]


def floor_acceptance_bound(n: int, alpha: float, floor: FloorBound | None = None) -> float:
    """Expected acceptance of the floor after ``n`` draws all at it: 1 while p <= 1 - alpha, at
    least 1 - lift above; so 1 - lift P(p > 1 - alpha | n draws at the floor) (the posterior of
    :func:`floor_gain_bound`; under Beta(1, n + 1), 1 - alpha^(n + 1))."""
    floor = floor if floor is not None else FloorBound(math.nan)
    return 1.0 - floor.lift * floor.posterior_above(n, alpha)[0]
