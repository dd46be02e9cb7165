"""One replay from request to ``results.json``: load, replay, reduce, write, draw."""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stoppers.replay.engine import ReplayConfig, run_replay
from stoppers.replay.experiments import profit_rows, savings_rows, winrate_rows
from stoppers.replay.loaders import ReplayInputError, load_rewards
from stoppers.replay.results import write_results

__all__ = ["ReplayRequest", "replay"]


@dataclass(frozen=True)
class ReplayRequest:
    file: str
    config: ReplayConfig
    experiments: tuple[str, ...]
    key: str = "rewards"
    field: str | None = None
    prompts: int | None = None
    out: str = "replay-out"
    jobs: int | None = None
    figures: bool = True
    quiet: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReplayRequest:
        from stoppers.replay.cli import (
            DEFAULT_PROFIT_COSTS,
            DEFAULT_TARGETS,
            DEFAULT_WINRATE_COSTS,
        )

        wanted = (
            ("profit", "winrate", "savings") if args.experiment == "all" else (args.experiment,)
        )
        if args.policy == "target":
            cost_based = [e for e in wanted if e != "savings"]
            if args.experiment != "all" and cost_based:
                raise ValueError(
                    "--policy target has no cost; the profit and win-rate experiments need a "
                    "cost-based policy (adaptive, ucb-exp, beacon, patience)"
                )
            wanted = ("savings",)
        costs = args.costs
        for c in costs or ():
            if not 0 < c < 1:
                raise ValueError(f"costs must be in (0, 1) (utility B = 1), got {c}")
        for t in args.targets or ():
            if not 0 < t <= 1:
                raise ValueError(f"targets must be in (0, 1], got {t}")
        if not 0 < args.alpha < 1:
            raise ValueError(f"--alpha must be in (0, 1), got {args.alpha}")
        if args.delta is not None and not 0 < args.delta < 1:
            raise ValueError(f"--delta must be in (0, 1), got {args.delta}")
        config = ReplayConfig(
            policy=args.policy,
            target_policy=args.target_policy,
            profit_costs=(costs or DEFAULT_PROFIT_COSTS) if "profit" in wanted else (),
            winrate_costs=(costs or DEFAULT_WINRATE_COSTS) if "winrate" in wanted else (),
            targets=(args.targets or DEFAULT_TARGETS) if "savings" in wanted else (),
            permutations=args.permutations,
            alpha=args.alpha,
            delta=args.delta,
            min_samples=args.min_samples,
            max_samples=args.max_samples,
            seed=args.seed,
            use_loop=args.loop,
            policy_options=tuple(args.policy_option),
        )
        return cls(
            file=args.file,
            config=config,
            experiments=wanted,
            key=args.key,
            field=args.field,
            prompts=args.prompts,
            out=args.out,
            jobs=args.jobs,
            figures=not args.no_figures,
            quiet=args.quiet,
        )


def replay(request: ReplayRequest) -> tuple[dict[str, Any], list[Path]]:
    """Run the request; returns the results dict and the files written."""
    started = time.perf_counter()
    pool = load_rewards(request.file, key=request.key, field=request.field)
    if request.prompts is not None:
        pool = pool.head(request.prompts)
    config = request.config
    if config.max_samples is not None and config.max_samples > pool.max_samples:
        raise ReplayInputError(
            f"{pool.source}: --max-samples {config.max_samples} exceeds the "
            f"{pool.max_samples} samples per prompt in the file"
        )
    from stoppers.replay.policies import resolve_policy

    choice = resolve_policy(config.policy)  # fail fast on a policy this install cannot build
    parameters = choice.effective_parameters(config)
    target_parameters = (
        resolve_policy(config.target_policy).effective_parameters(config)
        if config.targets
        else None
    )
    with _progress(pool.prompts, request.quiet) as tick:
        summaries = run_replay(pool, config, jobs=request.jobs, progress=tick)
    samples = pool.sizes
    results: dict[str, Any] = {
        "meta": {
            "file": str(request.file),
            "source": pool.source,
            "prompts": pool.prompts,
            "samples": int(samples.max()),
            "samples_min": int(samples.min()),
            "missing_samples": pool.missing,
            "max_samples": config.max_samples,
            "permutations": config.permutations,
            "policy": config.policy,
            "alpha": config.alpha,
            "delta": parameters.get("delta", config.delta),
            "min_samples": parameters.get("min_samples", config.min_samples),
            "policy_parameters": parameters,
            "target_policy": config.target_policy if config.targets else None,
            "target_policy_parameters": target_parameters,
            "seed": config.seed,
            "seconds": 0.0,
            "engine": "loop" if config.use_loop else "vectorised",
        },
        "profit": profit_rows(summaries, config.profit_costs) if config.profit_costs else [],
        "winrate": winrate_rows(summaries, config.winrate_costs) if config.winrate_costs else [],
        "savings": savings_rows(summaries) if config.targets else [],
        "fixed_n_acceptance": [float(v) for v in np.nanmean(summaries.fixed_acceptance, axis=0)],
    }
    out = Path(request.out)
    results["meta"]["seconds"] = round(time.perf_counter() - started, 3)
    written = [write_results(results, out)]
    if request.figures:
        from stoppers.replay.figures import write_figures

        written += write_figures(results, out)
    return results, written


@contextmanager
def _progress(total: int, quiet: bool):
    if quiet:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit="prompt", desc="replay", leave=False) as bar:
        yield bar.update
