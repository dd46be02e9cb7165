"""The Best-of-N that delivers a target, read from the deployment's own reward streams.

Why: a target table sizes its Best-of-N (``fixed_n``, and the ``cap`` that ends its rule's run)
on streams simulated from one smooth shape fitted to every kept stream. A judge's prompts are
not one smooth shape: each holds its own few lumps (the real pool: 49 responses per prompt, a
floor pile-up of its own share). Averaged over such prompts Best-of-N reaches the benchmark
sooner than on the smooth pooled shape, and the table's N over-delivered: the real pool redrawn
to 960 (`ap05`) got 0.82 / 0.90 / 0.96 for targets 0.7 / 0.8 / 0.9, where its prompts' true
Best-of-N delivers them at N = 42 / 60 / 97 (docs/robust-stopping.md, "Best-of-N sized on the
streams").

Each kept stream is its prompt's sample. Read as a smoothed bootstrap - its values at the
deployment's floor or ceiling kept as atoms, every other one a Gaussian kernel whose width
maximises the leave-one-out likelihood of the stream (a lumpy stream gets narrow kernels, a
smooth one about Silverman's) - each stream is a pseudo-prompt with a distribution function F
and a benchmark kappa, its alpha-quantile. Best-of-N's acceptance on it is
E[AR(max of N - kappa)] = sum over x of AR(x - kappa) (F(x)^N - F(x-)^N), and the N for a
target is the least whose mean over the pseudo-prompts reaches it. Checked against the true N
of the pools' full rows (40 prompts, one random stream of 96 each): 42 / 61 / 98 / 140 against
42 / 60 / 97 / 138 on the real pool redrawn at 0.7 / 0.8 / 0.9 / 0.95, 15 / 27 / 55 / 91 against
15 / 26 / 54 / 97 on normal prompts.

A stream the request's own rule ended may end on the reward that stopped it, which is high by
selection: a stream shorter than the kept length loses its last reward.

Gaussian kernels have light tails. Above a short stream's top they place the 0.99-quantile too
low where the prompt's tail is heavy, and Best-of-N then reaches it too soon: on a Tobit of
Student-t(5) rewards (`cut_t5`) the N read so delivered 0.630 / 0.740 / 0.876 for 0.7 / 0.8 /
0.9. Where tails are bounded or light, the kernels smear the top upward and the N errs high
(over-delivers). So the tables use it only where the deployment's learned tail shapes read
light (:data:`LIGHT_TAIL_XI`, the xi prior's mean).

Nor where the streams are smooth (:data:`LUMPY_WIDTH_RATIO`): there the table's fitted shape
describes every prompt, and the kernels, read from streams that are short and, in the first
requests, stopped by the cold start's rule, only add their noise and bias. Cost mode reads
smooth streams too where the rewards pile up at a floor: there the alternative is its cold
start, not a fitted shape (docs/robust-stopping.md, "Smooth streams on a piled floor").

A top answer scored alike (2026-12-01): a prompt whose one better answer - the correct one -
comes back now and then and gets the same score each time has a tight lump at the top of a
smooth bulk. The bulk sets one likelihood width (about Silverman's, so the width gate reads it
smooth) and that width smears the lump upward: the pseudo-prompt's kappa lies above a lump its
Best-of-N must then hit high. Two things read it. The gate also opens where the streams' tops
cluster (:func:`top_cluster_ratio`, :data:`TOP_CLUSTER_SHARE`), and a kernel in a cluster is
narrowed towards the distance to its nearest neighbour, where the leave-one-out likelihood asks
for it (:func:`cluster_widths`). On 40 prompts of one stream of 96 each, the N read for 0.9 went
40-41 -> 32-33 on `top-lump` (the prompts' own: 26), 14-15 -> 7 on `saturated` (7), 19 -> 15-17
on uniform (14); normal 56-57 -> 58-60 (54), which the gate keeps to the table's shape
(docs/robust-stopping.md, "A top answer scored alike: the streams read in target mode").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.special import ndtr

from stoppers.faircap import acceptance_rate

__all__ = [
    "BOOTSTRAP_MIN_STREAMS",
    "LIGHT_TAIL_XI",
    "LUMPY_WIDTH_RATIO",
    "STREAM_MIN_REWARDS",
    "TOP_CLUSTER_SHARE",
    "TOP_GAP_RATIO",
    "StreamPrompts",
    "best_of_n_acceptance",
    "bootstrap_n",
    "cluster_widths",
    "n_for_target",
    "pseudo_prompts",
    "top_cluster_ratio",
]

# kept streams (after the length cut) before the bootstrap sizes a target table's N and
# calibrates it (cost mode's Best-of-N reads from fewer: cost_prior.STREAMS_N_MIN_STREAMS, and
# STREAMS_N_FLOOR_MIN on a piled floor). Five, not ten (2026-12-02): at a low target the warm
# requests stop after 8-25 rewards, and the long streams are mostly the cold start's. On
# `top-lump` at 0.7, four deployments of 40 kept 5, 11, 11 and 14 streams of 25 or more; the one
# with 5 never read them and ran the smooth shape's table (17-26 draws a request, the prompts'
# own Best-of-N 10). Smooth pools' streams still read smooth from five (docs/robust-stopping.md,
# "Target tables read from five long streams").
BOOTSTRAP_MIN_STREAMS = 5
STREAM_MIN_REWARDS = 24  # a shorter stream says too little about its prompt's top
# the deployment's mean GPD tail shape (XiPrior.mean_xi) at or under which kernels may read its
# tops: after 40 requests -0.66 / -0.69 on the real pool redrawn (`ap05` / `ap15`), -0.47 on
# `judge`, -0.26 on `floored`, -0.17 normal, -0.94 uniform; -0.03 / +0.02 on the Tobits of
# Gumbel and Student-t(5), +0.17 Student-t, +0.05 lognormal, +0.22 pareto, -0.16 `mixed`
LIGHT_TAIL_XI = -0.1
# ... and only where the kept streams are lumpy: the geometric mean over streams of the kernel
# width at most this share of Silverman's (30 streams of 40-96 rewards, six draws: `ap05`
# 0.46-0.71, uniform 0.40-0.48, mixture 0.77-0.85, `ap15` 0.70-0.97; `floored` sd 3.5 0.78-0.96,
# `floored --loc-mean -2` 0.83-1.01, `judge` 1.13-1.27, normal 1.14-1.28, the Tobit of
# Student-t(5) 1.02-1.24). On smooth shapes the table's own is right, and the kernels read from
# short, selected streams were not: `floored` at sd 3.5 delivered 0.663 for 0.7 with them
# (0.722 without)
LUMPY_WIDTH_RATIO = 0.75
# ... or where at least this share of the kept streams' tops cluster: the top normalised
# spacing under TOP_GAP_RATIO of the mean of the next ones (:func:`top_cluster_ratio`). Streams
# of 32-96 rewards (40 prompts, five draws each) read under 0.1 in 0.52-0.80 of `top-lump`'s,
# 0.04-0.23 of normal, Gumbel, Student-t, exponential, lognormal, skew-normal, mixture, `mixed`,
# `rare-mode`, `three-mode`, `wide-lumps`, `varied-skew`, `heavy-t`; 0.24-0.49 on uniform,
# `lumpy`, `ap05` (lumpy by their widths already), `beta`, `clipped`; `saturated` 0.29-0.36
TOP_CLUSTER_SHARE = 0.4
TOP_GAP_RATIO = 0.1
TOP_SPACINGS = 10  # normalised spacings read at a stream's top (at most a quarter of it)
GRID_POINTS = 512  # per stream: where F is evaluated, between the stream's ends +- its kernels
_BANDWIDTH_MULTIPLES = (0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.4)  # of Silverman's
# a kernel in a cluster: at most this many times its distance to its nearest neighbour, the
# multiple (or none) the leave-one-out likelihood prefers; never under CLUSTER_FLOOR of Silverman's
# width (values that repeat exactly would otherwise get no width)
_NEIGHBOUR_MULTIPLES = (0.5, 1.0, 2.0, 4.0)
CLUSTER_FLOOR = 0.02


def loo_bandwidth(values: np.ndarray) -> float:
    """The Gaussian kernel width (among multiples of Silverman's rule) that maximises the
    leave-one-out log likelihood of ``values`` (0: fewer than 3 distinct values)."""
    return _widths(values)[0]


def _widths(values: np.ndarray) -> tuple[float, float]:
    """(:func:`loo_bandwidth`, Silverman's width) of ``values``; (0, 0) under 3 distinct."""
    x = np.asarray(values, dtype=np.float64)
    if np.unique(x).size < 3:
        return 0.0, 0.0
    sd = float(x.std(ddof=1))
    q75, q25 = np.percentile(x, [75.0, 25.0])
    spread = min(sd, (q75 - q25) / 1.34) if q75 > q25 else sd
    base = 0.9 * spread * x.size**-0.2
    d2 = (x[:, None] - x[None, :]) ** 2
    best, width = -np.inf, base
    for m in _BANDWIDTH_MULTIPLES:
        h = base * m
        ll = _loo_log_likelihood(d2, np.full(x.size, h))
        if ll > best:
            best, width = ll, h
    return width, base


def _loo_log_likelihood(d2: np.ndarray, widths: np.ndarray) -> float:
    """Leave-one-out log likelihood of the values whose squared distances are ``d2`` under
    Gaussian kernels of per-value ``widths`` (the sample-point estimator)."""
    k = np.exp(-0.5 * d2 / (widths * widths)[None, :]) / widths[None, :]
    np.fill_diagonal(k, 0.0)
    density = k.sum(axis=1) / (d2.shape[0] - 1)
    return float(np.log(np.maximum(density, 1e-300)).sum())


def cluster_widths(values: np.ndarray, width: float, silverman: float) -> np.ndarray:
    """Per-value kernel widths: ``width`` (:func:`loo_bandwidth`'s), narrowed for a value in a
    cluster to a multiple of its distance to its nearest neighbour, where the leave-one-out
    likelihood prefers one of :data:`_NEIGHBOUR_MULTIPLES` to the one width (module docstring).

    Why: a lump of answers scored alike at the top of a smooth bulk (the correct answer, now
    and then) is a few values a hundredth of the bulk's width apart; one width fits the bulk and
    smears the lump over several times its own spread."""
    x = np.asarray(values, dtype=np.float64)
    plain = np.full(x.size, width)
    if x.size < 3 or width <= 0.0:
        return plain
    d = np.abs(x[:, None] - x[None, :])
    np.fill_diagonal(d, np.inf)
    nearest = d.min(axis=1)
    np.fill_diagonal(d, 0.0)
    d2 = d * d
    best, widths = _loo_log_likelihood(d2, plain), plain
    for m in _NEIGHBOUR_MULTIPLES:
        narrowed = np.maximum(np.minimum(width, m * nearest), CLUSTER_FLOOR * silverman)
        ll = _loo_log_likelihood(d2, narrowed)
        if ll > best:
            best, widths = ll, narrowed
    return widths


def top_cluster_ratio(values: np.ndarray) -> float:
    """The top normalised spacing of ``values`` over the mean of the next ones (NaN: too few
    values, or no spread below the top).

    Why: in a smooth tail the normalised spacings i (v_(i) - v_(i+1)) of the top values are
    about iid exponential, so the first is under a tenth of the others' mean in about a tenth
    of streams; where the stream's top is a lump of answers scored alike it is in most."""
    v = np.sort(np.asarray(values, dtype=np.float64))[::-1]
    m = min(TOP_SPACINGS, v.size // 4)
    if m < 2:
        return math.nan
    spacings = np.arange(1, m + 1) * (v[:m] - v[1 : m + 1])
    rest = float(spacings[1:].mean())
    return float(spacings[0]) / rest if rest > 0.0 else math.nan


@dataclass(frozen=True)
class _Kernels:
    """A stream split at the deployment's ends: its values at the floor and at the ceiling (as
    atoms) and its interior with the kernel width the likelihood chose (and Silverman's), and
    each interior value's own width (:func:`cluster_widths`; read with the F's, not by the
    gate)."""

    size: int
    floor_count: int
    at_ceiling: bool
    inner: np.ndarray
    width: float
    silverman: float

    @cached_property
    def widths(self) -> np.ndarray:
        return cluster_widths(self.inner, self.width, self.silverman)


def _kernels(stream: np.ndarray, floor: float | None, ceiling: float | None) -> _Kernels | None:
    """``stream``'s :class:`_Kernels`; None: under 3 distinct interior values (no spread)."""
    at_floor = np.zeros(stream.size, dtype=bool) if floor is None else stream <= floor
    at_ceiling = np.zeros(stream.size, dtype=bool) if ceiling is None else stream >= ceiling
    inner = stream[~at_floor & ~at_ceiling]
    h, silverman = _widths(inner) if inner.size >= 3 else (0.0, 0.0)
    if h <= 0.0:
        return None
    return _Kernels(stream.size, int(at_floor.sum()), bool(at_ceiling.any()), inner, h, silverman)


def _distribution(
    k: _Kernels, floor: float | None, ceiling: float | None, alpha: float
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(grid, F on it, kappa) of the smoothed bootstrap ``k``; None: F never reaches alpha."""
    h, inner = k.width, k.inner
    lo = inner.min() - 4.0 * h if floor is None else max(floor, inner.min() - 4.0 * h)
    hi = inner.max() + 5.0 * h if ceiling is None else min(ceiling, inner.max() + 5.0 * h)
    grid = np.linspace(lo, hi, GRID_POINTS)
    # values at the clip far above the kernels' reach: the ceiling's atom gets its own point
    gap = ceiling is not None and k.at_ceiling and hi < ceiling
    if gap:
        grid = np.append(grid, ceiling)
    cdf = ndtr((grid[:, None] - inner[None, :]) / k.widths[None, :]).sum(axis=1)
    # kernel mass below the floor joins the floor's atom, above the ceiling the ceiling's
    cdf = (cdf + k.floor_count) / k.size
    if ceiling is not None and grid[-1] >= ceiling:
        cdf[-1] = 1.0
    cdf = np.minimum(np.maximum.accumulate(cdf), 1.0)
    if cdf[-1] < alpha:
        return None
    # in a far ceiling's atom the quantile is the ceiling, not a point of the gap below it; F
    # is flat below lo only at a floor's atom
    in_atom = gap and alpha > cdf[-2]
    kappa = float(grid[-1]) if in_atom else float(np.interp(alpha, cdf, grid))
    return grid, cdf, kappa


@dataclass(frozen=True)
class StreamPrompts:
    """The kept streams read as pseudo-prompts: the geometric mean over streams of the kernel
    width the likelihood chose over Silverman's (under 1: the streams are lumpier than one
    smooth bump; :data:`LUMPY_WIDTH_RATIO`), the share of streams whose top clusters
    (:func:`top_cluster_ratio`), and per stream (log F, AR against kappa) on its grid (what
    :func:`n_for_target` reads).

    Why the prompts are computed on first read: the widths are all the lumpiness gate needs,
    and on a smooth deployment the F's (``GRID_POINTS`` x each stream's rewards) would be
    computed only to be discarded, once per deployment state."""

    kernels: tuple[_Kernels, ...]
    alpha: float
    floor: float | None
    ceiling: float | None

    @cached_property
    def width_ratio(self) -> float:
        ratios = [k.width / k.silverman for k in self.kernels]
        return float(np.exp(np.mean(np.log(ratios)))) if ratios else float("nan")

    @cached_property
    def top_clustered_share(self) -> float:
        """The share of the streams whose top normalised spacing is under :data:`TOP_GAP_RATIO`
        of the next ones' (NaN ratios count as not clustered; NaN: no streams)."""
        ratios = np.array([top_cluster_ratio(k.inner) for k in self.kernels])
        return float(np.mean(ratios < TOP_GAP_RATIO)) if ratios.size else float("nan")

    @property
    def lumpy(self) -> bool:
        """Lumpier than one smooth bump, or topped by a lump in enough streams (module
        docstring): where the kernels read the prompts better than the table's smooth shape."""
        if not self.kernels:
            return False
        return (
            self.width_ratio <= LUMPY_WIDTH_RATIO or self.top_clustered_share >= TOP_CLUSTER_SHARE
        )

    @cached_property
    def _read(self) -> list[tuple[_Kernels, np.ndarray, np.ndarray, float]]:
        """(kernels, grid, F, kappa) of each stream whose F reaches alpha."""
        read = []
        for k in self.kernels:
            dist = _distribution(k, self.floor, self.ceiling, self.alpha)
            if dist is not None:
                read.append((k, *dist))
        return read

    @cached_property
    def prompts(self) -> list[tuple[np.ndarray, np.ndarray]]:
        prompts = []
        for _, grid, cdf, kappa in self._read:
            with np.errstate(divide="ignore"):
                prompts.append((np.log(cdf), acceptance_rate(grid, kappa)))
        return prompts

    def draw(
        self, streams: int, length: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``streams`` simulated reward streams of ``length`` draws, from the pseudo-prompts in
        turn, and each one's kappa: the smoothed bootstrap itself - one of the stream's rewards
        at random, a value at the floor or the ceiling kept as it is, any other moved by its
        kernel's width and kept within the ends (what :func:`_distribution` reads)."""
        read = self._read
        x = np.empty((streams, length))
        kappa = np.empty(streams)
        lo = -np.inf if self.floor is None else self.floor
        hi = np.inf if self.ceiling is None else self.ceiling
        for i in range(streams):
            k, _, _, kappa[i] = read[i % len(read)]
            pick = rng.integers(0, k.size, length) - k.floor_count  # < 0: the floor's atom
            inner = pick < k.inner.size
            value = np.clip(pick, 0, k.inner.size - 1)
            moved = k.inner[value] + k.widths[value] * rng.standard_normal(length)
            x[i] = np.where(pick < 0, lo, np.where(inner, np.clip(moved, lo, hi), hi))
        return x, kappa


def pseudo_prompts(
    streams: Sequence[Sequence[float]],
    *,
    alpha: float,
    floor: float | None = None,
    ceiling: float | None = None,
    kept_length: int | None = None,
) -> StreamPrompts:
    """Each usable stream read as a smoothed bootstrap (module docstring). Streams shorter than
    ``kept_length`` lose their last reward."""
    kernels = []
    for s in streams:
        if kept_length is not None and len(s) < kept_length:
            s = s[:-1]
        x = np.asarray(s, dtype=np.float64)
        if x.size < STREAM_MIN_REWARDS:
            continue
        k = _kernels(x, floor, ceiling)
        if k is not None:
            kernels.append(k)
    return StreamPrompts(tuple(kernels), alpha, floor, ceiling)


def _mean_acceptance(prompts: list[tuple[np.ndarray, np.ndarray]], n: np.ndarray) -> np.ndarray:
    """Best-of-n's acceptance averaged over ``prompts``, for each n."""
    total = np.zeros(n.size)
    for log_f, ar in prompts:
        power = np.exp(n[:, None] * log_f[None, :])  # F(x)^n on the grid, (n, grid)
        total += np.diff(power, axis=1, prepend=0.0) @ ar  # P(the max at each grid point)
    return total / len(prompts)


def best_of_n_acceptance(
    streams: Sequence[Sequence[float]],
    ns: np.ndarray,
    *,
    alpha: float,
    floor: float | None = None,
    ceiling: float | None = None,
) -> np.ndarray | None:
    """Mean acceptance of Best-of-n over the streams' pseudo-prompts, for each n in ``ns``
    (None: fewer than :data:`BOOTSTRAP_MIN_STREAMS` usable streams)."""
    prompts = pseudo_prompts(streams, alpha=alpha, floor=floor, ceiling=ceiling).prompts
    if len(prompts) < BOOTSTRAP_MIN_STREAMS:
        return None
    return _mean_acceptance(prompts, np.asarray(ns, dtype=np.float64))


def bootstrap_n(
    streams: Sequence[Sequence[float]],
    target: float,
    *,
    alpha: float,
    horizon: int,
    min_samples: int = 1,
    floor: float | None = None,
    ceiling: float | None = None,
    kept_length: int | None = None,
) -> int | None:
    """:func:`n_for_target` on the streams' :func:`pseudo_prompts`."""
    prompts = pseudo_prompts(
        streams, alpha=alpha, floor=floor, ceiling=ceiling, kept_length=kept_length
    )
    return n_for_target(prompts.prompts, target, horizon=horizon, min_samples=min_samples)


def n_for_target(
    prompts: list[tuple[np.ndarray, np.ndarray]],
    target: float,
    *,
    horizon: int,
    min_samples: int = 1,
) -> int | None:
    """The least n in [min_samples, horizon] whose Best-of-n reaches ``target`` on average over
    the pseudo-prompts (None: fewer than :data:`BOOTSTRAP_MIN_STREAMS`, or no n up to
    ``horizon`` reaches it). Bisection: Best-of-n's acceptance rises with n."""
    lo, hi = max(int(min_samples), 1), int(horizon)
    if len(prompts) < BOOTSTRAP_MIN_STREAMS or hi < lo:
        return None

    def reaches(n: int) -> bool:
        return bool(_mean_acceptance(prompts, np.array([float(n)]))[0] >= target)

    return _first_true(reaches, lo, hi)


def n_for_cost(
    prompts: list[tuple[np.ndarray, np.ndarray]],
    cost: float,
    *,
    horizon: int,
    min_samples: int = 1,
    min_streams: int = BOOTSTRAP_MIN_STREAMS,
) -> int | None:
    """The n in [min_samples, horizon] whose Best-of-n earns most on average over the
    pseudo-prompts, mean acceptance - ``cost`` n (None: fewer than ``min_streams``).
    Bisection on the marginal draw: on each prompt the n-th draw adds
    E[(AR(X - kappa) - AR(M - kappa))+], M the best of the n - 1 before it, which falls as M
    rises, so the draws that pay are the first few."""
    lo, hi = max(int(min_samples), 1), int(horizon)
    if len(prompts) < min_streams or hi < lo:
        return None

    def stops_paying(n: int) -> bool:  # does the n-th draw add no more than it costs?
        gain = _mean_acceptance(prompts, np.array([n - 1.0, float(n)]))
        return bool(gain[1] - gain[0] <= cost)

    first = _first_true(stops_paying, lo + 1, hi)  # the first draw that does not pay
    return hi if first is None else first - 1


def _first_true(predicate: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The least n in [lo, hi] where ``predicate``, false then true as n rises, is true
    (None: nowhere, or an empty range); by bisection."""
    if hi < lo:
        return None
    if predicate(lo):
        return lo
    if not predicate(hi):
        return None
    while hi - lo > 1:  # predicate(hi) and not predicate(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if predicate(mid) else (mid, hi)
    return hi
