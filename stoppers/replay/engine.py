"""Replay a policy on every prompt of a pool and reduce each prompt to a few numbers.

Work is split into chunks of prompts; each chunk is laid out as one :class:`PromptBatch`
(rows = prompt x ordering) so all its orderings advance together, and chunks run in parallel
worker processes. A chunk returns only per-prompt summaries (means over the orderings, the
fixed-N acceptance curve, the win rate at the matched budget); :mod:`stoppers.replay.experiments`
turns them into the paper's three experiments.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np

from stoppers.replay.baselines import fixed_acceptance_curves, fixed_best, oracle_outcome
from stoppers.replay.batch import Outcome, PromptBatch
from stoppers.replay.loaders import RewardPool
from stoppers.replay.loop import loop_outcome
from stoppers.replay.policies import PolicyChoice, patience_outcome, resolve_policy
from stoppers.replay.streaming import run_streaming

__all__ = ["PromptSummaries", "ReplayConfig", "replay_chunk", "run_replay"]


@dataclass(frozen=True)
class ReplayConfig:
    """Everything a worker needs; plain data so it pickles to worker processes."""

    policy: str = "adaptive"
    target_policy: str = "target"  # the savings experiment's policy ("target" / "tail-target")
    profit_costs: tuple[float, ...] = ()
    winrate_costs: tuple[float, ...] = ()
    targets: tuple[float, ...] = ()
    permutations: int = 100
    alpha: float = 0.99
    delta: float | None = None
    min_samples: int | None = None
    max_samples: int | None = None
    seed: int = 0
    oracle: bool = True
    use_loop: bool = False  # force the per-object loop (reference / policies without fast path)
    # Extra constructor keywords for the policies, e.g. (("empty_tail", "stop"),).
    policy_options: tuple[tuple[str, object], ...] = ()

    @property
    def run_costs(self) -> tuple[float, ...]:
        return tuple(sorted(set(self.profit_costs) | set(self.winrate_costs), reverse=True))


@dataclass
class PromptSummaries:
    """Per-prompt results, prompt-major, for the whole pool (filled chunk by chunk)."""

    prompts: int
    horizon: int
    costs: tuple[float, ...]
    targets: tuple[float, ...]
    budget: np.ndarray = field(init=False)
    fixed_acceptance: np.ndarray = field(init=False)  # (prompts, horizon)
    policy_samples: np.ndarray = field(init=False)  # (costs, prompts) mean samples
    policy_acceptance: np.ndarray = field(init=False)  # (costs, prompts) mean acceptance
    win_rate: np.ndarray = field(init=False)  # (costs, prompts)
    matched_budget: np.ndarray = field(init=False)  # (costs, prompts) the N of the win rate
    oracle_samples: np.ndarray = field(init=False)  # (costs, prompts)
    oracle_acceptance: np.ndarray = field(init=False)
    target_samples: np.ndarray = field(init=False)  # (targets, prompts)
    target_acceptance: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        p, c, t = self.prompts, len(self.costs), len(self.targets)
        self.budget = np.zeros(p, dtype=np.int64)
        self.fixed_acceptance = np.full((p, self.horizon), np.nan)
        for name in ("policy_samples", "policy_acceptance", "win_rate", "matched_budget"):
            setattr(self, name, np.full((c, p), np.nan))
        self.oracle_samples = np.full((c, p), np.nan)
        self.oracle_acceptance = np.full((c, p), np.nan)
        self.target_samples = np.full((t, p), np.nan)
        self.target_acceptance = np.full((t, p), np.nan)

    def absorb(self, chunk: ChunkResult) -> None:
        idx = chunk.indices
        self.budget[idx] = chunk.budget
        width = chunk.fixed_acceptance.shape[1]
        self.fixed_acceptance[idx, :width] = chunk.fixed_acceptance
        # Past a prompt's budget, Best-of-N keeps the whole pool: the curve stays flat.
        self.fixed_acceptance[idx, width:] = chunk.fixed_acceptance[:, -1:]
        for name in (
            "policy_samples",
            "policy_acceptance",
            "win_rate",
            "matched_budget",
            "oracle_samples",
            "oracle_acceptance",
            "target_samples",
            "target_acceptance",
        ):
            getattr(self, name)[:, idx] = getattr(chunk, name)


@dataclass
class ChunkResult:
    indices: np.ndarray
    budget: np.ndarray
    fixed_acceptance: np.ndarray
    policy_samples: np.ndarray
    policy_acceptance: np.ndarray
    win_rate: np.ndarray
    matched_budget: np.ndarray
    oracle_samples: np.ndarray
    oracle_acceptance: np.ndarray
    target_samples: np.ndarray
    target_acceptance: np.ndarray


def replay_chunk(
    pools: Sequence[np.ndarray], indices: Sequence[int], config: ReplayConfig
) -> ChunkResult:
    """All experiments' per-prompt numbers for one chunk of prompts."""
    batch = PromptBatch.build(
        pools,
        indices,
        permutations=config.permutations,
        seed=config.seed,
        alpha=config.alpha,
        max_samples=config.max_samples,
    )
    prefix_max = fixed_best(batch)
    fixed_acc = fixed_acceptance_curves(batch)
    costs = config.run_costs
    p = batch.prompts
    shape_c = (len(costs), p)
    result = ChunkResult(
        indices=np.asarray(indices),
        budget=batch.budget[:: batch.permutations].copy(),
        fixed_acceptance=fixed_acc,
        policy_samples=np.full(shape_c, np.nan),
        policy_acceptance=np.full(shape_c, np.nan),
        win_rate=np.full(shape_c, np.nan),
        matched_budget=np.full(shape_c, np.nan),
        oracle_samples=np.full(shape_c, np.nan),
        oracle_acceptance=np.full(shape_c, np.nan),
        target_samples=np.full((len(config.targets), p), np.nan),
        target_acceptance=np.full((len(config.targets), p), np.nan),
    )
    if costs:
        choice = resolve_policy(config.policy)
        outcomes = run_policy(batch, choice, costs, config, prefix_max)
        for k, (cost, out) in enumerate(zip(costs, outcomes, strict=True)):
            result.policy_samples[k] = batch.per_prompt(out.n).mean(axis=1)
            result.policy_acceptance[k] = batch.per_prompt(batch.acceptance(out)).mean(axis=1)
            if cost in config.winrate_costs:
                wins, matched = matched_budget_wins(batch, out, prefix_max)
                result.win_rate[k] = wins
                result.matched_budget[k] = matched
            if config.oracle and cost in config.profit_costs:
                oracle = oracle_outcome(batch, cost, prefix_max)
                result.oracle_samples[k] = batch.per_prompt(oracle.n).mean(axis=1)
                result.oracle_acceptance[k] = batch.per_prompt(batch.acceptance(oracle)).mean(
                    axis=1
                )
    if config.targets:
        choice = resolve_policy(config.target_policy)
        outcomes = run_policy(batch, choice, config.targets, config, prefix_max)
        for k, out in enumerate(outcomes):
            result.target_samples[k] = batch.per_prompt(out.n).mean(axis=1)
            result.target_acceptance[k] = batch.per_prompt(batch.acceptance(out)).mean(axis=1)
    return result


def run_policy(
    batch: PromptBatch,
    choice: PolicyChoice,
    values: Sequence[float],
    config: ReplayConfig,
    prefix_max: np.ndarray | None = None,
) -> list[Outcome]:
    """One :class:`Outcome` per parameter value (cost or target), fast path when there is one."""
    if not config.use_loop and choice.fast == "patience":
        prefix_max = fixed_best(batch) if prefix_max is None else prefix_max
        out = patience_outcome(batch, dict(choice.fixed)["k"], prefix_max)
        return [out for _ in values]  # Patience ignores the cost
    if not config.use_loop and choice.has_fast_path:
        deciders = [choice.decider(v, config) for v in values]
        return run_streaming(batch, deciders, median=choice.median, prefix_max=prefix_max)
    return [loop_outcome(batch, choice.factory(v, config, batch)) for v in values]


def matched_budget_wins(
    batch: PromptBatch, out: Outcome, prefix_max: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Experiment 2 on one chunk: win rate vs Best-of-N at N = ceil(mean adaptive samples).

    N is the policy's mean sample count on that prompt rounded up (as the authors' replay
    does; a fractional N is not a strategy), capped by the budget. The maxima are compared on
    the same orderings, half credit for ties.
    """
    mean_n = batch.per_prompt(out.n).mean(axis=1)
    budget = batch.budget[:: batch.permutations]
    matched = np.clip(np.ceil(mean_n - 1e-9).astype(np.int64), 1, budget)
    fixed = prefix_max[np.arange(batch.rows), matched[batch.prompt] - 1]
    score = np.where(out.best > fixed, 1.0, np.where(out.best == fixed, 0.5, 0.0))
    return batch.per_prompt(score).mean(axis=1), matched.astype(np.float64)


def run_replay(
    pool: RewardPool,
    config: ReplayConfig,
    *,
    jobs: int | None = None,
    chunk_prompts: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> PromptSummaries:
    """Replay every prompt of ``pool``; ``progress(k)`` is called as k more prompts finish."""
    budgets = (
        pool.sizes if config.max_samples is None else np.minimum(pool.sizes, config.max_samples)
    )
    summaries = PromptSummaries(
        prompts=pool.prompts,
        horizon=int(budgets.max()),
        costs=config.run_costs,
        targets=tuple(config.targets),
    )
    jobs = max(1, min(jobs or os.cpu_count() or 1, pool.prompts))
    if chunk_prompts is None:
        # A few chunks per worker balances the load; bigger chunks amortise numpy overhead.
        chunk_prompts = max(1, min(32, math.ceil(pool.prompts / (4 * jobs))))
    starts = range(0, pool.prompts, chunk_prompts)
    work = [
        (
            list(pool.rewards[s : s + chunk_prompts]),
            list(range(s, min(s + chunk_prompts, pool.prompts))),
        )
        for s in starts
    ]
    if jobs == 1:
        for pools, indices in work:
            summaries.absorb(replay_chunk(pools, indices, config))
            if progress is not None:
                progress(len(indices))
        return summaries
    # forkserver, not fork: the parent may already run threads (tqdm's monitor), and forking a
    # threaded process can deadlock; workers import only numpy/scipy and this package.
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["stoppers.replay.engine"])
    else:  # Windows
        context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as executor:
        futures = [executor.submit(replay_chunk, pools, indices, config) for pools, indices in work]
        for future in as_completed(futures):
            chunk = future.result()
            summaries.absorb(chunk)
            if progress is not None:
                progress(len(chunk.indices))
    return summaries
