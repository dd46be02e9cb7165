"""What a replayed deployment's prior learns from each request: its own rewards, or (an
ablation) draws of the served prompt that no stopping rule selected.

Why: a request's rewards are selected by the rule that stopped it, and at a low target they
are few. At a low target a request stops soon after its prompt's top answer turns up, so the
long streams a prior keeps are mostly those that missed it; and a warm request leaves 10-40
rewards, from which the target tables' pseudo-prompts (:mod:`stoppers.robust.stream_bootstrap`,
one kernel density per kept stream) read a prompt's top. This ablation measures what each
costs: the prior is taught, in each request's place, draws of the served prompt's whole row
made without looking at them. A gateway cannot run it (it would pay for draws no request asked
for); the replay reports label it as an ablation. Measured (docs/robust-stopping.md, "What the
kept streams' selection and length cost"): in target mode the length, not the selection; in
cost mode neither.

* ``served``: the request's own rewards, in the order observed (what the gateway does);
* ``unselected``: ``UNSELECTED_DRAWS`` draws without replacement from the prompt's row (all of
  it if shorter): no selection, and every request a long stream;
* ``unselected-matched``: as many draws as the deployment's previous request observed (the
  first request: ``UNSELECTED_DRAWS``): no selection, the served lengths' distribution. Set
  against ``unselected`` it splits the cost between the selection and the streams' lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stoppers.replay.deployment import Lessons, prompt_pools

__all__ = ["LESSONS", "UNSELECTED_DRAWS", "Lessons", "UnselectedDraws", "lessons_for"]

LESSONS = ("served", "unselected", "unselected-matched")
UNSELECTED_DRAWS = 96  # the priors keep a stream's first 96 rewards (shape_prior.STREAM_REWARDS)


class UnselectedDraws:
    """:data:`Lessons` of unselected draws from each prompt's pool (module docstring).

    ``pools``: each prompt's finite rewards, indexed as the replay's prompts; ``matched``: draw
    as many as the previous request observed; ``seed``: the draws' own generator, apart from
    the replay's orderings (the served streams are the same with any lessons)."""

    def __init__(
        self,
        pools: Sequence[np.ndarray],
        *,
        matched: bool = False,
        draws: int = UNSELECTED_DRAWS,
        seed: int = 0,
    ) -> None:
        if draws < 1:
            raise ValueError(f"draws must be >= 1, got {draws}")
        self._pools = [np.asarray(p, dtype=np.float64) for p in pools]
        self._matched = matched
        self._draws = int(draws)
        self._previous = int(draws)
        self._rng = np.random.default_rng([int(seed), 0x1E55])

    def __call__(self, prompt: int, seen: list[float]) -> list[float]:
        count = self._previous if self._matched else self._draws
        self._previous = len(seen)
        pool = self._pools[prompt]
        picked = self._rng.choice(pool.size, size=min(count, pool.size), replace=False)
        return pool[picked].tolist()


def lessons_for(name: str, rewards: np.ndarray, *, seed: int = 0) -> Lessons | None:
    """The :data:`Lessons` called ``name`` (one of :data:`LESSONS`) for the pool ``rewards``
    (prompts x samples, NaN = missing); None for ``served`` (the replay's default)."""
    if name not in LESSONS:
        raise ValueError(f"lessons must be one of {LESSONS}, got {name!r}")
    if name == "served":
        return None
    return UnselectedDraws(prompt_pools(rewards), matched=name == "unselected-matched", seed=seed)
