"""Cost mode's one-step gain with the request's location and scale integrated out by likelihood.

Why: :class:`~stoppers.robust.shape_cost.ShapePandora` first judged a request's location m and
scale s by its mean and sd, with normal-theory errors (N(mean, s^2/n), and log sd with the
shape's kurtosis). That is efficient for normal rewards and poor for others: on bimodal rewards
(a bulk and a better mode) the sd mixes the two modes, kappa = m + s z_alpha inherits that
noise, and requests kept sampling for a benchmark they had overestimated. The likelihood of the
request's own rewards under the deployment's shape, prod_i f((x_i - m) / s) / s, says where the
good mode sits from the good rewards themselves. Measured before this module was written
(scratch, 24 mixture prompts x 10 orderings, each prompt told its exact shape): the moment
posterior earned 0.995 of the best fixed N at c = 1e-3, the likelihood posterior 1.015.

The shape f is the deployment's, fitted by likelihood to its kept reward streams
(:func:`stoppers.robust.shape_likelihood.fit_shape`: each stream's location and scale integrated
out, so it is not bent by the stopping rule); a request's posterior over (m, log s) is computed
on a grid around its moment estimates (flat in m, the deployment's learned distribution of log
sd as the prior of log s), and Weitzman's test (Definitions "Fair-cap value", "Weitzman's
Algorithm") averages the one-step gain E[(AR_kappa(V) - AR_kappa(M))+] over it, with
V = m + s Z and kappa = m + s z_alpha at every grid node.

A histogram density has no room for a rounding lattice or a point mass at a clip, so
:func:`tied_fraction` tells how many kept streams repeat their rewards; the policy uses this
path only for continuous rewards (``TIED_MAX``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from stoppers.robust.bimodality import two_mode_share
from stoppers.robust.gpd_tail import _acceptance_array, dequantize, lattice_step
from stoppers.robust.shape_likelihood import EM_BINS, EM_HI, EM_LO, fit_shape_with_end

__all__ = [
    "EXACT_UNTIL",
    "GRID_NODES",
    "GRID_SPAN",
    "TIED_MAX",
    "FittedShape",
    "count_modes",
    "dequantized",
    "evaluation_due",
    "mode_split",
    "sd_precision",
    "shared_lattice_step",
    "shared_step",
    "stream_step",
    "stream_ties",
    "tied_fraction",
]

EDGES = np.linspace(EM_LO, EM_HI, EM_BINS + 1)
WIDTH = (EM_HI - EM_LO) / EM_BINS
CENTRES = 0.5 * (EDGES[:-1] + EDGES[1:])
GRID_NODES = 15  # per axis: 225 (m, log s) nodes
GRID_SPAN = 5.0  # the grid spans +-5 normal-theory standard errors around mean and log sd
STREAM_REPEATS = 0.05  # a stream repeating this share of its rewards is on a lattice or a clip
# The likelihood paths (cost and target) are for continuous rewards: once more than this share
# of the kept streams repeat their rewards (rounded scores, a clip) the earlier rules decide.
TIED_MAX = 0.01
# Past this many rewards the likelihood reads them grouped in REWARD_BINS equal-width bins of the
# request's own range, each at its mean with its count: 225 x 256 terms instead of 225 x n. A bin is
# range / 256 wide (~0.03 sd for normal rewards), log f is linear within it except at a bin-centre
# kink of the shape, and at the bin mean the linear part sums exactly, so the posterior barely moves
# (tested; replayed decisions unchanged to four decimals, docs/robust-stopping.md) while an
# evaluation at n = 960 costs a tenth (0.56 ms instead of 5.7): it runs on the event loop.
REWARD_BINS = 256
_FLOOR = 1e-12  # bin probability under which a reward counts as (almost) impossible
# Modes of a fitted shape (count_modes): the density smoothed by a Gaussian of this sd (standardised
# units), peaks at least MODE_MIN_HEIGHT of the highest, and two peaks count as two modes when the
# density between them dips below MODE_DIP of the lower one. Set on fits to the seed-0 pools
# (docs/robust-stopping.md; 40 fits per family and stream count, streams of 20-96 rewards):
# mixture's fits were bimodal in 36 / 38 / 38 / 40 of 40 at 8 / 10 / 16 / 40 streams, the seven
# unimodal families' in 1 of 280 at 8 and at 10 streams and none at 16 or 40 (a floor of 0.1 let a
# Student-t fit's shoulder at 0.11 of the peak through; a dip of 0.85 lost a third of the mixture
# fits).
MODE_SMOOTHING = 0.25
MODE_MIN_HEIGHT = 0.25
MODE_DIP = 0.95
_LAST = float(CENTRES[-1] - CENTRES[0])
_GRID = np.linspace(-GRID_SPAN, GRID_SPAN, GRID_NODES)
_NODE_M = np.repeat(_GRID, GRID_NODES)
_NODE_L = np.tile(_GRID, GRID_NODES)


def stream_ties(stream: Sequence[float]) -> bool | None:
    """Does ``stream`` repeat >= ``STREAM_REPEATS`` of its rewards (rounded or clipped scores)?
    None for a stream of fewer than 2 rewards (it says nothing)."""
    if len(stream) < 2:
        return None
    return len(stream) - len(set(stream)) >= STREAM_REPEATS * len(stream)


def tied_fraction(streams: Sequence[Sequence[float]]) -> float:
    """Fraction of the streams (of >= 2 rewards) that :func:`stream_ties`. Per stream, not per
    reward, so a few clipped prompts among many continuous ones (``mixed``) count."""
    flags = [f for f in map(stream_ties, streams) if f is not None]
    return sum(flags) / len(flags) if flags else 0.0


def stream_step(stream: Sequence[float]) -> float | None:
    """The lattice step of ``stream`` (:func:`~stoppers.robust.gpd_tail.lattice_step`: a value
    other than its lowest and highest repeats), else None (also for fewer than 2 rewards)."""
    return lattice_step(sorted(stream)) if len(stream) >= 2 else None


def shared_step(steps: Sequence[float | None]) -> float | None:
    """The step of the lattice most streams sit on, from their :func:`stream_step` values: the
    median step where at least half of them have one, else None - continuous rewards, or a
    minority of tied streams (clipped prompts among continuous ones)."""
    on_lattice = [step for step in steps if step is not None]
    if not on_lattice or 2 * len(on_lattice) < len(steps):
        return None
    return float(np.median(on_lattice))


def shared_lattice_step(streams: Sequence[Sequence[float]]) -> float | None:
    """:func:`shared_step` of the streams of >= 2 rewards: the lattice a deployment scores on
    (integer or rounded judge ratings)."""
    return shared_step([stream_step(stream) for stream in streams if len(stream) >= 2])


def dequantized(
    streams: Sequence[Sequence[float]], step: float | None
) -> list[Sequence[float]] | list[np.ndarray]:
    """``streams`` as a shape is fitted to them: on a lattice (``step``) each stream's copies of
    a level spread evenly over its rounding cell (:func:`~stoppers.robust.gpd_tail.dequantize`,
    as the cold start's tail fit does). Why: fitted as they are, rounded scores make a lumpy
    shape - integer scores of normal prompts gave it a 0.99-quantile of 2.07 and a
    0.999-quantile of 4.87 (2.31 and 3.01 dequantized, 2.27 and 2.95 fitted to the same
    prompts unrounded; docs/robust-stopping.md "Target mode calibrated on the lattice")."""
    if step is None:
        return list(streams)
    return [dequantize(np.sort(np.asarray(stream, dtype=np.float64)), step) for stream in streams]


def count_modes(p: np.ndarray) -> int:
    """Modes of the shape with probabilities ``p`` on the bins ``EDGES`` (see ``MODE_DIP``):
    a bimodal shape is where the moment errors of a request's location and scale mislead
    (its sd mixes the modes), so the cost default decides such shapes on the likelihood."""
    return len(_peaks(_smoothed(p)))


def _peaks(d: np.ndarray) -> list[int]:
    """Bin indices of the modes of the smoothed density ``d`` (see ``MODE_DIP``), ascending."""
    inner = d[1:-1]
    peaks = np.flatnonzero(
        (inner >= d[:-2]) & (inner > d[2:]) & (inner >= MODE_MIN_HEIGHT * d.max())
    )
    kept: list[int] = []
    for i in (peaks + 1).tolist():
        if kept and d[kept[-1] : i + 1].min() >= MODE_DIP * min(d[i], d[kept[-1]]):
            if d[i] > d[kept[-1]]:
                kept[-1] = i  # no real dip between them: one mode, at the higher peak
            continue
        kept.append(i)
    return kept


def _smoothed(p: np.ndarray) -> np.ndarray:
    """The density of ``p`` smoothed by a Gaussian of sd ``MODE_SMOOTHING``."""
    return ndimage.gaussian_filter1d(
        np.asarray(p, float) / WIDTH, MODE_SMOOTHING / WIDTH, mode="constant"
    )


def mode_split(p: np.ndarray) -> int | None:
    """The bin where a shape with several modes divides into its top mode and the rest: the
    lowest point of the smoothed density between the top two modes (None for one mode)."""
    d = _smoothed(p)
    peaks = _peaks(d)
    if len(peaks) < 2:
        return None
    lo, hi = peaks[-2], peaks[-1]
    return lo + int(np.argmin(d[lo : hi + 1]))


def sd_precision(z: np.ndarray, p: np.ndarray) -> float:
    """Precision of log sd per sample for a shape with values ``z`` and probabilities ``p``:
    4 / (kurtosis - 1), the delta-method variance of a log sample sd (kurtosis floored at 1.5)."""
    mean = float(p @ z)
    var = float(p @ (z - mean) ** 2)
    kurtosis = float(p @ (z - mean) ** 4) / var**2 if var > 0.0 else 3.0
    return 4.0 / max(kurtosis - 1.0, 0.5)


@dataclass(frozen=True)
class FittedShape:
    """The deployment's standardised shape (mean 0, sd 1) fitted by likelihood.

    ``p``: probabilities of the bins ``EDGES`` (width 0.05 on [-8, 8]); ``requests``: the
    prior's request count when the streams were taken (what staleness is judged by);
    ``streams``: how many streams it was fitted to; ``tied``: :func:`tied_fraction` of them;
    ``two_mode_share``: for a fit with more than one mode, the share of those streams that show
    two modes on their own (:func:`stoppers.robust.bimodality.two_mode_share`; None for a
    one-mode fit, for a fit without testable streams, and for a shape not made by :meth:`fit`);
    ``ended``: the streams ended its tail (a bounded tail read from them by likelihood,
    :func:`~stoppers.robust.shape_likelihood.fit_shape_with_end`): rewards with a hard upper end;
    ``tail_mode``: the streams showed a better mode in its top tenth, which its tail keeps (a
    few percent of much better answers; each prompt may hold its own share of them).
    """

    p: np.ndarray
    requests: int
    streams: int
    tied: float
    two_mode_share: float | None = None
    ended: bool = False
    tail_mode: bool = False

    @classmethod
    def fit(
        cls, streams: Sequence[Sequence[float]], requests: int, step: float | None = None
    ) -> FittedShape | None:
        """Fit to ``streams`` (rewards in observation order); None if none is usable. On a
        lattice (``step``) the shape is fitted to them :func:`dequantized`; ``tied`` and the
        two-mode share are read on them as they are."""
        fit = fit_shape_with_end(dequantized(streams, step), EDGES)
        if fit is None:
            return None
        share = two_mode_share(streams) if count_modes(fit.shape) > 1 else None
        return cls(
            p=fit.shape,
            requests=int(requests),
            streams=len(streams),
            tied=tied_fraction(streams),
            two_mode_share=share,
            ended=fit.ended,
            tail_mode=fit.tail_mode,
        )

    def __post_init__(self) -> None:
        p = np.asarray(self.p, dtype=np.float64)
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "_log_density", np.log(np.maximum(p, _FLOOR) / WIDTH))
        # sets the grid's log-scale span
        object.__setattr__(self, "sd_precision", sd_precision(CENTRES, p))
        object.__setattr__(self, "modes", count_modes(p))
        # tables derived from this shape, built on first use (multiplier_target's)
        object.__setattr__(self, "tables", {})

    def quantile(self, alpha: float) -> float:
        """The shape's alpha-quantile z_alpha (the benchmark in standardised units)."""
        i = int(np.searchsorted(np.cumsum(self.p), alpha))
        return float(CENTRES[min(i, CENTRES.size - 1)])

    def posterior(
        self, rewards: np.ndarray, scale_mu: float, scale_precision: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(m, s, weights): a request's posterior over its location and scale on the grid.

        sum_i log f((x_i - m) / s) - n log s (flat in m and log s) plus the log-sd prior
        N(scale_mu, 1 / scale_precision), on 15 x 15 nodes +-5 normal-theory standard errors
        around the mean and log sd; nodes under a millionth of the top node's weight dropped.
        """
        m, s, log_post, _ = self._grid(rewards, scale_mu, scale_precision)
        w = np.exp(log_post - log_post.max())
        keep = w > 1e-6  # nodes with under a millionth of the top node's weight add nothing
        return m[keep], s[keep], w[keep] / w[keep].sum()

    def log_posterior(
        self, rewards: np.ndarray, scale_mu: float, scale_precision: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(m, s, log weight) at every node of :meth:`posterior`'s grid, unnormalised: the log
        likelihood plus the log-sd prior plus the log of the node's cell in log s (the grid's
        log-s step depends on the shape's kurtosis), so that the weights' sum is comparable
        across shapes - the evidence a mixture of shapes weighs its components by."""
        m, s, log_post, log_cell = self._grid(rewards, scale_mu, scale_precision)
        return m, s, log_post + log_cell

    def _grid(
        self, rewards: np.ndarray, scale_mu: float, scale_precision: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """(m, s, log likelihood + log-sd prior, log of a node's cell in log s) on the grid."""
        x = np.asarray(rewards, dtype=np.float64)
        n = x.size
        mean = float(x.mean())
        sd = float(x.std(ddof=1))
        m = mean + _NODE_M * sd / math.sqrt(n)
        root = math.sqrt(self.sd_precision * (n - 1))  # log s step: 1 / root (x grid step)
        log_s = math.log(sd) + _NODE_L / root
        s = np.exp(log_s)
        # log f linear between bin centres: a step density would make the likelihood jump as
        # rewards cross bin edges (a jagged posterior once n is in the hundreds)
        values, counts = _grouped(x)
        u = np.clip((values[None, :] - m[:, None]) / s[:, None] - CENTRES[0], 0.0, _LAST) / WIDTH
        i = np.minimum(u.astype(np.int64), EM_BINS - 2)
        t = u - i
        log_f = self._log_density
        terms = (1.0 - t) * log_f[i] + t * log_f[i + 1]
        log_post = (terms.sum(axis=1) if counts is None else terms @ counts) - n * log_s
        log_post -= 0.5 * scale_precision * (log_s - scale_mu) ** 2
        return m, s, log_post, -math.log(root)

    def node_gains(self, m: np.ndarray, s: np.ndarray, best: float, z_alpha: float) -> np.ndarray:
        """E[(AR(m + sZ - kappa) - AR(best - kappa))+] at each node, kappa = m + s z_alpha: the
        bins past kappa accept with probability 1, those between the best and kappa with AR."""
        base = _acceptance_array(best - (m + s * z_alpha))
        lo = int(np.searchsorted(CENTRES, float(np.min((best - m) / s))))
        zt, pt = CENTRES[lo:], self.p[lo:]
        ar = _acceptance_array(s[:, None] * (zt[None, :] - z_alpha))
        return np.maximum(ar - base[:, None], 0.0) @ pt

    def posterior_gain(
        self,
        rewards: np.ndarray,
        best: float,
        z_alpha: float,
        scale_mu: float,
        scale_precision: float,
    ) -> tuple[float, float]:
        """(one-step gain, posterior mean of kappa) for a request holding ``rewards``: the
        gain of :meth:`node_gains` averaged over :meth:`posterior`."""
        m, s, w = self.posterior(rewards, scale_mu, scale_precision)
        return float(w @ self.node_gains(m, s, best, z_alpha)), float(w @ (m + s * z_alpha))


def _grouped(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The rewards as (values, counts): themselves (counts None) up to ``REWARD_BINS``, else
    the means and counts of the occupied equal-width bins of their range."""
    if x.size <= REWARD_BINS:
        return x, None  # the usual case (every reward while n <= 32): no reductions spent
    lo, hi = float(x.min()), float(x.max())
    if not hi > lo:
        return x, None
    k = np.minimum(((x - lo) * (REWARD_BINS / (hi - lo))).astype(np.int64), REWARD_BINS - 1)
    counts = np.bincount(k, minlength=REWARD_BINS).astype(np.float64)
    sums = np.bincount(k, weights=x, minlength=REWARD_BINS)
    occupied = counts > 0.0
    return sums[occupied] / counts[occupied], counts[occupied]


EXACT_UNTIL = 32  # posterior stop tests run on every reward up to here (evaluation_due)


def evaluation_due(n: int, best: float, last_n: int, last_best: float) -> bool:
    """Re-evaluate a posterior stop test at the n-th reward? On every reward while n <=
    ``EXACT_UNTIL``, later only when the best has risen or n has grown by 1/32 since the last
    evaluation (``last_n``, ``last_best``): the parameters drift slowly. Shared by the cost
    paths and target mode's multiplier rule."""
    return n <= EXACT_UNTIL or best > last_best or n >= last_n + n // 32
