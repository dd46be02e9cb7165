"""Which reward streams show two modes on their own: a two-normal fit per stream, Ashman's D.

Why: a shape fitted by likelihood to a deployment's kept streams
(:func:`stoppers.robust.shape_likelihood.fit_shape`) has two modes in two different worlds.
Either every prompt has a better mode and the prompts differ in its weight (the ``mixture``
family), and then a request's own rewards place it under the pooled shape; or the deployment
serves prompts of *different* kinds, a minority of them bimodal, and the two-mode fit is a blend
that fits none of them. In the second world the likelihood path lost badly: on the held-out
``mixed-continuous`` seed-7 pool (8 of its first 24 prompts bimodal) the requests it decided
earned 0.80 of the best fixed N at c = 1e-3, bimodal ones drawing 610 rewards each where the best
fixed N was 93 (docs/robust-stopping.md "A two-mode fit must be the deployment's"). The pooled fit
cannot tell the worlds apart; the streams can, one at a time: in the first world nearly all of them
are bimodal.

The test per stream: standardise it, fit a mixture of two normals by EM, and call it bimodal
when the components are separated by Ashman's D = |mu_1 - mu_2| / sqrt((s_1^2 + s_2^2) / 2)
> 2.5 (Ashman, Bird & Zepf 1994: D > 2 for a clean separation), the fit beats one normal by a
log-likelihood ratio > 2, and the upper component holds >= 4 rewards and at most 0.6 of them
(a better *minority*). Measured on the seed-0 pools (one random stream per prompt, 200 per
pool and length): of 96-reward streams, 0.89 of mixture's are flagged and 0.02-0.13 of the
seven unimodal families' (skew-normal 0.13, Gumbel 0.12, normal 0.06); of 48-reward streams
0.74 and 0.02-0.28 (skew-normal 0.28, lognormal 0.23, Gumbel 0.21).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ASHMAN_D", "MIN_REWARDS", "two_mode_flags", "two_mode_share"]

MIN_REWARDS = 24  # shorter streams are not tested (too few rewards to show a second mode)
ASHMAN_D = 2.5  # separation of the two components
MIN_LLR = 2.0  # two normals must beat one by this log-likelihood ratio
MIN_UPPER = 4.0  # rewards (expected) in the upper component
MAX_UPPER_WEIGHT = 0.6  # the upper component is a minority
EM_ITERATIONS = 100
_LOG_ROOT_2PI = 0.5 * np.log(2.0 * np.pi)


def two_mode_flags(streams: Sequence[Sequence[float]]) -> np.ndarray:
    """One flag per stream of >= ``MIN_REWARDS`` finite rewards (in order; shorter streams are
    skipped): does it show two modes? All streams are fitted at once, padded to the longest."""
    finite = (x[np.isfinite(x)] for x in (np.asarray(s, dtype=np.float64) for s in streams))
    kept = [x for x in finite if x.size >= MIN_REWARDS]
    if not kept:
        return np.zeros(0, dtype=bool)
    width = max(x.size for x in kept)
    mask = np.zeros((len(kept), width))
    values = np.zeros((len(kept), width))
    for i, x in enumerate(kept):
        values[i, : x.size] = x
        mask[i, : x.size] = 1.0
    n = mask.sum(axis=1)
    mean = (values * mask).sum(axis=1) / n
    sd = np.sqrt((((values - mean[:, None]) ** 2) * mask).sum(axis=1) / n)
    spread = sd > 0.0
    z = (values - mean[:, None]) / np.where(spread, sd, 1.0)[:, None] * mask
    # start from each stream's top third against the rest
    ranked = np.sort(np.where(mask > 0.0, z, -np.inf), axis=1)
    cut = ranked[np.arange(len(kept)), (width - n + np.floor(2.0 * n / 3.0)).astype(np.int64)]
    upper = np.where(z >= cut[:, None], 0.95, 0.05) * mask
    for _ in range(EM_ITERATIONS):
        w2 = np.maximum(upper.sum(axis=1), 1e-9)
        w1 = np.maximum(n - w2, 1e-9)
        mu1 = ((mask - upper) * z).sum(axis=1) / w1
        mu2 = (upper * z).sum(axis=1) / w2
        v1 = np.maximum(((mask - upper) * (z - mu1[:, None]) ** 2).sum(axis=1) / w1, 1e-3)
        v2 = np.maximum((upper * (z - mu2[:, None]) ** 2).sum(axis=1) / w2, 1e-3)
        share = w2 / n
        lower_density = _normal(z, mu1, v1) * (1.0 - share)[:, None]
        upper_density = _normal(z, mu2, v2) * share[:, None]
        total = lower_density + upper_density + 1e-300
        upper = upper_density / total * mask
    # z has mean 0 and variance 1, so one normal's maximised log-likelihood is -n (log 2pi + 1)/2
    llr = (np.log(total) * mask).sum(axis=1) + n * (_LOG_ROOT_2PI + 0.5)
    separation = np.abs(mu2 - mu1) / np.sqrt(0.5 * (v1 + v2))
    return (
        spread
        & (separation > ASHMAN_D)
        & (llr > MIN_LLR)
        & (share * n >= MIN_UPPER)
        & (share <= MAX_UPPER_WEIGHT)
    )


def two_mode_share(streams: Sequence[Sequence[float]]) -> float | None:
    """Share of the testable streams (>= ``MIN_REWARDS`` rewards) that show two modes; None
    when there are none."""
    flags = two_mode_flags(streams)
    return float(flags.mean()) if flags.size else None


def _normal(z: np.ndarray, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    return (
        np.exp(-0.5 * (z - mu[:, None]) ** 2 / var[:, None] - _LOG_ROOT_2PI) / np.sqrt(var)[:, None]
    )
