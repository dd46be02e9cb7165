"""The reference driver: feed each ordering to a fresh per-request policy object.

This is how the gateway runs a policy (one ``observe`` per scored candidate), so it is the
ground truth the vectorised fast paths are tested against, and the fallback for any
:class:`~stoppers.base.StoppingPolicy` without a fast path. It is a Python loop over
prompts x orderings x samples: fine for tests and small replays, far too slow for the paper's
200 x 100 x 960 (see the README's measurement).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stoppers.base import StoppingPolicy
from stoppers.replay.batch import Outcome, PromptBatch

__all__ = ["PolicyFactory", "loop_outcome"]

# factory(local_prompt, budget) -> a fresh policy for one ordering of that prompt.
PolicyFactory = Callable[[int, int], StoppingPolicy]


def loop_outcome(
    batch: PromptBatch,
    factory: PolicyFactory,
    *,
    rows: np.ndarray | None = None,
) -> Outcome:
    """Run one fresh policy per row (all rows, or the given ``rows``) until it stops."""
    chosen = np.arange(batch.rows) if rows is None else np.asarray(rows)
    n = np.zeros(chosen.size, dtype=np.int64)
    best = np.empty(chosen.size)
    for out, row in enumerate(chosen):
        budget = int(batch.budget[row])
        policy = factory(int(batch.prompt[row]), budget)
        stream = batch.values[row, :budget].tolist()
        for reward in stream:
            if policy.observe(reward):
                break
        n[out] = policy.n
        best[out] = policy.best
    return Outcome(n=n, best=best)
