"""The latent shape under a floor: rewards read as one shape cut at the floor (a Tobit reading).

Why: where rewards pile up at a floor, cost mode's censored reading
(:mod:`stoppers.robust.censored_cost`) models a prompt as drawing above the floor with its own
probability p, and there from an interior shape the prompts share whatever p. A floor that cuts
one latent distribution - a judge's logit clipped at its bottom, a score floored at zero - breaks
that: the more of a prompt the floor takes, the more its interior is a skewed upper tail, so the
interiors share no shape (``floor_dependence`` finds their skewness following the share at the
floor) and every request there ran the cold start: 0.995 of the best fixed N at c = 1e-3 on a
normal cut at its floor (docs/robust-stopping.md, "The latent shape under a floor").

Read as a cut, a prompt's rewards are max(floor, m + s Z) with Z from a shape the prompts share.
A reward above the floor has density f((x - m) / s) / s, a reward at the floor probability
F((floor - m) / s). The shape is fitted to the kept streams by EM as on the continuous
likelihood path (:mod:`stoppers.robust.shape_likelihood`: each stream's (m, log s) integrated
out on nodes around a first estimate, the histogram smoothed and re-standardised), a reward at
the floor spreading its expected count over the bins under its node's cut. A request's benchmark
is m + s z_alpha (the floor where that lies below it), and a draw gains only above the best,
which lies above the floor: Weitzman's gain (Definitions "Fair-cap value", "Weitzman's
Algorithm") is the continuous path's, with (m, s) integrated over the posterior of the request's
rewards above the floor and its count at it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from scipy import ndimage, special

from stoppers.robust.likelihood_cost import CENTRES, EDGES, WIDTH, FittedShape, _grouped
from stoppers.robust.shape_likelihood import (
    EM_BINS,
    EM_ITERATIONS,
    MIN_STREAM,
    NODES,
    SMOOTHING,
    TAIL_MASS,
    _gpd_tail,
    standardise_shape,
)

__all__ = [
    "LATENT_GRID",
    "fit_latent",
    "latent_posterior",
    "latent_scales",
    "log_evidence",
    "tobit_start",
]

LATENT_GRID = 21  # per axis of a request's (m, log s) posterior grid
LATENT_SPAN = 5.0  # the grid's half-width, in first-estimate standard errors
_LOG_FLOOR = 1e-12
_LAST = float(CENTRES[-1] - CENTRES[0])


def tobit_start(
    inside: np.ndarray, at_floor: int, scale: float | None = None
) -> tuple[float, float] | None:
    """(m, s): a first estimate of a cut normal's location and scale from the rewards above the
    floor and the count at it - the rewards above regressed on the normal quantiles of their
    plotting positions (the floor takes the lowest ``at_floor`` of them). With fewer than three
    rewards above, or a non-positive slope, s is ``scale`` (None: no estimate)."""
    x = np.sort(np.asarray(inside, dtype=np.float64))
    n = x.size + at_floor
    if x.size == 0:
        return None
    q = special.ndtri((at_floor + np.arange(1, x.size + 1) - 0.5) / n)
    if x.size >= 3 and np.ptp(x) > 0.0:
        slope, intercept = np.polyfit(q, x, 1)
        if slope > 0.0:
            return float(intercept), float(slope)
    if scale is None:
        return None
    return float(np.mean(x - scale * q)), float(scale)


def _first_estimates(
    streams: Sequence[Sequence[float]], floor: float
) -> Iterator[tuple[np.ndarray, int, float, float]]:
    """(rewards above ``floor``, count at it, m0, s0) of each stream with ``MIN_STREAM`` rewards
    above the floor and a :func:`tobit_start` of its own: what the fit and the scale prior read."""
    for stream in streams:
        x = np.asarray(stream, dtype=np.float64)
        inside = x[x > floor]
        at_floor = int(x.size - inside.size)
        start = tobit_start(inside, at_floor)
        if inside.size >= MIN_STREAM and start is not None:
            yield inside, at_floor, *start


class _CutNodes:
    """Every stream's rewards above the floor standardised at every (m, log s) node (EM bin
    indices), and each node's cut: the bin the floor falls in."""

    def __init__(self, streams: Sequence[Sequence[float]], floor: float) -> None:
        bins, cuts, lengths, counts, log_weight = [], [], [], [], []
        for inside, at_floor, m0, s0 in _first_estimates(streams, floor):
            n = inside.size
            # m's standard error s sqrt(N) / n, capped at s as on a request's grid (_log_grid)
            mu = m0 + s0 * min(math.sqrt(n + at_floor) / n, 1.0) * NODES
            log_sigma = math.log(s0) + NODES / math.sqrt(2.0 * (n - 1))
            sigma = np.exp(log_sigma)
            z = (inside[None, None, :] - mu[:, None, None]) / sigma[None, :, None]
            bins.append(_bin(z).ravel())
            cuts.append(_bin((floor - mu[:, None]) / sigma[None, :]).ravel())
            lengths.append(n)
            counts.append(at_floor)
            log_weight.append(np.broadcast_to(-n * log_sigma, (NODES.size, NODES.size)).ravel())
        self.streams = len(lengths)
        if not lengths:
            return
        self.bins = np.concatenate(bins)
        self.cuts = np.stack(cuts)  # (streams, nodes)
        self.lengths = np.array(lengths)
        self.at_floor = np.array(counts, dtype=np.float64)
        self.log_weight = np.stack(log_weight)
        self.per_node = np.repeat(self.lengths, NODES.size**2)
        self.starts = np.concatenate([[0], np.cumsum(self.per_node)[:-1]])

    def step(self, f: np.ndarray) -> np.ndarray:
        """One EM step with smoothing: the expected bin counts of every reward under f, those
        at the floor spread over the bins under their node's cut in proportion to f."""
        log_f = np.log(np.maximum(f, _LOG_FLOOR) / WIDTH)
        below = np.concatenate([[0.0], np.cumsum(f)[:-1]]) + 0.5 * f  # mass under a bin's middle
        log_like = np.add.reduceat(log_f[self.bins], self.starts).reshape(self.streams, -1)
        log_like += self.log_weight + self.at_floor[:, None] * np.log(
            np.maximum(below[self.cuts], _LOG_FLOOR)
        )
        post = np.exp(log_like - log_like.max(axis=1, keepdims=True))
        post /= post.sum(axis=1, keepdims=True)
        counts = np.bincount(
            self.bins, weights=np.repeat(post.ravel(), self.per_node), minlength=f.size
        )
        # a floor reward at a node with cut c is in bin b < c with chance f_b / below_c (half of
        # bin c itself): accumulate its weight at c, then sum the weights of the cuts above b
        at_cut = post * self.at_floor[:, None] / np.maximum(below[self.cuts], _LOG_FLOOR)
        acc = np.bincount(self.cuts.ravel(), weights=at_cut.ravel(), minlength=f.size)
        above = np.concatenate([np.cumsum(acc[::-1])[::-1][1:], [0.0]])
        counts += f * (above + 0.5 * acc)
        return ndimage.gaussian_filter1d(counts, SMOOTHING / WIDTH, mode="constant")


def _bin(z: np.ndarray) -> np.ndarray:
    return np.clip(((z - EDGES[0]) / WIDTH).astype(np.int32), 0, EM_BINS - 1)


def fit_latent(
    streams: Sequence[Sequence[float]], floor: float, requests: int
) -> FittedShape | None:
    """The latent shape (mean 0, sd 1) of the kept ``streams`` cut at ``floor``, its upper
    tenth a GPD fitted to the histogram's (as :func:`~stoppers.robust.shape_likelihood.fit_shape`);
    None without a stream of ``MIN_STREAM`` rewards above the floor."""
    data = _CutNodes(streams, floor)
    if data.streams == 0:
        return None
    f = np.diff(special.ndtr(EDGES))  # start from the normal shape
    for _ in range(EM_ITERATIONS):
        f = standardise_shape(data.step(f / f.sum()), EDGES)
    p = _gpd_tail(f / f.sum(), EDGES, TAIL_MASS)
    return FittedShape(p=p, requests=int(requests), streams=data.streams, tied=0.0)


def latent_scales(streams: Sequence[Sequence[float]], floor: float) -> tuple[float, float] | None:
    """Mean and precision of log s across the ``streams``' first estimates (:func:`tobit_start`),
    the prior of a request's latent scale; None for fewer than two estimates."""
    logs = [math.log(s0) for *_, s0 in _first_estimates(streams, floor)]
    if len(logs) < 2:
        return None
    var = max(float(np.var(logs, ddof=1)), 0.01)  # precision capped at 100, as scale_prior
    return float(np.mean(logs)), 1.0 / var


def latent_posterior(
    shape: FittedShape,
    inside: np.ndarray,
    at_floor: int,
    floor: float,
    scale_mu: float,
    scale_precision: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, s, weights): a request's posterior over its latent location and scale, from its
    rewards above the floor (``inside``, at least one) and its count at it: sum log f((x - m) /
    s) - n log s + at_floor log F((floor - m) / s), plus the log-scale prior N(scale_mu,
    1 / scale_precision), flat in m, on ``LATENT_GRID``^2 nodes around :func:`tobit_start`."""
    m, s, log_post, _ = _log_grid(shape, inside, at_floor, floor, scale_mu, scale_precision)
    w = np.exp(log_post - log_post.max())
    keep = w > 1e-6
    return m[keep], s[keep], w[keep] / w[keep].sum()


def log_evidence(
    shape: FittedShape,
    inside: np.ndarray,
    at_floor: int,
    floor: float,
    scale_mu: float,
    scale_precision: float,
) -> float:
    """log of the probability density of a stream - its rewards ``inside`` above the floor in
    their order, ``at_floor`` of them at it - under the shape cut at ``floor``, (m, log s)
    integrated out (m flat, log s the normal prior): :func:`latent_posterior`'s grid summed.
    With ``at_floor`` = 0 it is the uncut shape's evidence for the rewards."""
    _, _, log_post, log_cell = _log_grid(shape, inside, at_floor, floor, scale_mu, scale_precision)
    return float(special.logsumexp(log_post)) + log_cell


def _log_grid(
    shape: FittedShape,
    inside: np.ndarray,
    at_floor: int,
    floor: float,
    scale_mu: float,
    scale_precision: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(m, s, log likelihood + log prior density of log s, log of a node's cell) on the grid."""
    x = np.asarray(inside, dtype=np.float64)
    n = x.size
    start = tobit_start(x, at_floor, math.exp(scale_mu))
    assert start is not None  # a scale is given
    m0, s0 = start
    axis = np.linspace(-LATENT_SPAN, LATENT_SPAN, LATENT_GRID)
    step = axis[1] - axis[0]
    log_span = 1.0 / math.sqrt(scale_precision) if n < 3 else 1.0 / math.sqrt(2.0 * (n - 1))
    log_span = min(log_span, 1.0)
    # m's standard error, about s sqrt(N) / n with N = n + at_floor, but no wider than s: with
    # one or two rewards above many at the floor the floor's count places m within about s
    # (an uncapped grid erred by 0.2 s in its posterior mean of m there, against 81 x 81 nodes)
    m_span = s0 * min(math.sqrt(n + at_floor) / n, 1.0)
    log_s = math.log(s0) + np.tile(axis, LATENT_GRID) * log_span
    s = np.exp(log_s)
    m = m0 + np.repeat(axis, LATENT_GRID) * m_span
    values, counts = _grouped(x)  # past REWARD_BINS rewards, their bins' means and counts
    u = np.clip((values[None, :] - m[:, None]) / s[:, None] - CENTRES[0], 0.0, _LAST) / WIDTH
    i = np.minimum(u.astype(np.int64), EM_BINS - 2)
    t = u - i
    log_f = np.log(np.maximum(shape.p, _LOG_FLOOR) / WIDTH)
    terms = (1.0 - t) * log_f[i] + t * log_f[i + 1]  # log f linear between bin centres
    log_post = (terms.sum(axis=1) if counts is None else terms @ counts) - n * log_s
    if at_floor:
        cdf = np.cumsum(shape.p)
        below = np.interp((floor - m) / s, EDGES[1:], cdf, left=0.0, right=1.0)
        log_post += at_floor * np.log(np.maximum(below, _LOG_FLOOR))
    log_post += 0.5 * math.log(scale_precision / (2.0 * math.pi))
    log_post -= 0.5 * scale_precision * (log_s - scale_mu) ** 2
    return m, s, log_post, math.log(step * m_span * step * log_span)
