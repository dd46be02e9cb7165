"""How often a deployment's learned shape passes the shared-shape tests (docs/robust-stopping.md,
cost mode).

Why: :class:`~stoppers.robust.shape_cost.ShapePandora` trusts a deployment's pooled shape only
while both tests of :class:`~stoppers.robust.cost_prior.CostShapePrior` stay at or below
``dispersion_limit`` (stricter in the first ``EARLY_REQUESTS``). A test that rejects shared
shapes costs the gain of the learned shape; one that passes differing shapes costs far more
(clipped and mixed pools). This report replays
sequential deployments exactly as ``pandora replay --deployment`` does, records what each prior
learns, and tells how often each test passes after ``k`` shape requests::

    python -m stoppers.robust.shape_test_report normal.npz --cost 0.001 --prompts 40

"trusted" is the policy's whole rule: also >= 1000 pooled draws (``DRAWS_ABOVE_QUANTILE``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np

from stoppers.replay.deployment import replay_deployment
from stoppers.robust.cost_prior import CostShapePrior, dispersion_limit
from stoppers.robust.shape_cost import WARM_REQUESTS, ShapePandora, _trusted

__all__ = ["dispersion_runs", "main"]


def dispersion_runs(
    rewards: np.ndarray,
    cost: float,
    *,
    orderings: int,
    seed: int = 0,
    max_samples: int | None = None,
    after: Sequence[int] = (8, 16),
) -> dict[int, dict[str, list[float]]]:
    """Per ``k`` in ``after``: both tests' values (NaN: not computable) and whether the policy
    trusted the shape, when each deployment's prior had learned it from exactly ``k`` requests
    (deployments that never got there are left out)."""
    seen: list[dict[int, tuple[float | None, float | None, bool]]] = []

    class Recording(CostShapePrior):
        def update(self, rewards: Sequence[float]) -> bool:
            learned = super().update(rewards)
            if self.shape_requests in after and self.shape_requests not in self.tests:
                self.tests[self.shape_requests] = (
                    self.dispersion,
                    self.shape_dispersion,
                    _trusted(self, WARM_REQUESTS),  # the replayed policy's rule (alpha 0.99)
                )
            return learned

    def new_prior() -> Recording:
        prior = Recording()
        prior.tests = {}
        seen.append(prior.tests)
        return prior

    replay_deployment(
        rewards,
        lambda prior: ShapePandora(cost, prior=prior, max_samples=max_samples),
        new_prior,
        orderings=orderings,
        seed=seed,
        max_samples=max_samples,
    )
    out: dict[int, dict[str, list[float]]] = {}
    for k in after:
        rows = [tests[k] for tests in seen if k in tests]
        out[k] = {
            "tail": [np.nan if t is None else t for t, _, _ in rows],
            "shape": [np.nan if w is None else w for _, w, _ in rows],
            "trusted": [float(ok) for _, _, ok in rows],
        }
    return out


def _summary(values: list[float], limit: float) -> dict[str, float] | None:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or np.all(np.isnan(v)):
        return None
    return {
        "median": round(float(np.nanmedian(v)), 2),
        "p90": round(float(np.nanpercentile(v, 90)), 2),
        "at most the limit": round(float(np.mean(v <= limit)), 2),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stoppers.robust.shape_test_report")
    parser.add_argument("pool", help="an .npz with a `rewards` matrix (pandora synth output)")
    parser.add_argument("--cost", type=float, default=1e-3)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--orderings", type=int, default=100)
    parser.add_argument("--max-samples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--after", default="8,16,32", help="shape-request counts to report at (comma-separated)"
    )
    args = parser.parse_args(argv)
    after = tuple(int(k) for k in args.after.split(","))
    with np.load(args.pool) as data:
        rewards = np.asarray(data["rewards"], dtype=np.float64)[: args.prompts]
    runs = dispersion_runs(
        rewards,
        args.cost,
        orderings=args.orderings,
        seed=args.seed,
        max_samples=args.max_samples,
        after=after,
    )
    report = {
        f"after {k} shape requests": {
            "deployments": len(r["tail"]),
            "trusted": round(float(np.mean(r["trusted"])), 2) if r["trusted"] else None,
            "limit": dispersion_limit(k),
            "tail test": _summary(r["tail"], dispersion_limit(k)),
            "whole-shape test": _summary(r["shape"], dispersion_limit(k)),
        }
        for k, r in runs.items()
    }
    print(json.dumps({"pool": args.pool, "cost": args.cost, **report}, indent=1))


if __name__ == "__main__":
    main()
