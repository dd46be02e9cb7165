"""Seeded random orderings of a prompt's pool, reproducible per prompt.

Each prompt's orderings come from ``default_rng([seed, prompt_index])``, so they do not depend
on how prompts are split across worker processes, and every policy (and every fixed N) of one
run sees exactly the same streams — the paper compares them "on the same orderings".
"""

from __future__ import annotations

import numpy as np

__all__ = ["orderings"]


def orderings(size: int, permutations: int, *, seed: int, prompt_index: int) -> np.ndarray:
    """``[permutations, size]`` int array; row p is a uniformly random permutation of the pool."""
    rng = np.random.default_rng([int(seed), int(prompt_index)])
    base = np.broadcast_to(np.arange(size, dtype=np.int64), (permutations, size))
    return rng.permuted(base, axis=1)
