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
target is the least whose mean over the pseudo-prompts reaches it. Checked on the pools' full
rows (scratch, 40 prompts, one stream of 96 each): within one step of a 12% grid of the true N
at 0.7-0.95 on the real pool redrawn, normal, Student-t, two-mode, pareto, Tobit and mixed
deployments, above it (over-delivering) where it missed.

A stream the request's own rule ended may end on the reward that stopped it, which is high by
selection: a stream shorter than the kept length loses its last reward.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import ndtr

from stoppers.faircap import acceptance_rate

__all__ = [
    "BOOTSTRAP_MIN_STREAMS",
    "STREAM_MIN_REWARDS",
    "best_of_n_acceptance",
    "bootstrap_n",
    "n_for_target",
    "pseudo_prompts",
]

BOOTSTRAP_MIN_STREAMS = 10  # kept streams (after the length cut) before the bootstrap sizes N
STREAM_MIN_REWARDS = 24  # a shorter stream says too little about its prompt's top
GRID_POINTS = 512  # per stream: where F is evaluated, between the stream's ends +- its kernels
_BANDWIDTH_MULTIPLES = (0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.4)  # of Silverman's


def loo_bandwidth(values: np.ndarray) -> float:
    """The Gaussian kernel width (among multiples of Silverman's rule) that maximises the
    leave-one-out log likelihood of ``values`` (0: fewer than 3 distinct values)."""
    x = np.asarray(values, dtype=np.float64)
    if np.unique(x).size < 3:
        return 0.0
    sd = float(x.std(ddof=1))
    q75, q25 = np.percentile(x, [75.0, 25.0])
    spread = min(sd, (q75 - q25) / 1.34) if q75 > q25 else sd
    base = 0.9 * spread * x.size**-0.2
    d2 = (x[:, None] - x[None, :]) ** 2
    best, width = -np.inf, base
    for m in _BANDWIDTH_MULTIPLES:
        h = base * m
        k = np.exp(-0.5 * d2 / (h * h))
        np.fill_diagonal(k, 0.0)
        density = k.sum(axis=1) / ((x.size - 1) * h)
        ll = float(np.log(np.maximum(density, 1e-300)).sum())
        if ll > best:
            best, width = ll, h
    return width


def _pseudo_prompt(
    stream: np.ndarray, floor: float | None, ceiling: float | None, alpha: float
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(grid, F on it, kappa) of ``stream`` read as a smoothed bootstrap; None: no spread."""
    at_floor = np.zeros(stream.size, dtype=bool) if floor is None else stream <= floor
    at_ceiling = np.zeros(stream.size, dtype=bool) if ceiling is None else stream >= ceiling
    inner = stream[~at_floor & ~at_ceiling]
    h = loo_bandwidth(inner) if inner.size >= 3 else 0.0
    if h <= 0.0:
        return None
    lo = inner.min() - 4.0 * h if floor is None else max(floor, inner.min() - 4.0 * h)
    hi = inner.max() + 5.0 * h if ceiling is None else min(ceiling, inner.max() + 5.0 * h)
    grid = np.linspace(lo, hi, GRID_POINTS)
    cdf = ndtr((grid[:, None] - inner[None, :]) / h).sum(axis=1)
    # kernel mass below the floor joins the floor's atom, above the ceiling the ceiling's
    cdf = (cdf + at_floor.sum()) / stream.size
    if ceiling is not None and hi >= ceiling:
        cdf[-1] = 1.0
    cdf = np.minimum(np.maximum.accumulate(cdf), 1.0)
    if cdf[-1] < alpha:
        return None
    kappa = float(np.interp(alpha, cdf, grid))  # F is flat below lo only at a floor's atom
    return grid, cdf, kappa


def pseudo_prompts(
    streams: Sequence[Sequence[float]],
    *,
    alpha: float,
    floor: float | None = None,
    ceiling: float | None = None,
    kept_length: int | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(log F, AR against kappa) on each usable stream's grid: what :func:`n_for_target` reads.
    Streams shorter than ``kept_length`` lose their last reward (module docstring)."""
    prompts = []
    for s in streams:
        if kept_length is not None and len(s) < kept_length:
            s = s[:-1]
        x = np.asarray(s, dtype=np.float64)
        if x.size < STREAM_MIN_REWARDS:
            continue
        prompt = _pseudo_prompt(x, floor, ceiling, alpha)
        if prompt is not None:
            grid, cdf, kappa = prompt
            with np.errstate(divide="ignore"):
                prompts.append((np.log(cdf), acceptance_rate(grid, kappa)))
    return prompts


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
    prompts = pseudo_prompts(streams, alpha=alpha, floor=floor, ceiling=ceiling)
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
    return n_for_target(prompts, target, horizon=horizon, min_samples=min_samples)


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

    if reaches(lo):
        return lo
    if not reaches(hi):
        return None
    while hi - lo > 1:  # reaches(hi) and not reaches(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi
