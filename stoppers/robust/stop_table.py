"""The target default's stop table: the known-distribution threshold rule for a learned shape,
calibrated by simulation.

Why: with the prompt's reward distribution known, the cheapest rule that delivers a mean
acceptance ``t`` stops at the first reward v whose conditional mean acceptance
h(v) = E[AR_kappa(V) | V >= v] reaches t (the Lagrangian form of Weitzman's rule, Definition
"Fair-cap value", on the AR scale). A request knows only the deployment's standardised shape and
distribution of scales (:class:`stoppers.robust.shape_prior.ShapePrior`), so :func:`plug_in`
tabulates that rule's standardised threshold z_star over the log scale, and :func:`calibrate`
adds the Monte Carlo offset at which the rule *as the policy runs it* - mean and scale from the
request's own few rewards, the scale shrunk to the learned scales - delivers t on streams
simulated from the shape (:func:`simulated_streams`, :func:`rule_margin`). Where the deployment
scores on a lattice (integer or rounded judge ratings) the simulated streams are rounded to it
and judged against a benchmark on it (:func:`on_lattice`), as the requests will be.

The grids here (the standardised-reward and log-sd histograms) are the ones the priors record
on (:func:`z_bin`, :func:`s_bin`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "SIM_HORIZON",
    "SIM_STREAMS",
    "S_BINS",
    "S_HI",
    "S_LO",
    "TABLE_CAP_FACTOR",
    "Z_BINS",
    "Z_EDGES",
    "Z_HI",
    "Z_LO",
    "StopTable",
    "TableKey",
    "best_of_n_cap",
    "bin_centres",
    "bisect_offset",
    "calibrate",
    "calibrated_on",
    "fixed_n_for",
    "on_lattice",
    "plug_in",
    "posterior_scale",
    "rule_margin",
    "s_bin",
    "scale_draws",
    "scale_moments",
    "scale_prior",
    "simulated_streams",
    "z_bin",
]

Z_LO, Z_HI, Z_BINS = -12.0, 12.0, 1200  # bin width 0.02
S_LO, S_HI, S_BINS = -12.0, 12.0, 480  # log-sd bin width 0.05
Z_EDGES = np.linspace(Z_LO, Z_HI, Z_BINS + 1)
LOG_S_GRID = np.linspace(-4.0, 4.0, 33)  # where z_star is tabulated (relative to the median)
SIM_STREAMS = 800
SIM_HORIZON = 256  # simulated streams stop here (longer runs are rare at targets <= 0.95) ...
# ... unless more than TRUNCATED_MAX of them have not stopped by then: then they are drawn on
# to the table's horizon (the request's budget, at most MAX_HORIZON) and the rule calibrated
# again. Where rewards spread by several units (a reward model's usual sd of 2-5, where
# acceptance is all but 0 or 1) the rule needs hundreds of draws on a few percent of prompts;
# calibrated on streams cut at 256 it delivered 0.997 for a 0.95 target at sd ~20, half its
# requests running to the 960 budget (docs/robust-stopping.md, "Rewards that spread by several
# units").
TRUNCATED_MAX = 0.005
MAX_HORIZON = 1024  # the longest simulated stream; a table's horizon is capped at it
SLOPES = (1.5, 3.0, 5.0, 8.0)  # candidate small-sample slopes of the offset
MIN_SCALE_SHRINK = 1e-6  # scale_shrink 0: the prior still names a scale before any sd exists
# The calibrated rule runs only where, on the table's own simulated streams, it draws at least
# this share fewer rewards than the Best-of-N that delivers what it delivers; elsewhere the table
# names that Best-of-N (StopTable.fixed_n). Replayed, the rule saves less than it does in
# simulation (normal at 0.9: 32% simulated, 21% replayed), and it lost up to 24% where its
# simulated save was nil (bounded rewards; docs/robust-stopping.md, "Best-of-N where the table
# rule does not pay").
FIXED_N_MARGIN = 0.1
# A table rule's last draw is this multiple of the Best-of-N that delivers the target on the
# simulated streams (StopTable.cap). At 1 the cap took the rule's advantage: calibrated with it,
# the normal shape's rule drew 55 rewards at 0.9 where Best-of-61 delivers as much, and the table
# named that N; at 2 it draws 45.1 against 44.8 uncapped (Gumbel 61.2 against 60.8).
TABLE_CAP_FACTOR = 2.0

# (target to 3 decimals, min_samples, horizon, alpha): what one stop table is built for
TableKey = tuple[float, int, int, float]


@dataclass(frozen=True)
class StopTable:
    """The per-request decision data for one (target, min_samples, horizon)."""

    target: float
    log_s_grid: tuple[float, ...]  # absolute log-scale grid
    z_star: tuple[float, ...]  # threshold on (best - mean) / scale at each grid point
    offset: float  # Monte Carlo bias correction added to z_star
    slope: float  # ... plus slope / sqrt(n - 1): the small-sample part of the correction
    scale_mu: float  # prior mean of log scale
    scale_prec: float  # prior precision of log scale
    sd_weight: float  # likelihood precision per sample of log sd (2 / (kurtosis - 1))
    requests: int  # evidence the table was built on
    simulated_acceptance: float  # the mean acceptance the calibrated rule reached in simulation
    simulated_samples: float
    step: float | None = None  # the reward lattice the calibration simulated (None: continuous)
    # the Best-of-N the request runs instead of the rule (None: the rule; :func:`fixed_n_for`)
    fixed_n: int | None = None
    # ... and the rule's last draw: cap_factor times the Best-of-N that delivers the target on
    # the simulated streams (None: the horizon; :func:`best_of_n_cap`)
    cap: int | None = None
    cap_factor: ClassVar[float] = TABLE_CAP_FACTOR
    # calibrated on the kept streams' pseudo-prompts (shape_prior.streams_calibrated), not on
    # the smooth shape: each prompt's own lumps, which no pooled shape's modes describe
    on_streams: bool = False

    def scale(self, n: int, sd: float) -> float:
        """Posterior-mean log scale, exponentiated: own sd shrunk to the learned scales."""
        return posterior_scale(self.scale_mu, self.scale_prec, self.sd_weight, n, sd)

    def threshold(self, log_s: float, n: int) -> float:
        """z_star(log s) + offset + slope / sqrt(n - 1), z_star linear between grid points."""
        grid, zs = self.log_s_grid, self.z_star
        offset = self.offset + self.slope / math.sqrt(max(n - 1, 1))
        if log_s <= grid[0]:
            return zs[0] + offset
        if log_s >= grid[-1]:
            return zs[-1] + offset
        step = grid[1] - grid[0]
        pos = (log_s - grid[0]) / step
        i = int(pos)
        frac = pos - i
        return zs[i] + frac * (zs[i + 1] - zs[i]) + offset


def posterior_scale(mu: float, precision: float, sd_weight: float, n: int, sd: float) -> float:
    """The sd of ``n`` rewards shrunk to learned log scales N(mu, 1 / precision): the
    posterior-mean log scale, exponentiated (each reward adds ``sd_weight`` of precision)."""
    if sd > 0.0 and n > 1:
        w = sd_weight * (n - 1)
        return math.exp((precision * mu + w * math.log(sd)) / (precision + w))
    return math.exp(mu)


def z_bin(z: np.ndarray) -> np.ndarray:
    """Index of the standardised-reward histogram bin of each ``z`` (clipped to the range)."""
    return np.clip(((z - Z_LO) / (Z_HI - Z_LO) * Z_BINS).astype(np.int64), 0, Z_BINS - 1)


def s_bin(log_sd: np.ndarray) -> np.ndarray:
    """Index of the log-sd histogram bin of each ``log_sd`` (clipped to the range)."""
    return np.clip(((log_sd - S_LO) / (S_HI - S_LO) * S_BINS).astype(np.int64), 0, S_BINS - 1)


def bin_centres(lo: float, hi: float, bins: int) -> np.ndarray:
    width = (hi - lo) / bins
    return lo + width * (np.arange(bins) + 0.5)


def _acceptance(x: np.ndarray) -> np.ndarray:
    """AR as a function of v - kappa (Definition "Acceptance Rate"), overflow-safe. The same
    function as ``gpd_tail._acceptance_array`` but for the last bit on ~1/4 of inputs; kept so
    that the calibrated tables stay bit for bit as they were."""
    with np.errstate(over="ignore"):
        return np.minimum(2.0 / (1.0 + np.exp(-x)), 1.0)


def plug_in(
    w: np.ndarray,
    sw: np.ndarray,
    target: float,
    alpha: float,
    requests: int,
    scale_shrink: float = 1.0,
) -> tuple[StopTable, float]:
    """The known-distribution rule for shape ``w`` (uncalibrated) and its alpha-quantile;
    the scale prior's precision is weighted by ``scale_shrink`` (ShapePrior)."""
    zc = bin_centres(Z_LO, Z_HI, Z_BINS)
    cdf = np.cumsum(w)
    q_alpha = float(zc[min(np.searchsorted(cdf, alpha), Z_BINS - 1)])
    mean = float(w @ zc)
    var = float(w @ (zc - mean) ** 2)
    kurt = float(w @ (zc - mean) ** 4) / max(var * var, 1e-12)
    sd_weight = 4.0 / max(kurt - 1.0, 0.5)  # 1 / Var(log sd) per sample (2 for the normal)
    mu, s_var = scale_moments(sw)
    grid = mu + LOG_S_GRID
    # h(z; s) = E[AR(s (Z - q)) | Z >= z]: reverse cumulative means over the histogram.
    ar = _acceptance(np.exp(grid)[:, None] * (zc[None, :] - q_alpha))  # (grid, bins)
    mass = np.cumsum(w[::-1])[::-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        h = np.cumsum((ar * w)[:, ::-1], axis=1)[:, ::-1] / mass
    h = np.where(mass > 0, h, 1.0)
    reach = h >= target
    first = np.argmax(reach, axis=1)
    first = np.where(reach.any(axis=1), first, Z_BINS - 1)
    z_star = zc[first]
    table = StopTable(
        target=target,
        log_s_grid=tuple(float(v) for v in grid),
        z_star=tuple(float(v) for v in z_star),
        offset=0.0,
        slope=0.0,
        scale_mu=mu,
        scale_prec=max(scale_shrink, MIN_SCALE_SHRINK) / s_var,
        sd_weight=sd_weight,
        requests=requests,
        simulated_acceptance=math.nan,
        simulated_samples=math.nan,
    )
    return table, q_alpha


def simulated_streams(
    w: np.ndarray, sw: np.ndarray, horizon: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Simulated standardised draws (streams, horizon) from ``w`` and log scales from ``sw``."""
    rng = np.random.default_rng([seed, 7])
    r, t = SIM_STREAMS, min(horizon, SIM_HORIZON)
    z = _shape_draws(w, (r, t), rng)
    return z, scale_draws(sw, r, rng)


def scale_draws(sw: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` log scales drawn from the log-sd histogram ``sw``: a bin, then uniform in it."""
    sww = (S_HI - S_LO) / S_BINS
    s_cdf = np.cumsum(sw)
    pick = np.minimum(np.searchsorted(s_cdf, rng.random(size) * s_cdf[-1]), S_BINS - 1)
    return S_LO + sww * (pick + rng.random(size))


def _shape_draws(w: np.ndarray, size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Inverse-CDF draws from the shape histogram ``w``: a bin, then uniform within it."""
    zw = (Z_HI - Z_LO) / Z_BINS
    cdf = np.cumsum(w)
    u = rng.random(size) * cdf[-1]
    return Z_LO + zw * (np.minimum(np.searchsorted(cdf, u), Z_BINS - 1) + rng.random(size))


def _drawn_on(z: np.ndarray, w: np.ndarray, horizon: int, seed: int) -> np.ndarray:
    """``z`` with each stream drawn on to ``horizon`` (its first columns unchanged, the rest
    from their own seeded generator)."""
    more = horizon - z.shape[1]
    rng = np.random.default_rng([seed, 8])
    return np.hstack([z, _shape_draws(w, (z.shape[0], more), rng)]) if more > 0 else z


def rule_margin(
    table: StopTable, x: np.ndarray, min_samples: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the policy computes on simulated streams ``x``: its margin over z_star (-inf
    before ``min_samples``), the small-sample shrink, the running best, mean and variance."""
    n = np.arange(1, x.shape[1] + 1, dtype=np.float64)
    mean = np.cumsum(x, axis=1) / n
    with np.errstate(invalid="ignore", divide="ignore"):
        var = (np.cumsum(x * x, axis=1) - n * mean * mean) / (n - 1)
    sd = np.sqrt(np.maximum(var, 0.0))
    wt = table.sd_weight * (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_sd = np.where(sd > 0, np.log(sd), table.scale_mu)
    post = (table.scale_prec * table.scale_mu + wt * log_sd) / (table.scale_prec + wt)
    best = np.maximum.accumulate(x, axis=1)
    z_star = np.interp(post, table.log_s_grid, table.z_star)
    margin = (best - mean) / np.exp(post) - z_star
    margin[:, : max(min_samples, 2) - 1] = -np.inf
    shrink = 1.0 / np.sqrt(np.maximum(n - 1.0, 1.0))
    return margin, shrink, best, mean, var


def calibrate(
    table: StopTable,
    w: np.ndarray,
    sw: np.ndarray,
    q_alpha: float,
    min_samples: int,
    horizon: int,
    seed: int,
    step: float | None = None,
) -> StopTable:
    """Bisect the offset so that the simulated rule's mean acceptance equals the target; with
    ``step``, on streams rounded to the deployment's lattice (:func:`on_lattice`). Where more
    than ``TRUNCATED_MAX`` of the simulated streams would not have stopped by ``SIM_HORIZON``,
    calibrated again on the streams drawn on to ``horizon`` (at most ``MAX_HORIZON``)."""
    z, log_s = simulated_streams(w, sw, horizon, seed)
    calibrated, truncated = _calibrated(table, z, log_s, q_alpha, min_samples, seed, step)
    longer = min(horizon, MAX_HORIZON)
    if truncated > TRUNCATED_MAX and longer > z.shape[1]:
        z = _drawn_on(z, w, longer, seed)
        calibrated, _ = _calibrated(table, z, log_s, q_alpha, min_samples, seed, step)
    return calibrated


def _calibrated(
    table: StopTable,
    z: np.ndarray,
    log_s: np.ndarray,
    q_alpha: float,
    min_samples: int,
    seed: int,
    step: float | None,
) -> tuple[StopTable, float]:
    """:func:`calibrate` on the simulated streams ``z`` (scales ``log_s``), and the share of
    them the calibrated rule had not stopped by their last draw."""
    x = np.exp(log_s)[:, None] * z
    kappa = np.exp(log_s) * q_alpha
    if step is not None:
        x, kappa = on_lattice(x, kappa, step, np.random.default_rng([seed, 11]))
    # no cap on a lattice: there every level repeats and the tie rules end the rule's run, and
    # the cap moved `rounded-1.0`'s 0.8 out of the band (0.828 -> 0.840; docs/robust-stopping.md,
    # "Lumps: the table calibrated on the streams")
    calibrated, truncated = calibrated_on(table, x, kappa, min_samples, capped=step is None)
    return replace(calibrated, step=step), truncated


def calibrated_on(
    table: StopTable, x: np.ndarray, kappa: np.ndarray, min_samples: int, *, capped: bool = True
) -> tuple[StopTable, float]:
    """``table`` calibrated on the reward streams ``x`` (streams, draws) with benchmarks
    ``kappa``: the offset and slope at which the rule, ending at its ``cap`` (``capped``),
    delivers the target on them, the cap and the Best-of-N in place of the rule
    (:func:`fixed_n_for`); and the share of the streams the rule's crossing had not stopped by
    their last draw."""
    base, shrink, best, _, _ = rule_margin(table, x, min_samples)
    acc_at = _acceptance(best - kappa[:, None])
    curve = acc_at.mean(axis=0)  # Best-of-n's mean acceptance (index n - 1)
    cap = best_of_n_cap(curve, table.target, min_samples, table.cap_factor) if capped else None
    hi, slope, acc, samples, truncated = bisect_offset(
        base, shrink, acc_at, table.target, SLOPES, last=cap
    )
    calibrated = replace(
        table,
        offset=hi,
        slope=slope,
        simulated_acceptance=acc,
        simulated_samples=samples,
        fixed_n=fixed_n_for(curve, acc, samples, table.target, min_samples),
        cap=cap,
    )
    return calibrated, truncated


def bisect_offset(
    base: np.ndarray,
    shrink: np.ndarray,
    acc_at: np.ndarray,
    target: float,
    slopes: tuple[float, ...],
    *,
    last: int | None = None,
    forced: np.ndarray | None = None,
) -> tuple[float, float, float, float, float]:
    """The calibration's search, shared by the stop tables: for each candidate slope, the offset
    (bisected in [-3, 3], 12 steps) at which a stream stopping at the first draw with
    ``base - slope * shrink >= offset`` has mean acceptance ``acc_at[stream, stop]`` of
    ``target``; of those, the (offset, slope) that draws fewest. Returns it with its mean
    acceptance, its mean draws and the share of streams its crossing had not stopped by their
    last draw. A stream stops at its draw ``last - 1`` at the latest (default: its last) and
    at its draw ``forced`` (per stream; another rule's stop) if that comes first."""
    r, t = base.shape
    last = t if last is None else min(last, t)
    rows = np.arange(r)

    def run(dmax: np.ndarray, offset: float) -> tuple[float, float]:
        hit = dmax >= offset
        stop = np.where(hit.any(axis=1), np.argmax(hit, axis=1), last - 1)
        if forced is not None:
            stop = np.minimum(stop, forced)
        stop = np.minimum(stop, last - 1)
        return float(acc_at[rows, stop].mean()), float(stop.mean() + 1)

    choice = None
    for slope in slopes:
        dmax = np.maximum.accumulate(base - slope * shrink, axis=1)
        lo, hi = -3.0, 3.0
        for _ in range(12):
            mid = 0.5 * (lo + hi)
            if run(dmax, mid)[0] >= target:
                hi = mid
            else:
                lo = mid
        acc, samples = run(dmax, hi)
        if choice is None or samples < choice[3]:
            choice = (hi, slope, acc, samples, float((dmax[:, -1] < hi).mean()))
    assert choice is not None
    return choice


def best_of_n_cap(
    curve: np.ndarray, target: float, min_samples: int, factor: float = 1.0
) -> int | None:
    """``factor`` times the least n whose Best-of-n mean acceptance on the simulated streams
    (``curve``, index n - 1) reaches ``target``, at least ``min_samples``: a table rule's last
    draw; None where no n in the simulated horizon reaches it.

    Why: the rule stops where a request's best, standardised by its own mean and sd, reaches a
    threshold set for the deployment's pooled shape. A prompt whose rewards come in a few tight
    lumps (a judge's levels, answers that agree) ends below that shape's tail, and its best may
    never reach the threshold: on such prompts a fifth of the requests ran to the shape-free
    bound (229 draws at 0.9; docs/robust-stopping.md, "Lumps: the table calibrated on the
    streams"). The censored table's rule has ended at its Best-of-N (``factor`` 1) since 2026-11-30
    (:mod:`stoppers.robust.floor_table`); the plain table's at twice it
    (``TABLE_CAP_FACTOR``). The calibration runs with the cap, so the offset already counts the
    capped streams' acceptance.
    """
    reached = np.flatnonzero(curve >= target)
    if not reached.size:
        return None
    return max(math.ceil(factor * (int(reached[0]) + 1)), int(min_samples))


def fixed_n_for(
    curve: np.ndarray, acceptance: float, samples: float, target: float, min_samples: int
) -> int | None:
    """The Best-of-N a request should run instead of the calibrated rule, or None.

    Why: adaptive stopping is promised never to cost more than the Best-of-N that delivers the
    same, and on some shapes the rule cannot keep that promise: where rewards end
    abruptly (uniform, a saturating reward model) a request's mean and sd place its best against
    the benchmark no better than a fixed count does, so the calibrated rule draws as many rewards
    as Best-of-N and, on the real rewards, more. The table's simulation already holds what is
    needed to see it: ``curve`` is Best-of-n's mean acceptance on the simulated streams (index
    n - 1), and the rule delivered ``acceptance`` with ``samples`` rewards on the same streams.
    Where ``samples`` is not at least ``FIXED_N_MARGIN`` below the n that matches ``acceptance``,
    the answer is the n whose acceptance reaches ``target`` (at least ``min_samples``); None
    where the rule pays or no n in the simulated horizon reaches either.
    """
    matched = np.flatnonzero(curve >= acceptance)
    reached = np.flatnonzero(curve >= target)
    if matched.size == 0 or reached.size == 0:
        return None
    if samples < (1.0 - FIXED_N_MARGIN) * (int(matched[0]) + 1):
        return None
    return max(int(reached[0]) + 1, int(min_samples))


def on_lattice(
    x: np.ndarray, kappa: np.ndarray, step: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Simulated streams ``x`` (streams, draws) and their benchmarks ``kappa`` as a lattice
    deployment scores them: each stream's rewards rounded to multiples of ``step`` from a random
    phase (a prompt's location falls anywhere between two levels), and kappa - the alpha-quantile,
    which rounding carries over - rounded with them.

    Why: on a lattice the best moves in whole levels and a best at kappa's level has AR 1, so a
    rule calibrated on continuous streams asks for kappa's level more often than the target needs
    (rounded at 1.0 it delivered 0.829 / 0.953 / 0.991 / 0.997 at targets 0.7 / 0.8 / 0.9 / 0.95;
    docs/robust-stopping.md, "Target mode calibrated on the lattice").
    """
    phase = rng.random(x.shape[0]) * step
    on = step * np.round((x + phase[:, None]) / step) - phase[:, None]
    return on, step * np.round((kappa + phase) / step) - phase


def scale_moments(weights: np.ndarray) -> tuple[float, float]:
    """Mean and variance of log sd under the log-sd histogram's normalised ``weights``; the
    variance is floored at 0.01 (sd 0.1) so a few alike requests cannot pin a new one."""
    centres = bin_centres(S_LO, S_HI, S_BINS)
    mean = float(weights @ centres)
    return mean, max(float(weights @ (centres - mean) ** 2), 0.01)


def scale_prior(s_counts: Any) -> tuple[float, float]:
    """Mean and precision of log sd across the requests counted in ``s_counts`` (> 0 total):
    :func:`scale_moments`, the precision capped at 100."""
    scales = np.asarray(s_counts, dtype=np.float64)
    mean, var = scale_moments(scales / scales.sum())
    return mean, 1.0 / var
