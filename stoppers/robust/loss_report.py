"""Where a cost policy loses profit: ``python -m stoppers.robust.loss_report FILE --cost C``.

Why: the profit tables say *how much* the default earns against the best fixed N and
Weitzman's oracle, not *where* it loses. Each diagnosis of issue 8 (the AlpacaEval floor stops,
the mixture oversampling) needed the same split, so it is one tool: sequential deployments
(:func:`~stoppers.replay.deployment.replay_deployment`, the streams ``pandora replay
--deployment`` serves), every request's profit AR(kept) - c n set against

* the best fixed N chosen in hindsight on the same streams (one N for the whole pool, as in
  :func:`~stoppers.replay.experiments.profit_rows`), and
* the oracle on the same stream (Weitzman's rule with the prompt's distribution known), its
  gap split into a *sampling* part c (n - n_oracle) and an *acceptance* part
  AR(oracle's kept) - AR(policy's kept),

grouped by the policy's stop reason or (``--by path``) by what decided the request: the
default's cold start (TailPandora: nothing learned yet, or tied rewards), its likelihood path,
or its trusted learned shape (the moment path). Losses are per deployment (summed over its
prompts, averaged over the deployments), so a group's share of the whole gap reads directly;
each group also gets its own profit ratio to the best fixed N on the same requests, which is
what says whether a 24-prompt deployment's shortfall is its first requests' (nothing learned)
or the learned rule's.

The profit ratio comes with two standard errors: over the deployments (the prompts held
fixed: how much of a miss the replay's own noise could explain) and over the prompts (each
prompt's mean over the deployments: how far a fresh draw of as many prompts could move it).

``--task-key ARRAY`` keys the priors by a per-prompt label of the file (e.g. ``family``), as
the gateway's ``X-Pandora-Task`` does, and ``--by task`` groups the requests by that label.
``--by position`` groups them by when their deployment served them (#1, #2-3, #4-7, ...): how
much of the gap is the first requests', served before the prior has learned anything.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stoppers import default_cost_policy, new_deployment_prior
from stoppers.base import StoppingPolicy
from stoppers.deployment import DeploymentPrior
from stoppers.faircap import acceptance_rate
from stoppers.replay.baselines import fixed_best, oracle_outcome
from stoppers.replay.batch import PromptBatch
from stoppers.replay.deployment import deployment_batch, replay_deployment
from stoppers.replay.lessons import LESSONS, lessons_for
from stoppers.replay.loaders import load_task_labels
from stoppers.robust.cost import TailPandora
from stoppers.robust.shape_cost import ShapePandora

__all__ = [
    "LossBreakdown",
    "ReasonLoss",
    "decision_path",
    "fixed_profits",
    "load_pool",
    "loss_breakdown",
    "main",
    "position_bins",
    "ratio_standard_errors",
    "save_rows",
    "standard_error",
]

POLICIES = ("default", "tail")
GROUPINGS = ("reason", "path", "task", "position")
GROUP_NAMES = {
    "reason": "stop reason",
    "path": "decision path",
    "task": "task",
    "position": "position in the deployment",
}


@dataclass(frozen=True)
class ReasonLoss:
    """The requests of one group (a stop reason, or a decision path), and what they lost per
    deployment."""

    reason: str  # the group's name: a stop reason, or a decision_path label
    requests: int
    samples: float  # mean samples per request
    loss_vs_fixed: float  # sum over a deployment's requests of (fixed N profit - policy profit)
    loss_vs_oracle: float  # the same against the oracle: sampling_part + acceptance_part
    sampling_part: float  # c (n - n_oracle)
    acceptance_part: float  # AR(oracle's kept) - AR(policy's kept)
    profit_vs_fixed: float  # these requests' profit / the best fixed N's on the same requests


@dataclass(frozen=True)
class LossBreakdown:
    """Mean profit per request of the policy, the best fixed N and the oracle, and the split."""

    cost: float
    best_fixed_n: int
    profit: float
    fixed_profit: float
    oracle_profit: float
    samples: float
    oracle_samples: float
    reasons: tuple[ReasonLoss, ...]
    # with task labels: the mean profit of the best fixed N chosen per task in hindsight (a
    # user who knows the tasks could tune N per task: the stricter baseline)
    task_fixed_profit: float | None = None
    # standard errors of profit / fixed_profit: across the deployments (the prompts fixed; the
    # replay's own noise) and across the prompts (each prompt's mean over the deployments; how
    # far a fresh draw of as many prompts from the same family could move the ratio)
    se_deployments: float = float("nan")
    se_prompts: float = float("nan")
    # per request, in batch layout (row = prompt * orderings + ordering): the policy's profit,
    # the best fixed N's on the same stream, and when its deployment served it (0-based); what
    # :mod:`stoppers.robust.paired_report` sets against another rule's on the same streams
    request_profit: np.ndarray | None = None
    request_fixed_profit: np.ndarray | None = None
    request_position: np.ndarray | None = None


def _policy_maker(
    name: str, cost: float, max_samples: int
) -> tuple[
    Callable[[DeploymentPrior | None], StoppingPolicy], Callable[[], DeploymentPrior] | None
]:
    if name == "default":
        return (
            lambda prior: default_cost_policy(cost, max_samples=max_samples, prior=prior),
            lambda: new_deployment_prior("cost"),
        )
    if name == "tail":
        return (lambda _prior: TailPandora(cost, max_samples=max_samples)), None
    raise ValueError(f"policy must be one of {POLICIES}, got {name!r}")


def decision_path(policy: StoppingPolicy) -> str:
    """What decides ``policy``'s request: ``"cold start"`` (TailPandora, the default's rule
    until its prior has learned enough and for tied rewards), ``"streams"`` (the Best-of-N its
    lumpy kept streams say pays, in the cold start's place), ``"likelihood"`` (the default's
    likelihood path), ``"censored"`` (its floor read as censoring), ``"cut"`` (its floor read
    as cutting one latent shape), ``"learned shape"`` (its trusted recorded shape, the moment
    path); other policies by class name."""
    if isinstance(policy, ShapePandora):
        if policy.streams_n is not None:
            return "streams"
        if not policy.warm:
            return "cold start"
        if policy.censored:
            return "cut" if policy.floor_cuts else "censored"
        return "likelihood" if policy.fitted_shape is not None else "learned shape"
    return type(policy).__name__


def loss_breakdown(
    rewards: np.ndarray,
    cost: float,
    *,
    policy: str = "default",
    orderings: int = 30,
    seed: int = 0,
    max_samples: int | None = None,
    alpha: float = 0.99,
    by: str = "reason",
    tasks: list[str] | None = None,
    keyed: bool = True,
    lessons: str = "served",
) -> LossBreakdown:
    """Replay ``orderings`` deployments of ``policy`` on ``rewards`` (prompts x samples, NaN =
    missing) at ``cost`` and split its profit gap by stop reason, with ``by="path"`` by
    :func:`decision_path`, with ``by="task"`` by the prompts' ``tasks`` labels (see the
    module docstring), or with ``by="position"`` by when each request was served
    (:func:`position_bins`). ``tasks`` keys the priors by label unless ``keyed`` is false.
    ``lessons`` (:data:`~stoppers.replay.lessons.LESSONS`): what the prior learns from each
    request, its own rewards unless an ablation says otherwise."""
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {GROUPINGS}, got {by!r}")
    if by == "task" and tasks is None:
        raise ValueError("by='task' needs the prompts' task labels")
    width = np.asarray(rewards).shape[1]  # the policies' budget: the pool, or max_samples
    budget = width if max_samples is None else min(int(max_samples), width)
    make_policy, new_prior = _policy_maker(policy, cost, budget)
    served: list[StoppingPolicy] = []  # in serving order: deployment by deployment

    def make_and_keep(prior: DeploymentPrior | None) -> StoppingPolicy:
        served.append(make_policy(prior))
        return served[-1]

    replay = replay_deployment(
        rewards,
        make_and_keep,
        new_prior,
        orderings=orderings,
        seed=seed,
        max_samples=max_samples,
        tasks=tasks if keyed else None,
        lessons=lessons_for(lessons, rewards, seed=seed),
    )
    batch = deployment_batch(
        rewards, orderings=orderings, seed=seed, alpha=alpha, max_samples=max_samples
    )
    outcome = replay.outcome()  # rows in batch layout: prompt * orderings + ordering
    ar = acceptance_rate(outcome.best, batch.kappa)
    profit = ar - cost * outcome.n

    prefix = fixed_best(batch)  # (rows, horizon)
    fixed = fixed_profits(batch, cost, prefix)
    best_n = int(np.argmax(fixed.mean(axis=0))) + 1
    fixed_profit = fixed[:, best_n - 1]

    task_fixed_profit = None
    labels = None if tasks is None else np.repeat(np.asarray(tasks, dtype=object), orderings)
    if labels is not None:  # rows in batch layout, as ``fixed``
        task_fixed_profit = float(
            sum(fixed[labels == t].mean(axis=0).max() * np.sum(labels == t) for t in set(tasks))
            / labels.size
        )

    oracle = oracle_outcome(batch, cost, prefix)
    oracle_ar = acceptance_rate(oracle.best, batch.kappa)
    oracle_profit = oracle_ar - cost * oracle.n

    served_at = np.broadcast_to(np.arange(replay.prompts), replay.prompt.shape)
    position = replay.per_prompt(served_at).reshape(-1)
    if by == "path":
        paths = np.array([decision_path(p) for p in served], dtype=object)
        group = replay.per_prompt(paths.reshape(replay.prompt.shape)).reshape(-1)
    elif by == "task":
        assert labels is not None
        group = labels
    elif by == "position":
        group = position_bins(position, replay.prompts)
    else:
        group = replay.per_prompt(replay.reason).reshape(-1)
    per_deployment = 1.0 / orderings
    reasons = []
    for name in sorted(set(group.tolist())):
        rows = group == name
        reasons.append(
            ReasonLoss(
                reason=name,
                requests=int(rows.sum()),
                samples=float(outcome.n[rows].mean()),
                loss_vs_fixed=float((fixed_profit[rows] - profit[rows]).sum() * per_deployment),
                loss_vs_oracle=float((oracle_profit[rows] - profit[rows]).sum() * per_deployment),
                sampling_part=float(
                    (cost * (outcome.n[rows] - oracle.n[rows])).sum() * per_deployment
                ),
                acceptance_part=float((oracle_ar[rows] - ar[rows]).sum() * per_deployment),
                profit_vs_fixed=float(profit[rows].sum() / fixed_profit[rows].sum()),
            )
        )
    se_deployments, se_prompts = ratio_standard_errors(profit, fixed_profit, orderings)
    return LossBreakdown(
        cost=float(cost),
        best_fixed_n=best_n,
        profit=float(profit.mean()),
        fixed_profit=float(fixed_profit.mean()),
        oracle_profit=float(oracle_profit.mean()),
        samples=float(outcome.n.mean()),
        oracle_samples=float(oracle.n.mean()),
        reasons=tuple(reasons),
        task_fixed_profit=task_fixed_profit,
        se_deployments=se_deployments,
        se_prompts=se_prompts,
        request_profit=profit,
        request_fixed_profit=fixed_profit,
        request_position=position,
    )


def position_bins(position: np.ndarray, served: int) -> np.ndarray:
    """Labels of 0-based serving positions in doubling bins, ``"#01"``, ``"#02-03"``,
    ``"#04-07"``, ... (zero-padded to sort in order; the last bin ends at ``served``).

    Why: a deployment's first requests run on what it has not learned yet; doubling bins say
    how fast a rule's profit catches up with the best fixed N as the prior learns."""
    digits = len(str(served))
    start = 2 ** np.floor(np.log2(np.asarray(position) + 1)).astype(np.int64)
    end = np.minimum(2 * start - 1, served)
    labels = np.empty(start.shape, dtype=object)
    for lo in np.unique(start):
        hi = int(end[start == lo][0])
        name = f"#{lo:0{digits}d}" + ("" if hi == lo else f"-{hi:0{digits}d}")
        labels[start == lo] = name
    return labels


def fixed_profits(batch: PromptBatch, cost: float, prefix: np.ndarray | None = None) -> np.ndarray:
    """(rows, horizon): each stream's profit AR(best of the first N) - c N for every N (past a
    row's budget Best-of-N draws, and pays for, the budget); ``prefix`` is ``fixed_best``."""
    prefix = fixed_best(batch) if prefix is None else prefix
    drawn = np.minimum(np.arange(1, batch.horizon + 1)[None, :], batch.budget[:, None])
    return acceptance_rate(prefix, batch.kappa[:, None]) - cost * drawn


def ratio_standard_errors(
    profit: np.ndarray, fixed_profit: np.ndarray, orderings: int
) -> tuple[float, float]:
    """Standard errors of mean(profit) / mean(fixed_profit) over the deployments and over the
    prompts (rows in batch layout: prompt * orderings + ordering)."""
    gap = (np.asarray(profit) - np.asarray(fixed_profit)).reshape(-1, orderings)
    scale = float(np.mean(fixed_profit))
    return standard_error(gap.mean(axis=0)) / scale, standard_error(gap.mean(axis=1)) / scale


def standard_error(values: np.ndarray) -> float:
    """Standard error of the mean of ``values`` (NaN for fewer than two)."""
    return float(np.std(values, ddof=1) / np.sqrt(values.size)) if values.size > 1 else np.nan


def render(b: LossBreakdown, by: str = "reason") -> str:
    lines = [
        f"c = {b.cost:g}: profit per request {b.profit:.4f} = {b.profit / b.fixed_profit:.4f} x "
        f"best fixed N ({b.best_fixed_n}: {b.fixed_profit:.4f}; standard error "
        f"{b.se_deployments:.4f} over deployments, {b.se_prompts:.4f} over prompts), "
        f"{b.profit / b.oracle_profit:.4f} x oracle ({b.oracle_profit:.4f}); samples "
        f"{b.samples:.1f}, oracle {b.oracle_samples:.1f}"
        + (
            ""
            if b.task_fixed_profit is None
            else f"; {b.profit / b.task_fixed_profit:.4f} x the best fixed N per task "
            f"({b.task_fixed_profit:.4f})"
        ),
        f"loss per deployment by {GROUP_NAMES[by]} "
        "(vs oracle = sampling + acceptance; profit / the best fixed N's on those requests):",
    ]
    width = max(10, *(len(r.reason) for r in b.reasons))
    for r in b.reasons:
        lines.append(
            f"  {r.reason:<{width}} requests {r.requests:6d}  samples {r.samples:7.1f}  "
            f"vs fixed N {r.loss_vs_fixed:+.3f}  vs oracle {r.loss_vs_oracle:+.3f} "
            f"= {r.sampling_part:+.3f} + {r.acceptance_part:+.3f}  "
            f"x fixed {r.profit_vs_fixed:.4f}"
        )
    return "\n".join(lines)


def save_rows(path: str, breakdowns: list[LossBreakdown], **replay: object) -> None:
    """Write each breakdown's per-request profits (``<cost>/profit``, ``<cost>/fixed``,
    ``<cost>/position``) and the ``replay`` it came from (pool, prompts, orderings, seed, ...)
    to the .npz ``path``: one rule's side of :mod:`stoppers.robust.paired_report`."""
    arrays: dict[str, np.ndarray] = {
        f"replay/{k}": np.asarray("" if v is None else v) for k, v in replay.items()
    }
    for b in breakdowns:
        assert b.request_profit is not None and b.request_fixed_profit is not None
        arrays[f"{b.cost:g}/profit"] = b.request_profit
        arrays[f"{b.cost:g}/fixed"] = b.request_fixed_profit
        arrays[f"{b.cost:g}/position"] = np.asarray(b.request_position)
    np.savez_compressed(path, **arrays)


def load_pool(
    file: str, label_key: str | None = None, prompts: int | None = None
) -> tuple[np.ndarray, list[str] | None]:
    """A pool's rewards (prompts x samples) and, with ``label_key``, its per-prompt labels;
    the first ``prompts`` prompts only when given."""
    with np.load(file) as data:
        rewards = np.asarray(data["rewards"], dtype=np.float64)
    labels = load_task_labels(file, label_key) if label_key else None
    if prompts is not None:
        rewards = rewards[:prompts]
        labels = None if labels is None else labels[:prompts]
    return rewards, labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help=".npz with a 'rewards' (prompts x samples) array")
    parser.add_argument("--cost", type=float, action="append", required=True, help="repeatable")
    parser.add_argument("--policy", choices=POLICIES, default="default")
    parser.add_argument("--prompts", type=int, help="first N prompts")
    parser.add_argument("--orderings", type=int, default=30, help="deployments")
    parser.add_argument("--max-samples", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--by",
        choices=GROUPINGS,
        default="reason",
        help="group requests by stop reason, by what decided them (cold start, likelihood "
        "path, learned shape), by their --task-key label, or by their position in the "
        "deployment (doubling bins: #1, #2-3, #4-7, ...)",
    )
    parser.add_argument(
        "--task-key",
        metavar="ARRAY",
        help="the file's per-prompt label array (e.g. family): one prior per label",
    )
    parser.add_argument(
        "--shared-prior",
        action="store_true",
        help="with --task-key: one prior for the whole deployment (the labels only group)",
    )
    parser.add_argument(
        "--lessons",
        choices=LESSONS,
        default="served",
        help="what the prior learns from each request: its own rewards (served), or, as an "
        "ablation no gateway can run, unselected draws of the served prompt: 96 a request "
        "(unselected) or as many as the previous request drew (unselected-matched)",
    )
    parser.add_argument(
        "--rows-out",
        metavar="FILE",
        help="also write every request's profit, the best fixed N's and its position to this "
        ".npz, for python -m stoppers.robust.paired_report against another rule's",
    )
    args = parser.parse_args(argv)
    if args.by == "task" and args.task_key is None:
        parser.error("--by task needs --task-key")
    rewards, tasks = load_pool(args.file, args.task_key, args.prompts)
    breakdowns = []
    for cost in args.cost:
        b = loss_breakdown(
            rewards,
            cost,
            policy=args.policy,
            orderings=args.orderings,
            seed=args.seed,
            max_samples=args.max_samples,
            by=args.by,
            tasks=tasks,
            keyed=not args.shared_prior,
            lessons=args.lessons,
        )
        if args.lessons != "served":
            print(f"(ablation: the prior taught {args.lessons} draws, not the requests' own)")
        print(render(b, args.by))
        breakdowns.append(b)
    if args.rows_out:
        save_rows(
            args.rows_out,
            breakdowns,
            pool=os.path.basename(args.file),  # the streams themselves are checked on reading
            prompts=rewards.shape[0],
            orderings=args.orderings,
            seed=args.seed,
            max_samples=args.max_samples,
            policy=args.policy,
            lessons=args.lessons,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
