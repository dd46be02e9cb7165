"""A deployment whose rewards drift: ``python -m stoppers.robust.drift_report A.npz B.npz``.

Why: the gateway keeps one prior per model for as long as it runs (and across restarts with
``--prior-state-file``), but the rewards behind one model name change - a new generator
version, another mix of prompts. Sequential replay (:mod:`stoppers.replay.deployment`) shuffles
one pool's prompts, so it cannot show how a prior learned on one regime serves the next. Here
each deployment serves the first ``prompts`` prompts of A, then those of B, in order, to one
prior; the report gives, per window of requests, the mean delivered acceptance and rewards drawn
(target mode) or the mean profit (cost mode), beside a fresh prior serving B alone.

Each prompt's rewards are served in the seeded order sequential replay gives its row (a new one
per deployment); acceptance is against the prompt's alpha = 0.99 quantile of its whole pool, as
in the replay reports.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stoppers.adaptive import default_cost_policy, default_target_policy
from stoppers.deployment import new_deployment_prior
from stoppers.replay.deployment import replay_deployment
from stoppers.replay.metrics import acceptance_rate, benchmark

__all__ = ["DriftRun", "drift_run", "main"]

ALPHA = 0.99


@dataclass(frozen=True)
class DriftRun:
    """Per request served (rows: deployments, columns: serving order)."""

    acceptance: np.ndarray  # (deployments, requests)
    samples: np.ndarray  # (deployments, requests) int


def drift_run(
    pools: Sequence[np.ndarray],
    *,
    mode: str,
    level: float,
    deployments: int,
    seed: int = 0,
) -> DriftRun:
    """Serve ``pools`` (one reward row per prompt, NaN-free) in order to one prior per
    deployment (:func:`~stoppers.replay.deployment.replay_deployment` with ``in_order``);
    ``level`` is the target (``mode="target"``) or the cost (``"cost"``)."""
    if mode not in ("target", "cost"):
        raise ValueError(f"mode must be 'target' or 'cost', got {mode!r}")
    width = max(pool.size for pool in pools)
    rewards = np.full((len(pools), width), np.nan)
    for i, pool in enumerate(pools):
        rewards[i, : pool.size] = pool
    make = default_target_policy if mode == "target" else default_cost_policy
    replay = replay_deployment(
        rewards,
        lambda prior: make(level, max_samples=width, prior=prior),
        lambda: new_deployment_prior(mode),
        orderings=deployments,
        seed=seed,
        in_order=True,
    )
    kappa = np.array([benchmark(pool, ALPHA) for pool in pools])
    return DriftRun(acceptance_rate(replay.kept, kappa[None, :]), replay.samples)


def _rows(path: str, prompts: int) -> list[np.ndarray]:
    rewards = np.load(path)["rewards"][:prompts]
    rows = [row[np.isfinite(row)] for row in np.asarray(rewards, dtype=np.float64)]
    if any(row.size < 2 for row in rows):
        raise SystemExit(f"drift_report: {path}: a prompt has fewer than 2 rewards")
    return rows


def render(
    both: DriftRun, fresh: DriftRun, *, switch: int, window: int, mode: str, level: float
) -> str:
    """The per-window table: A then B beside B on a fresh prior (from the switch on)."""
    what = "acceptance" if mode == "target" else "profit"

    def cell(run: DriftRun, lo: int, hi: int) -> str:
        ar, n = run.acceptance[:, lo:hi], run.samples[:, lo:hi]
        value = ar.mean() if mode == "target" else (ar - level * n).mean()
        return f"{value:.4f} in {n.mean():5.1f}"

    lines = [
        f"| requests | A then B: {what} in rewards | B on a fresh prior |",
        "| --- | --- | --- |",
    ]
    for lo in range(0, both.acceptance.shape[1], window):
        hi = min(lo + window, both.acceptance.shape[1])
        fresh_cell = cell(fresh, lo - switch, hi - switch) if lo >= switch else ""
        lines.append(f"| {lo}-{hi - 1} | {cell(both, lo, hi)} | {fresh_cell} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stoppers.robust.drift_report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("a", help=".npz with a 'rewards' (prompts x samples) array: served first")
    parser.add_argument("b", help="the same, served after A's prompts")
    parser.add_argument("--mode", choices=("target", "cost"), default="target")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--cost", type=float, default=1e-3)
    parser.add_argument("--prompts", type=int, default=400, help="prompts of each pool served")
    parser.add_argument("--deployments", type=int, default=4)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    level = args.target if args.mode == "target" else args.cost
    a, b = _rows(args.a, args.prompts), _rows(args.b, args.prompts)
    options = {"mode": args.mode, "level": level, "deployments": args.deployments}
    both = drift_run(a + b, seed=args.seed, **options)
    fresh = drift_run(b, seed=args.seed + 1, **options)
    print(render(both, fresh, switch=len(a), window=args.window, mode=args.mode, level=level))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
