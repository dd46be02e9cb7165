"""Target mode where a deployment's rewards pile up at a floor: the floor read as censoring.

Why: a judge's clipped scores (the AlpacaEval pool: 56% of its rewards at the lower clip) put a
different share of each prompt's rewards at the floor - from 8% to 96% on the pool's first 40
prompts. The table rule standardises a request's rewards by their mean and sd, and the floor
share moves both: those prompts' benchmarks kappa sat from 1.35 to 6.33 of their sds above their
means, and no one standardised threshold serves them (target 0.9 delivered 0.954 at 216 rewards
per request, -0.93 of the matched Best-of-N's draws; docs/robust-stopping.md, "The real pool's
shapes at 960 draws").

Read as censoring, the floor separates the two things that vary. A prompt draws above the floor
with probability p, and above it from an interior shape its deployment shares; its benchmark,
the alpha-quantile of all its rewards, is the interior's alpha'-quantile with
alpha' = 1 - (1 - alpha) / p (the floor holds the lowest 1 - p), and the floor itself where
p <= 1 - alpha. Among those 40 prompts kappa's standardised interior position falls with the
floor share, from 2-4 interior sds at shares under 0.5 to 0.8-1.7 above 0.75. So this table
tabulates the known-distribution threshold (:func:`~stoppers.robust.stop_table.plug_in`) over
both the log scale and p; a request standardises its best by its *interior* mean and sd, reads
p as its posterior mean under the deployment's learned distribution of p (the floor's NPMLE,
:class:`~stoppers.robust.ceiling.RewardFloor`), and stops at the first interior best above the
threshold. The Monte Carlo offset is calibrated, as for the plain table, on streams simulated
from the learned interior shape, scales and p - floor draws included, and the floor rule
(:func:`~stoppers.robust.ceiling.floor_acceptance_bound`) stopping the all-floor ones as the
policy does.

The simulation also gives the Best-of-N that delivers the target on those streams. It ends the
rule's run (``cap``): a prompt whose few distinct good responses end below the shape's tail
never reaches the threshold, and without the cap 15 of 89 requests on the rule ran to the 960
budget (the pool at 0.9, 40 prompts x 5 deployments). Where the capped rule does not draw
``FIXED_N_MARGIN`` fewer than that Best-of-N on the simulated streams, the request runs the
Best-of-N (``fixed_n``, :func:`~stoppers.robust.stop_table.fixed_n_for`), as on the plain table.

Where the floor cuts one latent shape instead (a Tobit: :attr:`CensoredShape.cut`, the reading
cost mode chooses), the interior at p is that shape's upper tail above its (1 - p)-quantile,
tabulated per p, and the calibration simulates the cut (:mod:`stoppers.robust.cut_interior`).

A build is heavier than the plain table's (~0.3-0.7 s): 2.7 s with 256 kept streams at horizon
960, measured with a test run on the other core - the interior fit, then 800 streams simulated
to the horizon, p's posterior at every draw. The gateway runs it on its table-build thread.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from stoppers.robust.ceiling import P_GRID, FloorBound, floor_acceptance_bound
from stoppers.robust.cut_interior import CutInterior
from stoppers.robust.stop_table import (
    MAX_HORIZON,
    S_BINS,
    SIM_STREAMS,
    SLOPES,
    _acceptance,
    _shape_draws,
    best_of_n_cap,
    bisect_offset,
    fixed_n_for,
    plug_in,
    posterior_scale,
    s_bin,
    scale_draws,
)

__all__ = [
    "CEILING_SHARE_MAX",
    "CUT_SHARE_MIN",
    "FLOOR_SHARE_MIN",
    "FloorTable",
    "build_floor_table",
    "ceiling_share",
    "floor_share",
    "interior_streams",
]

# The share of the kept streams' rewards at the established floor above which target tables are
# built on the interior (the AlpacaEval pool: 0.56) ...
FLOOR_SHARE_MIN = 0.2
# Cost mode's cut reading (:attr:`~stoppers.robust.censored_cost.CensoredShape.cut`) may decide
# from this share: a cut models any share at the floor, and a Tobit with a sixth of its rewards
# there (`floored`, sd 1: 13-17% of the kept rewards in deployments of 30 requests) read as a
# cut by +92 to +115 of log Bayes factor. Target tables keep FLOOR_SHARE_MIN: under it a cut
# table ran Best-of-N where the plain table's rule drew fewer (docs/robust-stopping.md, "The
# cut read in target mode").
CUT_SHARE_MIN = 0.05
# ... unless this share sits at an established ceiling: the simulated interior has no pile-up at
# the top. Gaussians clipped at both ends (30% at each, continuous) lost 0.08-0.09 of save at
# targets 0.7-0.8 read as censored at the floor alone (the pool: 0.008 at its ceiling).
CEILING_SHARE_MAX = 0.05
INTERIOR_MIN = 4  # interior rewards a kept stream needs to teach the interior shape and scales
INTERIOR_STREAMS_MIN = 10  # ... and streams with them the build needs
# where z_star is tabulated over p = P(above the floor): log-spaced, as alpha' = 1 - 0.01 / p
# moves fastest at small p; below the first point kappa is the floor itself
P_ABOVE_GRID = np.geomspace(0.01, 1.0, 41)
_LOG_P = np.log(np.maximum(P_GRID, 1e-300))
_LOG_Q = np.log(np.maximum(1.0 - P_GRID, 1e-300))
# the same as plain floats, for the per-observe loop (numpy scalars are slow one at a time)
_P = tuple(P_GRID.tolist())
_Q = tuple((1.0 - P_GRID).tolist())


@dataclass(frozen=True)
class FloorTable:
    """The per-request decision data of the censored rule for one (target, min_samples,
    horizon, alpha); fields as :class:`~stoppers.robust.stop_table.StopTable`'s, the scale ones
    of the interior rewards, plus p's grid and the floor's learned distribution of p."""

    target: float
    floor: float  # the established floor the table was built for
    log_s_grid: tuple[float, ...]  # absolute log-scale grid of the interior sd
    p_grid: tuple[float, ...]  # P(above the floor) grid
    z_star: tuple[tuple[float, ...], ...]  # [p][log s]: threshold on (best - mean) / scale
    log_g: tuple[float, ...]  # log of the learned distribution of p on ceiling.P_GRID
    offset: float
    slope: float  # ... plus slope / sqrt(interior draws - 1)
    scale_mu: float
    scale_prec: float
    sd_weight: float
    requests: int
    simulated_acceptance: float
    simulated_samples: float
    fixed_n: int | None = None  # Best-of-N in place of the rule (stop_table.fixed_n_for)
    cap: int | None = None  # ... and as the rule's last draw (None: the horizon)
    cap_factor: ClassVar[float] = 1.0  # the cap is the Best-of-N itself
    cut: bool = False  # the interiors read as a latent shape cut at the floor (cut_interior)

    def scale(self, n: int, sd: float) -> float:
        """The interior sd of ``n`` interior rewards shrunk to the learned interior scales."""
        return posterior_scale(self.scale_mu, self.scale_prec, self.sd_weight, n, sd)

    def threshold(self, log_s: float, p: float, n: int) -> float:
        """z_star at (log s, p), bilinear between grid points, + offset + slope / sqrt(n - 1)
        for ``n`` interior rewards; p below the grid reads its first row."""
        si = _position(self.log_s_grid, log_s)
        pi = _position(self.p_grid, p)
        z = self.z_star
        i, a = int(pi), pi - int(pi)
        j, b = int(si), si - int(si)
        i1, j1 = min(i + 1, len(z) - 1), min(j + 1, len(z[0]) - 1)
        top = z[i][j] + b * (z[i][j1] - z[i][j])
        bottom = z[i1][j] + b * (z[i1][j1] - z[i1][j])
        return top + a * (bottom - top) + self.offset + self.slope / math.sqrt(max(n - 1, 1))


class AbovePosterior:
    """The posterior of a request's P(above the floor) on ``ceiling.P_GRID`` under the
    deployment's learned distribution of p (``FloorTable.log_g``), updated draw by draw in a few
    float operations per reward (the per-observe budget of 20 us; recomputed from the counts it
    took 18 us on a busy machine). The table's simulation computes the same posterior means
    vectorised (:func:`_p_posterior_means`)."""

    __slots__ = ("_draws", "_weights")

    def __init__(self, log_g: Sequence[float]) -> None:
        top = max(log_g)
        self._weights = [math.exp(v - top) if v > -math.inf else 0.0 for v in log_g]
        self._draws = 0

    def note(self, above: bool) -> None:
        """One more draw, above the floor or at it."""
        self._weights = list(map(operator.mul, self._weights, _P if above else _Q))
        self._draws += 1
        if self._draws % 256 == 0:  # 0.5^256 at most since the last: rescale before underflow
            top = max(self._weights)
            self._weights = [w / top for w in self._weights]

    @property
    def mean(self) -> float:
        """The posterior mean of p."""
        weights = self._weights
        return sum(map(operator.mul, weights, _P)) / sum(weights)


def _position(grid: Sequence[float], value: float) -> float:
    """Fractional index of ``value`` on an ascending ``grid``, clamped to its ends."""
    if value <= grid[0]:
        return 0.0
    if value >= grid[-1]:
        return float(len(grid) - 1)
    i = bisect.bisect_right(grid, value) - 1
    return i + (value - grid[i]) / (grid[i + 1] - grid[i])


def interior_streams(streams: Sequence[Sequence[float]], floor: float) -> list[list[float]]:
    """The kept streams' rewards above ``floor``, of the streams with ``INTERIOR_MIN`` of them."""
    out = []
    for stream in streams:
        above = [v for v in stream if v > floor]
        if len(above) >= INTERIOR_MIN:
            out.append(above)
    return out


def floor_share(streams: Sequence[Sequence[float]], floor: float) -> float:
    """The share of the kept streams' rewards at (or below) ``floor``."""
    total = sum(len(s) for s in streams)
    return sum(sum(1 for v in s if v <= floor) for s in streams) / total if total else 0.0


def ceiling_share(streams: Sequence[Sequence[float]], ceiling: float) -> float:
    """The share of the kept streams' rewards at (or above) ``ceiling``."""
    return floor_share([[-v for v in s] for s in streams], -ceiling)


def scale_counts(streams: Sequence[Sequence[float]]) -> np.ndarray | None:
    """The log-sd histogram (``stop_table.s_bin``) of the ``streams`` with a spread; None if
    none has one."""
    sds = np.array([np.std(s, ddof=1) for s in streams])
    sds = sds[sds > 0.0]
    if sds.size == 0:
        return None
    return np.bincount(s_bin(np.log(sds)), minlength=S_BINS).astype(np.float64)


def learned_g(floor: FloorBound) -> np.ndarray:
    """The floor's learned distribution of p on ``ceiling.P_GRID`` (uniform if None)."""
    return np.full(P_GRID.size, 1.0 / P_GRID.size) if floor.g is None else np.asarray(floor.g)


def build_floor_table(
    shape: np.ndarray | None,
    streams: list[list[float]],
    floor: FloorBound,
    target: float,
    alpha: float,
    min_samples: int,
    horizon: int,
    requests: int,
    *,
    scale_shrink: float = 1.0,
    seed: int | None = None,
    cut: CutInterior | None = None,
) -> FloorTable | None:
    """The censored rule for the interior ``shape`` (a histogram on ``Z_EDGES``' bins), the
    interior scales of ``streams`` (:func:`interior_streams`) and ``floor``'s learned
    distribution of p (``floor.g``, uniform if None), calibrated by simulation; None where no
    interior stream has a spread. With ``cut``, the interior at each p is the one a latent
    shape cut at the floor leaves there, and the calibration simulates that cut
    (:mod:`stoppers.robust.cut_interior`); ``shape`` is not read (and may be None)."""
    if cut is not None:
        interiors = [cut.shape(float(p)) for p in P_ABOVE_GRID]
    elif shape is not None:
        interiors = [shape / shape.sum()] * P_ABOVE_GRID.size
    else:
        raise ValueError("a censored table needs an interior shape or a cut")
    s_counts = scale_counts(streams)
    if s_counts is None:
        return None
    sw = s_counts / s_counts.sum()
    rows, quantiles = [], []
    base = None
    for p, inner in zip(P_ABOVE_GRID, interiors, strict=True):
        inner_alpha = min(max(1.0 - (1.0 - alpha) / p, 1e-9), 1.0 - 1e-12)
        rule, q = plug_in(inner, sw, target, inner_alpha, requests, scale_shrink)
        rows.append(rule.z_star)
        quantiles.append(q)
        base = rule
    assert base is not None
    g = learned_g(floor)
    with np.errstate(divide="ignore"):
        log_g = np.log(g)
    table = FloorTable(
        target=target,
        floor=floor.value,
        log_s_grid=base.log_s_grid,
        p_grid=tuple(float(p) for p in P_ABOVE_GRID),
        z_star=tuple(tuple(row) for row in rows),
        log_g=tuple(float(v) for v in log_g),
        offset=0.0,
        slope=0.0,
        scale_mu=base.scale_mu,
        scale_prec=base.scale_prec,
        sd_weight=base.sd_weight,
        requests=requests,
        simulated_acceptance=math.nan,
        simulated_samples=math.nan,
        cut=cut is not None,
    )
    return _calibrated(
        table,
        (interiors[0], sw, np.asarray(quantiles)) if cut is None else cut,
        g,
        floor,
        alpha,
        min_samples,
        horizon,
        seed,
    )


def _calibrated(
    table: FloorTable,
    interior: tuple[np.ndarray, np.ndarray, np.ndarray] | CutInterior,
    g: np.ndarray,
    floor: FloorBound,
    alpha: float,
    min_samples: int,
    horizon: int,
    seed: int | None,
) -> FloorTable:
    """Bisect the offset (for each candidate slope, keeping the one that draws fewest) so that
    the simulated censored rule's mean acceptance equals the target, on ``SIM_STREAMS`` streams
    drawn to the request's horizon (at most ``MAX_HORIZON``). ``interior``: the shared interior
    shape, the interior scales' histogram and the interior's alpha'-quantile at each p of
    ``P_ABOVE_GRID``, or the cut latent shape."""
    rng = np.random.default_rng([table.requests if seed is None else seed, 13])
    r, t = SIM_STREAMS, min(horizon, MAX_HORIZON)
    p = P_GRID[rng.choice(P_GRID.size, size=r, p=g / g.sum())]
    if isinstance(interior, CutInterior):
        x, kappa = interior.draws(p, t, alpha, rng)
    else:
        w, sw, quantiles = interior
        log_s = scale_draws(sw, r, rng)
        x = np.exp(log_s)[:, None] * _shape_draws(w, (r, t), rng)
        # each stream's benchmark: its interior's alpha'-quantile
        kappa = np.exp(log_s) * np.interp(p, P_ABOVE_GRID, quantiles)
    above = rng.random((r, t)) < p[:, None]
    n = np.arange(1, t + 1, dtype=np.float64)
    count = np.cumsum(above, axis=1).astype(np.float64)
    inner = np.where(above, x, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.cumsum(inner, axis=1) / count
        var = (np.cumsum(inner * x, axis=1) - count * mean * mean) / (count - 1.0)
        sd = np.sqrt(np.maximum(var, 0.0))
        log_sd = np.where(sd > 0.0, np.log(sd), table.scale_mu)
    best = np.maximum.accumulate(np.where(above, x, -np.inf), axis=1)
    wt = table.sd_weight * np.maximum(count - 1.0, 0.0)
    post = (table.scale_prec * table.scale_mu + wt * log_sd) / (table.scale_prec + wt)
    p_hat = _p_posterior_means(table, n, count)
    z_star = _bilinear(table, post, p_hat)
    with np.errstate(invalid="ignore"):
        base = (best - mean) / np.exp(post) - z_star
    base = np.where((count >= 2.0) & (n >= min_samples) & np.isfinite(base), base, -np.inf)
    shrink = 1.0 / np.sqrt(np.maximum(count - 1.0, 1.0))
    at_floor = p <= 1.0 - alpha  # the benchmark is the floor itself
    acc_at = np.where(
        count > 0.0,
        np.where(at_floor[:, None], 1.0, _acceptance(best - kappa[:, None])),
        np.where(at_floor, 1.0, 1.0 - floor.lift)[:, None],
    )
    floor_ok = np.array([floor_acceptance_bound(int(k), alpha, floor) for k in n]) >= table.target
    floor_hit = (count == 0.0) & floor_ok[None, :] & (n >= min_samples)
    floor_stop = np.where(floor_hit.any(axis=1), np.argmax(floor_hit, axis=1), t)
    curve = acc_at.mean(axis=0)  # Best-of-n's mean acceptance (index n - 1)
    cap = best_of_n_cap(curve, table.target, min_samples, table.cap_factor)
    offset, slope, acc, samples, _ = bisect_offset(
        base, shrink, acc_at, table.target, (0.0, 0.75, *SLOPES), last=cap, forced=floor_stop
    )
    fixed_n = fixed_n_for(curve, acc, samples, table.target, min_samples)
    return FloorTable(
        **{
            **table.__dict__,
            "offset": offset,
            "slope": slope,
            "simulated_acceptance": acc,
            "simulated_samples": samples,
            "fixed_n": fixed_n,
            "cap": cap,
        }
    )


def _p_posterior_means(table: FloorTable, n: np.ndarray, count: np.ndarray) -> np.ndarray:
    """:class:`AbovePosterior`'s mean for every (draws ``n``, draws above ``count``), vectorised
    over rows."""
    log_g = np.asarray(table.log_g)
    out = np.empty_like(count)
    for lo in range(0, count.shape[0], 64):
        a = count[lo : lo + 64, :, None]
        b = n[None, :, None] - a
        with np.errstate(invalid="ignore"):
            log_post = log_g + np.where(a > 0, a * _LOG_P, 0.0) + np.where(b > 0, b * _LOG_Q, 0.0)
        log_post -= log_post.max(axis=2, keepdims=True)
        weight = np.exp(log_post)
        out[lo : lo + 64] = (weight @ P_GRID) / weight.sum(axis=2)
    return out


def _bilinear(table: FloorTable, log_s: np.ndarray, p: np.ndarray) -> np.ndarray:
    """:meth:`FloorTable.threshold`'s z_star (no offset), vectorised."""
    zs = np.asarray(table.z_star)
    si = np.interp(log_s, table.log_s_grid, np.arange(len(table.log_s_grid), dtype=np.float64))
    pi = np.interp(p, table.p_grid, np.arange(len(table.p_grid), dtype=np.float64))
    i = np.minimum(pi.astype(np.int64), zs.shape[0] - 2)
    j = np.minimum(si.astype(np.int64), zs.shape[1] - 2)
    a, b = pi - i, si - j
    top = zs[i, j] + b * (zs[i, j + 1] - zs[i, j])
    bottom = zs[i + 1, j] + b * (zs[i + 1, j + 1] - zs[i + 1, j])
    return top + a * (bottom - top)
