"""A deployment's standardised reward shape, estimated by likelihood from raw reward streams.

Why: the target-mode stop table (:mod:`stoppers.robust.shape_prior`) is only as good as the shape it
is built on, and the delivered acceptance is steep in the shape's alpha-quantile (measured on
exponential rewards at target 0.7: a 0.99-quantile of 3.29 instead of 3.59 delivers 0.64, 3.66
delivers 0.74). The histogram :class:`ShapePrior` records - each draw standardised by the mean and
sd before it, mapped through normal theory - is exact only for normal rewards; on Gumbel,
exponential or skewed rewards its body comes out too wide and its tail too light however many
requests it learns from (docs/robust-stopping.md, "What limits the target promise").

The likelihood does not depend on the stopping rule: a request that stopped after n rewards
contributes prod_k f((x_k - mu) / sigma) / sigma whatever rule stopped it (the stop decisions
are functions of the data alone), so the maximum-likelihood shape of stopped streams is
consistent. Each request's location mu and scale sigma are nuisance parameters, integrated out
on a grid with the location-scale invariant weight d mu d log sigma (the rule is location
invariant; its scale dependence is mild). The shape f is a histogram fitted by EM with a
smoothing step (EMS: Silverman, Jones, Wilson & Nychka 1990): the E-step weighs each request's
(mu, sigma) grid nodes by their likelihood under the current f, the M-step re-histograms the
standardised draws with those weights, then smooths and re-standardises.

The far tail (where kappa lives) is thin in a few thousand draws, so above the 0.9-quantile
the histogram is replaced by a generalised Pareto tail fitted to it by weighted maximum
likelihood (peaks over threshold, as in :mod:`stoppers.robust.gpd_tail`): that pools the
evidence of the top decile into two parameters and steadies the 0.99-quantile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from scipy import ndimage, optimize, special, stats

__all__ = [
    "MIN_STREAM",
    "ChosenShape",
    "ShapeFits",
    "fit_shape",
    "fit_shape_with_end",
    "fit_shapes",
    "standardise_shape",
]

MIN_STREAM = 4  # rewards a stream needs before its sd says anything
NODES = np.linspace(-6.0, 6.0, 13)  # nuisance grid, in normal-theory standard errors
EM_LO, EM_HI, EM_BINS = -8.0, 8.0, 320  # EM histogram: bin width 0.05
_EM_EDGES = np.linspace(EM_LO, EM_HI, EM_BINS + 1)
EM_ITERATIONS = 60  # 0.9- and 0.99-quantiles move < 0.02 between 30 and 1000 iterations
SMOOTHING = 0.1  # sd of the Gaussian smoothing step, in standardised units
TAIL_MASS = 0.1  # the GPD replaces the histogram above this upper-tail probability
XI_RANGE = (-0.5, 0.9)  # bounded (clipped) to heavy (Student-t(1.1)) tails
END_XI_RANGE = (-1.0, 0.9)  # the streams' tail fit reaches the uniform's xi = -1
# A bounded tail fitted to the streams replaces the histogram's when it raises their log marginal
# likelihood by this much: half the 0.999-point of chi-square(2), the two tail parameters. Fits to
# 40 streams of 20-100 rewards (5 seeds each; docs/robust-stopping.md, "A shape's end read from
# the streams") gained 17-60 on uniform, reflected-exponential and sigmoid streams, 0-1.1 on
# normal, Gumbel, Student-t and lognormal ones, 2.0-6.8 on exponential and 1.0-8.9 on a normal
# mixture (whose 0.99-quantile the streams' fit placed better).
END_EVIDENCE = 6.9
# The histogram keeps its own upper tail where the streams favour it over the GPD tail by more
# than this in log marginal likelihood (:func:`_tail_has_a_mode`). Fits to streams of 20-96
# rewards (3 seeds each; docs/robust-stopping.md, "A better mode in the top tenth"): on 256
# streams 221-273 for rare-mode and three-mode, at most 16 for normal, Gumbel, Student-t,
# logistic and mixture, below 0 for lognormal, exponential and pareto; on 40 streams 32-52 for
# the two, at most 13 for eight families without a mode in the top tenth. The histogram's extra
# freedom buys about the same on few streams as on many; a real mode's evidence grows with the
# streams.
TAIL_MODE_EVIDENCE = 25.0


def fit_shape(streams: Sequence[Sequence[float]], edges: np.ndarray) -> np.ndarray | None:
    """The standardised shape (mean 0, sd 1) as probabilities of the bins ``edges``, its tail
    the histogram's (:func:`fit_shape_with_end` lets the streams end it).

    ``streams``: each request's rewards in observation order (streams with fewer than
    ``MIN_STREAM`` rewards or no spread are skipped). None if no stream is usable.
    """
    fit = fit_shapes(streams, edges, read_end=False)
    return None if fit is None else fit.open


class ChosenShape(NamedTuple):
    """The shape :func:`fit_shape_with_end` chose from :func:`fit_shapes`' reading: the shape
    (bin probabilities; the ended one where the streams end the tail), whether they ended it (a
    bounded GPD fitted to them beat the histogram's tail, :func:`_ended_tail`), and whether they
    showed a better mode in its top tenth, so that it keeps the histogram's own tail
    (:func:`_tail_has_a_mode`)."""

    shape: np.ndarray
    ended: bool
    tail_mode: bool


def fit_shape_with_end(streams: Sequence[Sequence[float]], edges: np.ndarray) -> ChosenShape | None:
    """:func:`fit_shape`, with the streams' end and the mode in the tail read
    (:class:`ChosenShape`): the ended shape where the streams end the tail, else the open one. The
    EM's settings are :func:`fit_shapes`'s."""
    fit = fit_shapes(streams, edges)
    if fit is None:
        return None
    open_shape, ended, tail_mode = fit
    if ended is None:
        return ChosenShape(open_shape, False, tail_mode)
    return ChosenShape(ended, True, False)


class ShapeFits(NamedTuple):
    """:func:`fit_shapes`' reading: the open shape, the ended one (None where the streams do not
    end the tail), and whether the open shape kept the histogram's own tail for a mode in it."""

    open: np.ndarray
    ended: np.ndarray | None
    tail_mode: bool


def fit_shapes(
    streams: Sequence[Sequence[float]],
    edges: np.ndarray,
    *,
    iterations: int = EM_ITERATIONS,
    smoothing: float = SMOOTHING,
    tail_mass: float = TAIL_MASS,
    read_end: bool = True,
) -> ShapeFits | None:
    """(open, ended, tail mode) from one EM fit: the shape with the histogram's tail and, where
    the streams end the tail (:func:`_ended_tail`; not tested without ``read_end``), the shape
    with their bounded tail (else None). The open shape's tail is a GPD fitted to the
    histogram's, unless the streams do not end the tail and show a better mode in it
    (:func:`_tail_has_a_mode`): then it is the histogram's own, and ``tail_mode`` is True. None
    if no stream is usable."""
    data = _Nodes.of(streams)
    if data is None:
        return None
    width = (EM_HI - EM_LO) / EM_BINS
    f = np.diff(special.ndtr(_EM_EDGES))  # start from the normal shape
    for _ in range(iterations):
        f = standardise_shape(_em_step(data, f / f.sum(), width, smoothing), _EM_EDGES)
    f = f / f.sum()
    ended = _ended_tail(data, f, _EM_EDGES, tail_mass) if read_end else None
    if ended is None and _tail_has_a_mode(data, f, width, tail_mass):
        return ShapeFits(_rebin(f, _EM_EDGES, edges), None, True)  # the histogram's own tail
    open_shape = _gpd_tail(_rebin(f, _EM_EDGES, edges), edges, tail_mass)
    return ShapeFits(open_shape, None if ended is None else _rebin(ended, _EM_EDGES, edges), False)


def _tail_has_a_mode(data: _Nodes, f: np.ndarray, width: float, tail_mass: float) -> bool:
    """True where the streams' log marginal likelihood under the EM histogram ``f`` beats that
    under ``f`` with its GPD tail (:func:`_gpd_tail`) by more than ``TAIL_MODE_EVIDENCE``.

    Why: a GPD tail falls monotonically, so a better mode among the top tenth of the rewards
    (a few percent of much better answers) is smoothed into a long tail that puts the
    0.99-quantile too low and the 0.999-quantile far too high (measured on rare-mode streams:
    3.53 and 7.29 against the true 3.79 and 4.73; the histogram's own tail 3.83 and 4.51), and
    target mode under-delivered on rare-mode rewards at sd 3.5 (docs/robust-stopping.md,
    "A better mode in the top tenth"). There the histogram's tail wins by 32-52 in log
    likelihood on 40 streams (220-273 on 256); on eleven families without such a mode (eight
    at each count) it won by at most 16 or lost.
    """
    gpd = _gpd_tail(f, _EM_EDGES, tail_mass)
    return _log_evidence(data, f, width) - _log_evidence(data, gpd, width) > TAIL_MODE_EVIDENCE


class _Nodes:
    """Every stream's draws standardised at every (mu, log sigma) node, as EM bin indices."""

    def __init__(self, bins: np.ndarray, lengths: np.ndarray, log_weight: np.ndarray) -> None:
        self.bins = bins  # flat: stream, node, draw
        self.lengths = lengths  # draws per stream
        self.log_weight = log_weight  # (streams, nodes): -n log sigma (the Jacobian)
        per_node = np.repeat(lengths, NODES.size**2)
        self.starts = np.concatenate([[0], np.cumsum(per_node)[:-1]])
        self.per_node = per_node

    @classmethod
    def of(cls, streams: Sequence[Sequence[float]]) -> _Nodes | None:
        bins, lengths, log_weight = [], [], []
        width = (EM_HI - EM_LO) / EM_BINS
        for stream in streams:
            x = np.asarray(stream, dtype=np.float64)
            n = x.size
            if n < MIN_STREAM or not np.all(np.isfinite(x)):
                continue
            sd = float(x.std(ddof=1))
            if not sd > 0.0:
                continue
            # normal-theory standard errors: mean sd / sqrt(n), log sd 1 / sqrt(2 (n - 1))
            mu = float(x.mean()) + sd / math.sqrt(n) * NODES
            log_sigma = math.log(sd) + NODES / math.sqrt(2.0 * (n - 1))
            z = (x[None, None, :] - mu[:, None, None]) / np.exp(log_sigma)[None, :, None]
            bins.append(np.clip(((z - EM_LO) / width).astype(np.int32), 0, EM_BINS - 1).ravel())
            lengths.append(n)
            log_weight.append(np.broadcast_to(-n * log_sigma, (NODES.size, NODES.size)).ravel())
        if not lengths:
            return None
        return cls(np.concatenate(bins), np.array(lengths), np.stack(log_weight))


def _node_log_likelihood(data: _Nodes, f: np.ndarray, width: float) -> np.ndarray:
    """(streams, nodes): each stream's log likelihood under the shape f at each nuisance node."""
    log_f = np.log(np.maximum(f, 1e-12) / width)
    streams = data.lengths.size
    log_like = np.add.reduceat(log_f[data.bins], data.starts).reshape(streams, -1)
    return log_like + data.log_weight


def _log_evidence(data: _Nodes, f: np.ndarray, width: float) -> float:
    """The streams' log marginal likelihood under f, each one's location and scale integrated
    out on its nodes (up to a constant shared by every f): what the EM climbs."""
    return float(special.logsumexp(_node_log_likelihood(data, f, width), axis=1).sum())


def _em_step(data: _Nodes, f: np.ndarray, width: float, smoothing: float) -> np.ndarray:
    """One EM step with smoothing: expected bin counts of the draws under f, smoothed."""
    log_like = _node_log_likelihood(data, f, width)
    post = np.exp(log_like - log_like.max(axis=1, keepdims=True))
    post /= post.sum(axis=1, keepdims=True)
    weights = np.repeat(post.ravel(), data.per_node)  # each draw weighs as its node
    counts = np.bincount(data.bins, weights=weights, minlength=f.size)
    return ndimage.gaussian_filter1d(counts, smoothing / width, mode="constant")


def standardise_shape(f: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """f re-binned as the law of (Z - mean) / sd: the shape is only defined up to location and
    scale (each stream's own are integrated out), so it is pinned to mean 0 and sd 1."""
    p = f / f.sum()
    centres = 0.5 * (edges[:-1] + edges[1:])
    mean = float(p @ centres)
    sd = math.sqrt(float(p @ (centres - mean) ** 2))
    cdf = np.concatenate([[0.0], np.cumsum(p)])
    out = np.diff(np.interp(mean + sd * edges, edges, cdf))  # P((Z - mean) / sd <= e)
    return out / out.sum()


def _rebin(p: np.ndarray, old_edges: np.ndarray, new_edges: np.ndarray) -> np.ndarray:
    """Probabilities on ``old_edges`` moved to ``new_edges`` (CDF linear within a bin)."""
    cdf = np.concatenate([[0.0], np.cumsum(p)])
    out = np.diff(np.interp(new_edges, old_edges, cdf))
    return out / out.sum()


def _upper_tail(
    p: np.ndarray, edges: np.ndarray, tail_mass: float
) -> tuple[int, np.ndarray, float, float] | None:
    """(start, y, mass, mean excess) of the bins above the (1 - tail_mass)-quantile, the part a
    GPD replaces: the first such bin, their centres' exceedances y over its lower edge, their
    probability and its mean y. None if fewer than three bins or no mass lie there. Shared by
    :func:`_gpd_tail` and :func:`_ended_tail`, whose likelihoods are compared on the same
    split."""
    start = int(np.searchsorted(np.cumsum(p), 1.0 - tail_mass)) + 1
    if start >= p.size - 2:
        return None
    y = 0.5 * (edges[start:-1] + edges[start + 1 :]) - edges[start]
    mass = float(p[start:].sum())
    if not mass > 0.0:
        return None
    return start, y, mass, max(float(p[start:] @ y) / mass, 1e-6)


def _gpd_tail(p: np.ndarray, edges: np.ndarray, tail_mass: float) -> np.ndarray:
    """Above the (1 - tail_mass)-quantile, the GPD fitted to the histogram's exceedances."""
    split = _upper_tail(p, edges, tail_mass)
    if split is None:
        return p
    start, y, mass, mean_excess = split
    weight = p[start:]

    def neg_log_like(theta: np.ndarray) -> float:
        log_pdf = _gpd_log_pdf(y, float(theta[0]), math.exp(float(theta[1])))
        used = weight > 0.0
        value = -float(weight[used] @ log_pdf[used]) / mass
        return value if math.isfinite(value) else 1e9

    start_point = np.array([0.0, math.log(mean_excess)])
    simplex = start_point + np.array([[0.0, 0.0], [0.2, 0.0], [0.0, 0.3]])
    fit = optimize.minimize(
        neg_log_like,
        start_point,
        method="Nelder-Mead",
        options={"initial_simplex": simplex, "xatol": 1e-4, "fatol": 1e-9},
    )
    xi = float(np.clip(fit.x[0], *XI_RANGE))
    density = np.exp(_gpd_log_pdf(y, xi, math.exp(float(fit.x[1]))))
    if not density.sum() > 0.0:
        return p
    out = p.copy()
    out[start:] = mass * density / density.sum()
    return out / out.sum()


def _ended_tail(
    data: _Nodes, f: np.ndarray, em_edges: np.ndarray, tail_mass: float
) -> np.ndarray | None:
    """The EM shape ``f`` with its tail above the (1 - tail_mass)-quantile a GPD fitted to the
    streams' marginal likelihood, standardised; None unless that GPD is bounded (xi < 0) and
    beats :func:`_gpd_tail`'s by ``END_EVIDENCE``.

    Why: smoothing and the nuisance spread carry the histogram's mass past where rewards end,
    and a tail fitted to the histogram follows it there; the streams do not: a draw past the
    end is impossible at every node that puts it there. Where the streams' fit is open, or
    not clearly better, the histogram's tail stays: it is the steadier fit of an open tail
    (Student-t's 0.99-quantile erred by +0.10 with it, +0.20 fitted to the streams).
    """
    width = float(em_edges[1] - em_edges[0])
    split = _upper_tail(f, em_edges, tail_mass)
    if split is None:
        return None
    start, _, mass, mean_excess = split
    y_edges = em_edges[start:] - em_edges[start]

    def with_tail(xi: float, beta: float) -> np.ndarray:
        cdf = stats.genpareto.cdf(y_edges, xi, scale=beta)
        out = f.copy()
        out[start:] = mass * np.diff(cdf) / cdf[-1]
        return out

    def neg_log_evidence(theta: np.ndarray) -> float:
        value = -_log_evidence(data, with_tail(float(theta[0]), math.exp(float(theta[1]))), width)
        return value if math.isfinite(value) else 1e300

    start_point = np.array([-0.5, math.log(1.5 * mean_excess)])  # GPD mean excess beta/(1-xi)
    fit = optimize.minimize(
        neg_log_evidence,
        start_point,
        method="Nelder-Mead",
        bounds=[END_XI_RANGE, (None, None)],
        options={
            "initial_simplex": start_point + np.array([[0.0, 0.0], [0.3, 0.0], [0.0, 0.3]]),
            "xatol": 1e-3,
            "fatol": 1e-3,
        },
    )
    xi = float(fit.x[0])
    if not xi < 0.0:
        return None
    histogram_tail = _gpd_tail(f, em_edges, tail_mass)
    if -_log_evidence(data, histogram_tail, width) - fit.fun < END_EVIDENCE:
        return None
    return standardise_shape(with_tail(xi, math.exp(float(fit.x[1]))), em_edges)


def _gpd_log_pdf(y: np.ndarray, xi: float, beta: float) -> np.ndarray:
    """log density of GPD(beta, xi) at y >= 0 (-inf past a bounded tail's end point)."""
    if abs(xi) < 1e-9:
        return -math.log(beta) - y / beta
    t = 1.0 + xi * y / beta
    with np.errstate(invalid="ignore", divide="ignore"):
        out = -math.log(beta) - (1.0 / xi + 1.0) * np.log(t)
    return np.where(t > 0.0, out, -np.inf)
