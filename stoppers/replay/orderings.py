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
    keys = rng.random((permutations, size))
    return np.argsort(keys, axis=1, kind="stable")
