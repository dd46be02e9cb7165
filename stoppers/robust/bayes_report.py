"""Cost mode against the oracle, learned or exact shape: ``python -m stoppers.robust.bayes_report``.

Two questions the sequential replay cannot answer cheaply (a table build per deployment and
doubling costs ~10-25 s):

* ``frozen``: on a deployment that has already learned its shape, how do the one-step rule
  (ShapePandora) and the Bayes rule (BayesShapePandora) compare? A CostShapePrior learns from
  ``--learn`` prompts (what TailPandora observed on one ordering of each: the cold start a
  deployment runs), then both policies - and TailPandora - replay the first ``--prompts``
  prompts (disjoint from the learning ones) on the replay's orderings, beside Weitzman's
  oracle and the best fixed N in hindsight (the definitions of ``pandora replay``).
* ``bound`` (synthetic normal pools, which store each prompt's true scale): how much of the
  oracle can *any* rule earn that must learn the prompt's location and scale from its own
  rewards? The Bayes rule told the exact normal shape and the generator's scale prior is that
  limit (up to the table's grid); told also each prompt's true scale, it shows what the scale
  uncertainty costs.

Ratios are of mean profit over prompts (profit = AR(kept) - c n); one line per policy.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable

import numpy as np
from scipy.stats import norm

from stoppers.base import StoppingPolicy
from stoppers.faircap import acceptance_rate
from stoppers.replay.baselines import empirical_fair_cap
from stoppers.replay.metrics import benchmark
from stoppers.replay.orderings import orderings
from stoppers.robust.bayes_cost import BayesShapePandora
from stoppers.robust.bayes_table import build_cost_table
from stoppers.robust.cost import TailPandora
from stoppers.robust.cost_prior import CostShapePrior, cost_shape_prior
from stoppers.robust.shape_cost import CostShape, ShapePandora

__all__ = ["exact_normal_shape", "learn_prior", "main", "replay_prompts"]

Factory = Callable[[int], StoppingPolicy]  # prompt index -> fresh policy


def learn_prior(
    rewards: np.ndarray, prompts: range, cost: float, *, seed: int = 0
) -> CostShapePrior:
    """A cost prior that learned from what TailPandora observed on one ordering per prompt."""
    prior = cost_shape_prior()
    budget = rewards.shape[1]
    for i in prompts:
        row = rewards[i][orderings(budget, 1, seed=seed, prompt_index=i)[0]]
        policy = TailPandora(cost, max_samples=budget)
        seen = []
        for reward in row.tolist():
            seen.append(reward)
            if policy.observe(reward):
                break
        prior.update(seen)
    return prior


def exact_normal_shape(scale_mu: float, scale_sd: float, alpha: float = 0.99) -> CostShape:
    """The standard normal shape on a fine grid with log s ~ N(scale_mu, scale_sd^2)."""
    z = np.linspace(-6.0, 6.0, 6001)
    p = norm.pdf(z)
    p /= p.sum()
    return CostShape(
        z=z,
        p=p,
        z_alpha=float(norm.ppf(alpha)),
        above_alpha=1.0 - alpha,
        sd_precision=2.0,
        scale_mu=scale_mu,
        scale_precision=1.0 / scale_sd**2,
    )


def replay_prompts(
    rewards: np.ndarray,
    prompts: range,
    cost: float,
    factories: dict[str, Factory],
    *,
    permutations: int,
    seed: int = 0,
    alpha: float = 0.99,
) -> dict[str, dict[str, float]]:
    """Mean profit and samples per policy, plus the oracle and the best fixed N."""
    budget = rewards.shape[1]
    totals = {name: [0.0, 0.0] for name in factories}
    oracle = 0.0
    fixed = np.zeros(budget)
    for i in prompts:
        pool = rewards[i]
        kappa = benchmark(pool, alpha)
        streams = pool[orderings(budget, permutations, seed=seed, prompt_index=i)]
        ar = acceptance_rate(streams, kappa)
        for name, make in factories.items():
            profit = samples = 0.0
            for row in streams:
                policy = make(i)
                for reward in row.tolist():
                    if policy.observe(reward):
                        break
                profit += float(acceptance_rate(policy.best, kappa)) - cost * policy.n
                samples += policy.n
            totals[name][0] += profit / permutations
            totals[name][1] += samples / permutations
        tau = empirical_fair_cap(acceptance_rate(pool, kappa), cost)
        n_oracle = np.argmax(ar >= tau, axis=1) + 1
        oracle += float(ar[np.arange(permutations), n_oracle - 1].mean() - cost * n_oracle.mean())
        fixed += np.maximum.accumulate(ar, axis=1).mean(axis=0) - cost * np.arange(1, budget + 1)
    count = len(prompts)
    best_fixed = float(fixed.max())
    out = {
        name: {
            "of_oracle": profit / oracle,
            "of_best_fixed": profit / best_fixed,
            "samples": samples / count,
        }
        for name, (profit, samples) in totals.items()
    }
    out["best fixed N"] = {"n": int(fixed.argmax()) + 1, "of_oracle": best_fixed / oracle}
    return out


def _frozen(args: argparse.Namespace, rewards: np.ndarray) -> dict:
    lo, hi = (int(x) for x in args.learn.split(":"))
    prior = learn_prior(rewards, range(lo, hi), args.cost, seed=args.seed)
    budget = rewards.shape[1]
    start = time.perf_counter()
    first = BayesShapePandora(args.cost, max_samples=budget, prior=prior)
    build_s = time.perf_counter() - start
    factories: dict[str, Factory] = {
        "TailPandora": lambda i: TailPandora(args.cost, max_samples=budget),
        "ShapePandora": lambda i: ShapePandora(args.cost, max_samples=budget, prior=prior),
        "BayesShapePandora": lambda i: BayesShapePandora(
            args.cost, max_samples=budget, prior=prior
        ),
    }
    rows = replay_prompts(
        rewards,
        range(args.prompts),
        args.cost,
        factories,
        permutations=args.permutations,
        seed=args.seed,
    )
    return {
        "prior": {
            "learned_from": [lo, hi],
            "shape_requests": prior.shape_requests,
            "dispersion": prior.dispersion,
            "shape_dispersion": prior.shape_dispersion,
            "warm": first.warm,
            "table_build_s": round(build_s, 1),
        },
        "rows": rows,
    }


def _bound(args: argparse.Namespace, data: np.lib.npyio.NpzFile) -> dict:
    rewards = data["rewards"]
    if "scale" not in data.files or str(data["family"][0]) != "normal":
        raise SystemExit("bound needs a `pandora synth --family normal` pool (true scales stored)")
    budget = rewards.shape[1]
    spread = float(args.scale_spread)
    fine = {"horizon": args.horizon, "log_sd_nodes": 41, "gap_nodes": 161}  # a limit: fine grid
    unknown = build_cost_table(
        args.cost, exact_normal_shape(0.0, spread), max_samples=budget, **fine
    )
    scales = np.asarray(data["scale"], dtype=np.float64)
    known = {
        i: build_cost_table(
            args.cost,
            exact_normal_shape(math.log(scales[i]), 1e-3),
            max_samples=budget,
            **fine,
        )
        for i in range(args.prompts)
    }
    factories: dict[str, Factory] = {
        "Bayes, exact shape, scale learned": lambda i: BayesShapePandora(
            args.cost, max_samples=budget, table=unknown
        ),
        "Bayes, exact shape, scale known": lambda i: BayesShapePandora(
            args.cost, max_samples=budget, table=known[i]
        ),
    }
    rows = replay_prompts(
        rewards,
        range(args.prompts),
        args.cost,
        factories,
        permutations=args.permutations,
        seed=args.seed,
    )
    return {"scale_prior": {"log_mean": 0.0, "log_sd": spread}, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["frozen", "bound"])
    parser.add_argument("pool", help="a .npz reward pool (pandora synth, or the AlpacaEval pool)")
    parser.add_argument("--cost", type=float, default=1e-3)
    parser.add_argument("--prompts", type=int, default=24, help="replay the first N prompts")
    parser.add_argument("--permutations", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learn", default="100:200", help="frozen: prompts the prior learns from")
    parser.add_argument("--horizon", type=int, default=320, help="bound: table rows")
    parser.add_argument("--scale-spread", type=float, default=0.4, help="bound: sd of log scale")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    data = np.load(args.pool)
    rewards = np.asarray(data["rewards"], dtype=np.float64)
    if not np.all(np.isfinite(rewards)):
        raise SystemExit("pools with missing rewards are not supported here")
    result = _frozen(args, rewards) if args.mode == "frozen" else _bound(args, data)
    result = {
        "pool": args.pool,
        "mode": args.mode,
        "cost": args.cost,
        "prompts": args.prompts,
        "permutations": args.permutations,
        **result,
    }
    for name, row in result["rows"].items():
        print(
            f"{name:36s} "
            + "  ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
            )
        )
    if "prior" in result:
        print("prior:", json.dumps(result["prior"]))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
