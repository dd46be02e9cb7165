"""A recorded pool redrawn to many samples per prompt: a smoothed bootstrap of its rows.

Why: the AlpacaEval pool in ``../shared/data`` is the only real reward data here, but it holds
49 responses per prompt, so a replay on it is capped at 49 draws, drawn without replacement, and
its benchmark kappa (the 0.99-quantile of 49 values) sits between the top two responses. Target
mode cannot be measured meaningfully there (docs/robust-stopping.md, "The real pool's shapes at
960 draws"), and redrawing the 49 with replacement gives atoms a generator never returns (the
same section of 2026-11-28). A smoothed bootstrap keeps what the judge does - each prompt's level,
spread and lumps, a lone best far above the rest, the pile-up at the judge's clip - and gives a
continuum between them:

* each draw picks one of the row's rewards uniformly at random;
* a reward at the pool's clip (the lowest or highest value of the whole matrix, where it
  repeats: the judge's clipped probabilities) is kept exactly, as a clipped score is;
* any other reward is moved by N(0, bandwidth^2) and clipped back into the pool's range.

``bandwidth`` is in reward units (the AlpacaEval logits: 0.5 is an eighth of a prompt's median
within-prompt sd of 3.9 among its unclipped rewards). The result is reproducible from ``seed``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["smoothed_pool"]


def smoothed_pool(
    rows: Sequence[ArrayLike],
    *,
    samples: int,
    bandwidth: float,
    seed: int = 0,
    prompts: int | None = None,
) -> np.ndarray:
    """``[prompts x samples]`` rewards redrawn from ``rows`` - one prompt's rewards each, of any
    length (a NaN-padded matrix works too: NaN = missing, ignored) - by the smoothed bootstrap
    of the module docstring.

    >>> pool = np.array([[-9.0, -9.0, 1.0, 4.0], [-9.0, 9.0, 9.0, 0.0]])
    >>> out = smoothed_pool(pool, samples=6, bandwidth=0.5, seed=1)
    >>> out.shape, bool(out.min() >= -9.0), bool(out.max() <= 9.0)
    ((2, 6), True, True)
    """
    if isinstance(rows, np.ndarray) and rows.ndim != 2:
        raise ValueError("a matrix of rewards must be [prompts x samples]")
    if samples < 2:
        raise ValueError("samples must be at least 2")
    if not (bandwidth >= 0.0 and np.isfinite(bandwidth)):
        raise ValueError("bandwidth must be a finite number >= 0")
    if prompts is not None and prompts < 1:
        raise ValueError("prompts must be at least 1")
    kept = [np.asarray(row, dtype=np.float64).ravel() for row in rows][:prompts]
    if not kept:
        raise ValueError("rewards must hold at least one prompt's row")
    kept = [row[np.isfinite(row)] for row in kept]
    finite = np.concatenate(kept)
    if finite.size == 0:
        raise ValueError("rewards hold no finite value")
    low, high = float(finite.min()), float(finite.max())
    clips = [v for v in (low, high) if np.count_nonzero(finite == v) > 1]
    rng = np.random.default_rng(seed)
    out = np.empty((len(kept), samples), dtype=np.float64)
    for i, row in enumerate(kept):
        if row.size == 0:
            raise ValueError(f"row {i} holds no finite reward")
        base = row[rng.integers(0, row.size, size=samples)]
        jitter = bandwidth * rng.standard_normal(samples)
        at_clip = np.isin(base, clips)
        out[i] = np.where(at_clip, base, np.clip(base + jitter, low, high))
    return out
