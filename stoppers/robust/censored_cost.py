"""Cost mode where a deployment's rewards pile up at a floor: Weitzman's gain on the censored
reading.

Why: a judge's clipped scores (the AlpacaEval pool: 56% of its rewards at the lower clip, from 8%
to 96% per prompt) repeat the floor, so the likelihood paths - fitted to continuous rewards - do
not run, and every request ran the cold start (:class:`~stoppers.robust.cost.TailPandora`, its
own tail only). On the pool redrawn to 960 responses per prompt it earned 0.953 / 0.959 of the
best fixed N at c = 1e-3 / 1e-4: it stopped before a rare best far above the rest was drawn
(docs/robust-stopping.md, "The real pool's shapes at 960 draws").

Read as censoring, as target mode does (:mod:`stoppers.robust.floor_table`), a prompt draws above
the floor with probability p and there from an interior shape its deployment shares. Its
benchmark kappa, the alpha-quantile of all its rewards, is the interior's alpha'-quantile,
alpha' = 1 - (1 - alpha) / p, and the floor itself where p <= 1 - alpha. One more draw gains only
when it lands above the floor, so Weitzman's one-step gain (Definitions "Fair-cap value",
"Weitzman's Algorithm") is

    E[(AR_kappa(V) - AR_kappa(best))+] = p E[(AR_kappa(m + s Z) - AR_kappa(best))+],

Z from the interior shape. The request's interior location m and scale s are integrated out by
the likelihood of its own rewards above the floor (:meth:`FittedShape.posterior`, as on the
continuous likelihood path), p over its posterior under the floor's learned distribution of p
(the NPMLE :attr:`~stoppers.robust.ceiling.RewardFloor.g`). The interior shape is fitted by
likelihood to the kept streams' rewards above the floor (:meth:`FittedShape.fit`), so it holds
what the prompts share above their floor: on the pool, a rare best far above the rest.

With one reward above the floor there is no sd: m = x - s Z under a flat prior on m, s from the
deployment's interior scales (:func:`_one_reward_nodes`). With none, the floor rule
(:func:`~stoppers.robust.ceiling.floor_gain_bound`) decides, as on every path.

A floor that cuts one latent shape (a Tobit: the more of a prompt it takes, the more skewed the
rest) is read as that instead where the kept streams say so (:attr:`CensoredShape.cut`,
:mod:`stoppers.robust.latent_shape`): the same gain, the request's latent location and scale
integrated over the likelihood of its rewards above the floor and its count at it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import special, stats

from stoppers.robust.bimodality import two_mode_flags
from stoppers.robust.ceiling import P_GRID, FloorBound
from stoppers.robust.floor_table import (
    FLOOR_SHARE_MIN,
    floor_share,
    interior_streams,
    learned_g,
    scale_counts,
)
from stoppers.robust.latent_shape import fit_latent, latent_posterior, latent_scales, log_evidence
from stoppers.robust.likelihood_cost import CENTRES, FittedShape
from stoppers.robust.shape_likelihood import MIN_STREAM
from stoppers.robust.stop_table import scale_prior

__all__ = [
    "CUT_EVIDENCE",
    "INTERIOR_TWO_MODE_MAX",
    "CensoredGain",
    "CensoredShape",
    "cut_evidence",
    "fit_censored",
]

# The reading assumes one interior shape the prompts share, placed by each request's location and
# scale. Where the interiors are two-mode on their own it is not used: the AlpacaEval judge's
# interiors hold a losing and a winning cluster in per-prompt proportions (0.50-0.74 of its kept
# interior streams two-mode, against 0.07-0.32 on the judge and Tobit families; 2 deployments x
# 15-40 requests of each, scratch), and there the reading drew 252 rewards a request where the
# best fixed N drew 134, or stopped short of a rare winner: 0.856 of that N's profit at c = 1e-3,
# where the cold start earned 0.934 (docs/robust-stopping.md, "Cost mode reads the floor as
# censoring").
INTERIOR_TWO_MODE_MAX = 0.4
INTERIOR_TESTABLE_MIN = 10  # interior streams long enough to show two modes (bimodality)
# ... nor where the interior's shape follows the share at the floor, as a Tobit's does (a normal
# cut at the floor: the more of a prompt the floor takes, the more its interior is a skewed
# upper tail). The reading assumes one interior shape whatever p, so it is tested: the Spearman
# correlation across kept streams between the share at the floor and the interior's skewness,
# as a z statistic r sqrt(m - 1) (m streams with SKEW_MIN_INTERIOR rewards above the floor, at
# least INTERIOR_TESTABLE_MIN). r after 15 / 25 / 40 requests, 3 deployments each (scratch
# `skewcorr.py`): `judge` -0.29 to +0.16, `floored` at sd 1 +0.19 to +0.87, at sd 3.5 -0.15 to
# +0.80; there the reading earned 0.9957 / 0.9995 of the best fixed N at c = 1e-4 on its
# requests, the cold start 1.0014 / 1.0018 (docs/robust-stopping.md, "Cost mode reads the
# floor as censoring").
FLOOR_DEPENDENCE_Z = 2.0
# The floor is read as cutting one latent shape where that reading explains the kept streams
# better than the censored one (cut_evidence, a log Bayes factor): Tobit deployments of 20-30
# requests gave +56 to +140, the judge family -2,200 to -14,000 (scratch `ev.py`). The real pool
# redrawn to 960 (two clusters above a judge's clip) gave +24 to +68, and where its interiors
# passed the two-mode gate the cut reading earned 0.82 of the best fixed N on 6 requests of 480;
# there the skewness fell with the share at the floor (z -2.5 to -3.0), which a cut cannot do.
CUT_EVIDENCE = 0.0
SKEW_MIN_INTERIOR = 8

# p's posterior is summed over at most this many nodes (posterior-weighted means of equal-mass
# slices of P_GRID): a node's gain costs a pass over the (m, s) grid.
P_NODES = 5
P_WEIGHT_MIN = 1e-3  # grid points of p under this posterior weight add nothing
_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(5)
_GH_W = _GH_W / _GH_W.sum()
ONE_REWARD_Z = 15  # interior quantiles a lone reward above the floor is placed at


@dataclass(frozen=True)
class CensoredShape:
    """What a request reads from a deployment whose floor is read as censoring: the interior
    shape, the floor, the learned distribution of p (log, on ``ceiling.P_GRID``) and the
    interior scales' prior (mean and precision of log sd); ``two_mode_share``: the share of the
    interior streams long enough to tell that show two modes on their own, ``floor_dependence``:
    the z statistic of the interiors' skewness following the share at the floor (each None:
    fewer than ``INTERIOR_TESTABLE_MIN`` streams to tell); for one-mode interiors ``latent``,
    the one shape a floor that cuts it would leave (:mod:`stoppers.robust.latent_shape`),
    ``latent_scale`` its scales' prior (mean and precision of log s) and ``cut_evidence`` the
    log Bayes factor of that reading over this one (:func:`cut_evidence`)."""

    interior: FittedShape
    floor: float
    log_g: tuple[float, ...]
    scale_mu: float
    scale_precision: float
    requests: int
    two_mode_share: float | None = None
    floor_dependence: float | None = None
    latent: FittedShape | None = None
    latent_scale: tuple[float, float] | None = None
    cut_evidence: float | None = None
    floor_share: float = 1.0  # of the kept rewards at the floor

    @property
    def one_mode(self) -> bool:
        """Are the interiors one-mode on their own (``INTERIOR_TWO_MODE_MAX``; False with too
        few testable streams)?"""
        share = self.two_mode_share
        return share is not None and share < INTERIOR_TWO_MODE_MAX

    @property
    def cut(self) -> bool:
        """Is the floor read as cutting one latent shape (:mod:`stoppers.robust.latent_shape`):
        one-mode interiors, whose streams that reading explains better than this one
        (``cut_evidence`` > ``CUT_EVIDENCE``), their skewness not falling as the share at the
        floor grows (a cut makes the floor-heavy prompts' interiors the more skewed upper
        tails: ``floor_dependence`` >= -``FLOOR_DEPENDENCE_Z``)?"""
        e, z = self.cut_evidence, self.floor_dependence
        if not (self.one_mode and e is not None and e > CUT_EVIDENCE):
            return False
        if self.latent is None or self.latent_scale is None:
            return False
        return z is not None and z >= -FLOOR_DEPENDENCE_Z

    @property
    def shared(self) -> bool:
        """Is the floor read as censoring an interior shape the prompts share whatever the share
        at the floor: one-mode interiors, not read as a cut, their skewness not following that
        share (``FLOOR_DEPENDENCE_Z``), at least ``FLOOR_SHARE_MIN`` of the kept rewards at the
        floor?"""
        z = self.floor_dependence
        if self.floor_share < FLOOR_SHARE_MIN:
            return False  # read only as a cut there (floor_table.CUT_SHARE_MIN)
        return self.one_mode and not self.cut and z is not None and abs(z) <= FLOOR_DEPENDENCE_Z


def fit_censored(
    streams: Sequence[Sequence[float]], floor: FloorBound, requests: int
) -> CensoredShape | None:
    """The censored reading of a deployment: the interior shape fitted to the kept ``streams``'
    rewards above ``floor`` (:func:`~stoppers.robust.floor_table.interior_streams`), their
    scales, the floor's ``g`` and the two tests of a shared interior; None where no interior
    stream has a spread or the fit fails."""
    interior = interior_streams(streams, floor.value)
    counts = scale_counts(interior)
    if counts is None:
        return None
    shape = FittedShape.fit(interior, requests)
    if shape is None:
        return None
    mu, precision = scale_prior(counts)
    with np.errstate(divide="ignore"):
        log_g = np.log(learned_g(floor))
    flags = two_mode_flags(interior)
    share = float(flags.mean()) if flags.size >= INTERIOR_TESTABLE_MIN else None
    reading = CensoredShape(
        interior=shape,
        floor=floor.value,
        log_g=tuple(float(v) for v in log_g),
        scale_mu=mu,
        scale_precision=precision,
        requests=int(requests),
        two_mode_share=share,
        floor_dependence=floor_dependence(streams, floor.value),
        floor_share=floor_share(streams, floor.value),
    )
    if not reading.one_mode:
        return reading  # neither reading decides: the latent fit is not needed
    latent = fit_latent(streams, floor.value, requests)
    scales = latent_scales(streams, floor.value)
    if latent is None or scales is None:
        return reading
    evidence = cut_evidence(streams, reading, latent, scales)
    return replace(reading, latent=latent, latent_scale=scales, cut_evidence=evidence)


def cut_evidence(
    streams: Sequence[Sequence[float]],
    reading: CensoredShape,
    latent: FittedShape,
    latent_scale: tuple[float, float],
) -> float:
    """log Bayes factor of the cut reading over the censored one on the ``streams`` with
    ``MIN_STREAM`` rewards above the floor: each stream's density with its nuisance parameters
    integrated out (:func:`~stoppers.robust.latent_shape.log_evidence`; for the censored reading
    its rewards above the floor under the interior shape, times the chance of the stream's
    floor count under the learned ``g`` of p), summed.

    Why a likelihood and not only the skewness test: that test has little power over 10-30
    streams (z -0.8 to +3.2, mostly under 2, on Tobit deployments of 20-30 requests, scratch
    `ev.py`), while the cut reading wins there by 3-5 per stream and loses by 100-700 per
    stream on the judge family, whose floor lies far below interiors that do not depend on its
    share (docs/robust-stopping.md, "The latent shape under a floor")."""
    floor = reading.floor
    log_g = np.asarray(reading.log_g)
    total = 0.0
    for stream in streams:
        x = np.asarray(stream, dtype=np.float64)
        inside = x[x > floor]
        if inside.size < MIN_STREAM or not np.ptp(inside) > 0.0:
            continue
        at_floor = int(x.size - inside.size)
        cut = log_evidence(latent, inside, at_floor, floor, *latent_scale)
        above = log_evidence(
            reading.interior, inside, 0, floor, reading.scale_mu, reading.scale_precision
        )
        share = special.logsumexp(
            log_g + special.xlogy(inside.size, P_GRID) + special.xlog1py(at_floor, -P_GRID)
        )
        total += cut - above - float(share)
    return total


def floor_dependence(streams: Sequence[Sequence[float]], floor: float) -> float | None:
    """r sqrt(m - 1), r the Spearman correlation across the m ``streams`` with
    ``SKEW_MIN_INTERIOR`` rewards above ``floor`` (and a spread there) between their share at the
    floor and their interior's skewness; None for fewer than ``INTERIOR_TESTABLE_MIN`` such
    streams or no variation in either."""
    shares, skews = [], []
    for stream in streams:
        x = np.asarray(stream, dtype=np.float64)
        inside = x[x > floor]
        if inside.size >= SKEW_MIN_INTERIOR and inside.std() > 0.0:
            shares.append(1.0 - inside.size / x.size)
            skews.append(float(stats.skew(inside)))
    m = len(shares)
    if m < INTERIOR_TESTABLE_MIN or np.ptp(shares) == 0.0 or np.ptp(skews) == 0.0:
        return None
    r = float(stats.spearmanr(shares, skews)[0])
    return r * math.sqrt(m - 1) if math.isfinite(r) else None


class CensoredGain:
    """One request's censored gain: its rewards above the floor and the posterior of p, kept
    draw by draw (:meth:`note`), the gain computed on demand (:meth:`gain`)."""

    def __init__(self, shape: CensoredShape, alpha: float) -> None:
        self.shape = shape
        self.alpha = alpha
        self._weights_p = np.exp(np.asarray(shape.log_g) - max(shape.log_g))
        self._inside: list[float] = []
        self.rewards: list[float] = []

    @property
    def above(self) -> int:
        """Rewards seen above the floor."""
        return len(self._inside)

    def note(self, reward: float) -> None:
        self.rewards.append(reward)
        if reward > self.shape.floor:
            self._inside.append(reward)

    def p_nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(p, weight): p's posterior given the draws so far, in at most ``P_NODES`` nodes."""
        a, n = len(self._inside), len(self.rewards)
        with np.errstate(divide="ignore"):
            log_like = (a * np.log(P_GRID) if a else 0.0) + (
                (n - a) * np.log1p(-P_GRID) if n > a else 0.0
            )
            log_post = np.log(self._weights_p) + log_like
        if not np.isfinite(log_post.max()):  # draws the learned g rules out: the draws alone
            log_post = log_like
        w = np.exp(log_post - log_post.max())
        w /= w.sum()
        keep = w >= P_WEIGHT_MIN
        p, w = P_GRID[keep], w[keep] / w[keep].sum()
        if p.size <= P_NODES:
            return p, w
        slot = np.minimum((np.cumsum(w) - 0.5 * w) * P_NODES, P_NODES - 1).astype(np.int64)
        mass = np.bincount(slot, weights=w, minlength=P_NODES)
        used = mass > 0.0
        mean = np.bincount(slot, weights=w * p, minlength=P_NODES)[used] / mass[used]
        return mean, mass[used]

    def gain(self, best: float) -> tuple[float, float]:
        """(one-step gain, posterior mean of kappa) with the best ``best`` above the floor and
        at least one reward above it."""
        shape = self.shape
        if shape.cut:
            return self._cut_gain(best)
        interior = shape.interior
        if len(self._inside) >= 2:
            m, s, w = interior.posterior(
                np.asarray(self._inside), shape.scale_mu, shape.scale_precision
            )
        else:
            m, s, w = _one_reward_nodes(
                interior, self._inside[0], shape.scale_mu, shape.scale_precision
            )
        total = kappa = 0.0
        for p, weight in zip(*self.p_nodes(), strict=True):
            inner_alpha = 1.0 - (1.0 - self.alpha) / p if p > 0.0 else -math.inf
            if inner_alpha <= 0.0:  # kappa is the floor: any reward above it accepts
                kappa += weight * shape.floor
                continue
            z_alpha = interior.quantile(inner_alpha)
            total += weight * p * float(w @ interior.node_gains(m, s, best, z_alpha))
            kappa += weight * float(w @ (m + s * z_alpha))
        return total, kappa

    def _cut_gain(self, best: float) -> tuple[float, float]:
        """The gain where the floor cuts one latent shape: the continuous path's gain, the
        request's latent (m, s) integrated over the posterior of its rewards above the floor and
        its count at it (:func:`~stoppers.robust.latent_shape.latent_posterior`)."""
        shape = self.shape
        latent, scale = shape.latent, shape.latent_scale
        assert latent is not None and scale is not None  # shape.cut
        at_floor = len(self.rewards) - len(self._inside)
        m, s, w = latent_posterior(latent, np.asarray(self._inside), at_floor, shape.floor, *scale)
        z_alpha = latent.quantile(self.alpha)
        kappa = np.maximum(m + s * z_alpha, shape.floor)
        return float(w @ latent.node_gains(m, s, best, z_alpha)), float(w @ kappa)


def _one_reward_nodes(
    interior: FittedShape, x: float, scale_mu: float, scale_precision: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, s, weights) for a request with one reward ``x`` above the floor: log s at the
    Gauss-Hermite nodes of the interior scales' prior, and m = x - s z at ``ONE_REWARD_Z``
    mid-quantiles z of the interior shape (the posterior of m under a flat prior)."""
    cdf = np.cumsum(interior.p)
    levels = (np.arange(ONE_REWARD_Z) + 0.5) / ONE_REWARD_Z
    z = CENTRES[np.minimum(np.searchsorted(cdf, levels), CENTRES.size - 1)]
    s = np.exp(scale_mu + _GH_X / math.sqrt(scale_precision))
    m = x - np.outer(s, z)
    weights = np.repeat(_GH_W / ONE_REWARD_Z, ONE_REWARD_Z)
    return m.ravel(), np.repeat(s, ONE_REWARD_Z), weights
