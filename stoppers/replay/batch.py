"""A group of prompts laid out for vectorised replay: one row per (prompt, ordering).

Rows are prompt-major (``row = prompt * permutations + p``) so per-prompt means are a reshape
away. Each row carries its stream of rewards in ordering order, the ranks of those rewards in
the prompt's sorted pool (for the Fenwick statistics), its budget (``min(max_samples, pool
size)``) and its benchmark kappa.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from stoppers.replay.metrics import acceptance_rate, benchmark
from stoppers.replay.orderings import orderings

__all__ = ["Outcome", "PromptBatch"]


@dataclass(frozen=True)
class Outcome:
    """What one policy did on every row: samples drawn and the best reward kept."""

    n: np.ndarray  # (rows,) int
    best: np.ndarray  # (rows,) float


@dataclass(frozen=True)
class PromptBatch:
    values: np.ndarray  # (rows, T) rewards in stream order; -inf past the row's budget
    ranks: np.ndarray  # (rows, T) rank in the prompt's sorted pool; width + t past the budget
    budget: np.ndarray  # (rows,) samples a policy may draw
    kappa: np.ndarray  # (rows,) benchmark reward of the row's prompt
    prompt: np.ndarray  # (rows,) local prompt index
    sorted_pool: np.ndarray  # (prompts, M) each prompt's sorted pool, padded with +inf
    first_greater: np.ndarray  # (prompts, M) first rank whose value exceeds sorted_pool[j]
    first_not_less: np.ndarray  # (prompts, M) first rank whose value equals sorted_pool[j]
    reference: np.ndarray  # (rows,) the prompt's max, the reference of the tail weights
    permutations: int
    prompt_indices: np.ndarray  # (prompts,) global prompt index of each local prompt

    @property
    def rows(self) -> int:
        return self.values.shape[0]

    @property
    def prompts(self) -> int:
        return len(self.prompt_indices)

    @property
    def horizon(self) -> int:
        return self.values.shape[1]

    @classmethod
    def build(
        cls,
        pools: Sequence[np.ndarray],
        prompt_indices: Sequence[int],
        *,
        permutations: int,
        seed: int,
        alpha: float,
        max_samples: int | None = None,
    ) -> PromptBatch:
        """Lay out ``pools`` (one 1-D array per prompt) with their seeded orderings."""
        if permutations < 1:
            raise ValueError("permutations must be >= 1")
        sizes = np.array([len(p) for p in pools], dtype=np.int64)
        budgets = sizes if max_samples is None else np.minimum(sizes, int(max_samples))
        horizon = int(budgets.max())
        width = int(sizes.max())
        prompts = len(pools)
        rows = prompts * permutations
        values = np.full((rows, horizon), -np.inf)
        # Past a row's budget: distinct ranks above every real one (never read as values).
        ranks = np.broadcast_to(width + np.arange(horizon, dtype=np.int64), (rows, horizon)).copy()
        sorted_pool = np.full((prompts, width), np.inf)
        first_greater = np.zeros((prompts, width), dtype=np.int64)
        first_not_less = np.zeros((prompts, width), dtype=np.int64)
        kappa = np.empty(prompts)
        reference = np.empty(prompts)
        for i, (pool, global_index) in enumerate(zip(pools, prompt_indices, strict=True)):
            pool = np.asarray(pool, dtype=np.float64)
            m, b = len(pool), int(budgets[i])
            order = np.argsort(pool, kind="stable")
            rank_of = np.empty(m, dtype=np.int64)
            rank_of[order] = np.arange(m)
            srt = pool[order]
            sorted_pool[i, :m] = srt
            first_greater[i, :m] = np.searchsorted(srt, srt, side="right")
            first_not_less[i, :m] = np.searchsorted(srt, srt, side="left")
            kappa[i] = benchmark(pool, alpha)
            reference[i] = srt[-1]
            perm = orderings(m, permutations, seed=seed, prompt_index=int(global_index))[:, :b]
            block = slice(i * permutations, (i + 1) * permutations)
            values[block, :b] = pool[perm]
            ranks[block, :b] = rank_of[perm]
        prompt = np.repeat(np.arange(prompts), permutations)
        return cls(
            values=values,
            ranks=ranks,
            budget=np.repeat(budgets, permutations),
            kappa=kappa[prompt],
            prompt=prompt,
            sorted_pool=sorted_pool,
            first_greater=first_greater,
            first_not_less=first_not_less,
            reference=reference[prompt],
            permutations=permutations,
            prompt_indices=np.asarray(prompt_indices, dtype=np.int64),
        )

    @cached_property
    def stream_acceptance(self) -> np.ndarray:
        """(rows, T): AR of every streamed reward against its prompt's kappa (0 past budget)."""
        return acceptance_rate(self.values, self.kappa[:, None])

    def acceptance(self, outcome: Outcome) -> np.ndarray:
        """AR of each row's kept reward against its prompt's kappa."""
        return acceptance_rate(outcome.best, self.kappa)

    def per_prompt(self, row_values: np.ndarray) -> np.ndarray:
        """(rows,) -> (prompts, permutations)."""
        return np.asarray(row_values).reshape(self.prompts, self.permutations)

    def pool(self, local_prompt: int) -> np.ndarray:
        srt = self.sorted_pool[local_prompt]
        return srt[np.isfinite(srt)]
