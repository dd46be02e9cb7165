"""Sequential replay: one simulated deployment per ordering, prompts one after another.

Why: ``pandora replay`` replays prompts independently (in parallel chunks), so a policy that
learns across the prompts of a deployment (a :class:`~stoppers.deployment.DeploymentPrior`)
cannot be judged there. Here each ordering ``o`` is one deployment: a random order of the
prompts, a fresh prior, and the prompts served one after another; after each prompt the prior
learns ``prior.update(rewards the policy observed, in observation order)`` - never a reward it
did not pay for, never a later prompt (the one exception, ``lessons``, is a labelled ablation:
:mod:`stoppers.replay.lessons`).

Each prompt's sample order in deployment ``o`` is row ``o`` of
:func:`stoppers.replay.orderings.orderings` (seed, prompt index) - the very stream the
independent engine replays as its ordering ``o`` - so a policy that learns nothing gives the
same numbers both ways, and the fixed-N curves and the oracle of the same streams come from the
existing :mod:`~stoppers.replay.baselines`. The experiments' math is the existing one
(:func:`~stoppers.replay.experiments.savings_rows` / ``profit_rows`` on a
:class:`~stoppers.replay.engine.PromptSummaries`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stoppers.base import StoppingPolicy
from stoppers.deployment import DeploymentPrior
from stoppers.replay.baselines import fixed_acceptance_curves, oracle_outcome
from stoppers.replay.batch import Outcome, PromptBatch
from stoppers.replay.engine import PromptSummaries
from stoppers.replay.orderings import orderings as sample_orderings

__all__ = [
    "DeploymentReplay",
    "Lessons",
    "PolicyMaker",
    "deployment_batch",
    "deployment_summaries",
    "prompt_pools",
    "replay_deployment",
]

# make_policy(prior) -> a fresh policy for one request (prior is None without new_prior).
PolicyMaker = Callable[[DeploymentPrior | None], StoppingPolicy]
# lessons(prompt index, the request's rewards in observation order) -> what the prior learns
# in their place (an ablation: stoppers.replay.lessons)
Lessons = Callable[[int, list[float]], Sequence[float]]


@dataclass(frozen=True)
class DeploymentReplay:
    """What happened at every (ordering, position) of the simulated deployments."""

    prompt: np.ndarray  # (orderings, prompts) int: prompt index served at that position
    samples: np.ndarray  # (orderings, prompts) int: rewards drawn
    kept: np.ndarray  # (orderings, prompts) float: best reward returned
    reason: np.ndarray  # (orderings, prompts) str: stop reason ("budget" past the pool)
    updates: np.ndarray  # (orderings, prompts) bool: prior.update returned True
    learned_before: np.ndarray  # (orderings, prompts) int: updates its prior had counted before
    seed: int
    max_samples: int | None

    @property
    def orderings(self) -> int:
        return self.prompt.shape[0]

    @property
    def prompts(self) -> int:
        return self.prompt.shape[1]

    def per_prompt(self, values: np.ndarray) -> np.ndarray:
        """(orderings, positions) -> (prompts, orderings), indexed by prompt."""
        out = np.empty((self.prompts, self.orderings), dtype=np.asarray(values).dtype)
        rows = np.arange(self.orderings)[:, None]
        out[self.prompt, rows] = values
        return out

    def outcome(self) -> Outcome:
        """The kept rewards in :class:`PromptBatch` row layout (row = prompt * orderings + o)."""
        return Outcome(
            n=self.per_prompt(self.samples).reshape(-1).astype(np.int64),
            best=self.per_prompt(self.kept).reshape(-1),
        )

    def warm(self, after: int) -> np.ndarray:
        """(orderings, prompts) bool mask: positions served after their prior had counted
        ``after`` updates (with task keys, the prior of that position's task)."""
        return self.learned_before >= after


def prompt_pools(rewards: np.ndarray) -> list[np.ndarray]:
    """Each prompt's finite rewards (ValueError: not a matrix, or a prompt with none)."""
    matrix = np.asarray(rewards, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"rewards must be a (prompts, samples) array, got shape {matrix.shape}")
    pools = [row[np.isfinite(row)] for row in matrix]
    if any(p.size == 0 for p in pools):
        raise ValueError("every prompt needs at least one finite reward")
    return pools


def replay_deployment(
    rewards: np.ndarray,
    make_policy: PolicyMaker,
    new_prior: Callable[[], DeploymentPrior] | None,
    *,
    orderings: int,
    seed: int,
    max_samples: int | None = None,
    tasks: Sequence[str] | None = None,
    in_order: bool = False,
    lessons: Lessons | None = None,
) -> DeploymentReplay:
    """Serve every prompt of ``rewards`` (NaN = missing) once per simulated deployment.

    Deployment ``o`` shuffles the prompts with ``default_rng([seed, o, 1])`` (``in_order``:
    serves them in row order, as a deployment whose rewards drift from the first rows' regime
    to the last's; :mod:`stoppers.robust.drift_report`); its prompt ``i``
    streams row ``o`` of that prompt's seeded orderings, cut at ``min(pool, max_samples)``.
    The policy may stop earlier; if it has not stopped when the stream ends, the stop reason is
    ``"budget"``. ``new_prior=None`` runs without a prior (``make_policy(None)``).

    ``tasks`` (one label per prompt) keys the priors as the gateway's ``X-Pandora-Task`` does:
    each deployment keeps one prior per label, created when its first prompt is served, and a
    prompt learns from and teaches only its own label's prior.

    ``lessons`` (an ablation, :mod:`stoppers.replay.lessons`): the prior learns
    ``lessons(prompt index, the request's rewards)`` in place of the request's rewards; the
    served streams are the same.
    """
    if orderings < 1:
        raise ValueError("orderings must be >= 1")
    pools = prompt_pools(rewards)
    count = len(pools)
    labels = [""] * count if tasks is None else [str(t) for t in tasks]
    if len(labels) != count:
        raise ValueError(f"tasks has {len(labels)} labels for {count} prompts")
    streams = []
    for i, pool in enumerate(pools):
        budget = pool.size if max_samples is None else min(pool.size, int(max_samples))
        perm = sample_orderings(pool.size, orderings, seed=seed, prompt_index=i)[:, :budget]
        streams.append(pool[perm])  # (orderings, budget)
    shape = (orderings, count)
    prompt = np.empty(shape, dtype=np.int64)
    samples = np.zeros(shape, dtype=np.int64)
    kept = np.empty(shape)
    reason = np.empty(shape, dtype=object)
    updates = np.zeros(shape, dtype=bool)
    learned_before = np.zeros(shape, dtype=np.int64)
    for o in range(orderings):
        if in_order:
            order = np.arange(count)
        else:
            order = np.random.default_rng([int(seed), o, 1]).permutation(count)
        priors: dict[str, DeploymentPrior] = {}
        counted: dict[str, int] = {}
        for pos, i in enumerate(order):
            task = labels[i]
            if new_prior is not None and task not in priors:
                priors[task] = new_prior()
            prior = priors.get(task)
            policy = make_policy(prior)
            seen: list[float] = []
            for value in streams[i][o].tolist():
                seen.append(value)
                if policy.observe(value):
                    break
            prompt[o, pos] = i
            samples[o, pos] = policy.n
            kept[o, pos] = policy.best
            reason[o, pos] = policy.stop_reason or "budget"
            learned_before[o, pos] = counted.get(task, 0)
            if prior is not None:
                taught = seen if lessons is None else list(lessons(int(i), seen))
                updates[o, pos] = bool(prior.update(taught))
                counted[task] = counted.get(task, 0) + int(updates[o, pos])
    return DeploymentReplay(
        prompt=prompt,
        samples=samples,
        kept=kept,
        reason=reason.astype(str),
        updates=updates,
        learned_before=learned_before,
        seed=int(seed),
        max_samples=max_samples,
    )


def deployment_batch(
    rewards: np.ndarray,
    *,
    orderings: int,
    seed: int,
    alpha: float = 0.99,
    max_samples: int | None = None,
) -> PromptBatch:
    """The :class:`PromptBatch` of exactly the streams :func:`replay_deployment` served."""
    pools = prompt_pools(rewards)
    return PromptBatch.build(
        pools,
        list(range(len(pools))),
        permutations=orderings,
        seed=seed,
        alpha=alpha,
        max_samples=max_samples,
    )


def deployment_summaries(
    rewards: np.ndarray,
    *,
    targets: Mapping[float, DeploymentReplay] | None = None,
    costs: Mapping[float, DeploymentReplay] | None = None,
    alpha: float = 0.99,
    oracle: bool = True,
    mask: Callable[[DeploymentReplay], np.ndarray] | None = None,
) -> PromptSummaries:
    """Per-prompt summaries of sequential replays, for ``savings_rows`` / ``profit_rows``.

    ``targets`` / ``costs`` map each target / cost to its replay (all with one seed, ordering
    count and budget). ``mask(replay)`` -> (orderings, positions) bool keeps only some
    positions (e.g. ``lambda r: r.warm(50)`` for prompts served after the prior had learned
    from 50 requests); a prompt's means are over its kept orderings (NaN if none).
    """
    targets = dict(targets or {})
    costs = dict(sorted((costs or {}).items(), reverse=True))
    runs = [*targets.values(), *costs.values()]
    if not runs:
        raise ValueError("give at least one target or cost replay")
    first = runs[0]
    if any(
        (r.seed, r.orderings, r.prompts, r.max_samples)
        != (first.seed, first.orderings, first.prompts, first.max_samples)
        for r in runs
    ):
        raise ValueError("all replays must share seed, orderings, prompts and max_samples")
    batch = deployment_batch(
        rewards,
        orderings=first.orderings,
        seed=first.seed,
        alpha=alpha,
        max_samples=first.max_samples,
    )
    fixed = fixed_acceptance_curves(batch)
    summaries = PromptSummaries(
        prompts=batch.prompts,
        horizon=batch.horizon,
        costs=tuple(costs),
        targets=tuple(targets),
    )
    summaries.budget[:] = batch.budget[:: batch.permutations]
    summaries.fixed_acceptance[:, : fixed.shape[1]] = fixed

    def means(run: DeploymentReplay) -> tuple[np.ndarray, np.ndarray]:
        out = run.outcome()
        n = batch.per_prompt(out.n).astype(np.float64)
        acc = batch.per_prompt(batch.acceptance(out))
        if mask is not None:
            keep = run.per_prompt(mask(run))
            n = np.where(keep, n, np.nan)
            acc = np.where(keep, acc, np.nan)
        with warnings.catch_warnings():  # a prompt with no kept ordering is NaN, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean(n, axis=1), np.nanmean(acc, axis=1)

    for k, run in enumerate(targets.values()):
        summaries.target_samples[k], summaries.target_acceptance[k] = means(run)
    for k, (cost, run) in enumerate(costs.items()):
        summaries.policy_samples[k], summaries.policy_acceptance[k] = means(run)
        if oracle:
            out = oracle_outcome(batch, cost)
            summaries.oracle_samples[k] = batch.per_prompt(out.n).mean(axis=1)
            summaries.oracle_acceptance[k] = batch.per_prompt(batch.acceptance(out)).mean(axis=1)
    return summaries
