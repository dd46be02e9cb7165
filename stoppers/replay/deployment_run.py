"""``pandora replay --deployment``: the savings/profit experiments on sequential deployments.

Each ordering is one simulated deployment (:func:`stoppers.replay.deployment.replay_deployment`):
prompts in a random order, one fresh deployment prior, ``prior.update`` after each prompt. A
policy class opts into learning by a ``deployment_prior`` attribute (a zero-argument callable
returning a fresh :class:`~stoppers.deployment.DeploymentPrior`); it then receives ``prior=``.
Other policies learn nothing and give the same numbers as the independent engine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from stoppers.replay.deployment import deployment_summaries, replay_deployment
from stoppers.replay.experiments import profit_rows, savings_rows
from stoppers.replay.loaders import ReplayInputError, load_rewards, load_task_labels
from stoppers.replay.policies import resolve_policy
from stoppers.replay.results import write_results

__all__ = ["run_deployment_request"]


def _maker(name: str, value: float, config: Any, budget: int):
    choice = resolve_policy(name)
    cls = choice.policy_class()
    kwargs = choice.constructor_kwargs(value, config, budget)
    new_prior = getattr(cls, "deployment_prior", None)

    def make(prior):
        return cls(**kwargs, prior=prior) if prior is not None else cls(**kwargs)

    return make, new_prior


def run_deployment_request(
    request: Any, *, warm_after: int = 0, task_key: str | None = None
) -> tuple[dict, list[Path]]:
    """Run a :class:`~stoppers.replay.run.ReplayRequest` sequentially; write results.json.

    ``warm_after`` > 0 adds ``savings_warm`` / ``profit_warm``: the same experiments on the
    positions served after the prior had counted that many requests. ``task_key`` names the
    file's per-prompt label array that keys the priors (one per label per deployment, as the
    gateway's ``X-Pandora-Task`` does); "warm" then counts the prompt's own task's prior.
    """
    started = time.perf_counter()
    if "winrate" in request.experiments and len(request.experiments) == 1:
        raise ValueError("--deployment runs the profit and savings experiments, not winrate")
    pool = load_rewards(request.file, key=request.key, field=request.field)
    if request.prompts is not None:
        pool = pool.head(request.prompts)
    config = request.config
    rewards = np.full((pool.prompts, pool.max_samples), np.nan)
    for i, row in enumerate(pool.rewards):
        rewards[i, : len(row)] = row
    if config.max_samples is not None and config.max_samples > pool.max_samples:
        raise ReplayInputError(
            f"{pool.source}: --max-samples {config.max_samples} exceeds the "
            f"{pool.max_samples} samples per prompt in the file"
        )
    budget = config.max_samples or pool.max_samples
    tasks = None
    if task_key is not None:
        tasks = load_task_labels(request.file, task_key)[: pool.prompts]
        if len(tasks) != pool.prompts:
            raise ReplayInputError(
                f"{request.file}[{task_key}]: {len(tasks)} task labels for {pool.prompts} prompts"
            )

    def run(name: str, values: tuple[float, ...]) -> dict:
        out = {}
        for value in values:
            make, new_prior = _maker(name, value, config, budget)
            out[value] = replay_deployment(
                rewards,
                make,
                new_prior,
                orderings=config.permutations,
                seed=config.seed,
                max_samples=config.max_samples,
                tasks=tasks,
            )
        return out

    targets = run(config.target_policy, config.targets) if config.targets else {}
    costs = run(config.policy, config.profit_costs) if config.profit_costs else {}
    results: dict[str, Any] = {
        "meta": {
            "file": str(request.file),
            "source": pool.source,
            "prompts": pool.prompts,
            "samples": int(pool.sizes.max()),
            "max_samples": config.max_samples,
            "permutations": config.permutations,
            "policy": config.policy,
            "target_policy": config.target_policy if config.targets else None,
            "alpha": config.alpha,
            "delta": config.delta,
            "seed": config.seed,
            "seconds": 0.0,
            "engine": "deployment",
            "warm_after": warm_after,
            "task_key": task_key,
            "tasks": None if tasks is None else len(set(tasks)),
        },
        "profit": [],
        "winrate": [],
        "savings": [],
    }
    for suffix, mask in (("", None), ("_warm", lambda r: r.warm(warm_after))):
        if suffix and warm_after <= 0:
            continue
        s = deployment_summaries(
            rewards, targets=targets, costs=costs, alpha=config.alpha, mask=mask
        )
        results["savings" + suffix] = savings_rows(s) if targets else []
        results["profit" + suffix] = profit_rows(s, tuple(costs)) if costs else []
    results["meta"]["seconds"] = round(time.perf_counter() - started, 3)
    return results, [write_results(results, Path(request.out))]
