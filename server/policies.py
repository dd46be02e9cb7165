"""Turn a request's :class:`SamplingPlan` into its stopping policy (from ``stoppers``).

- adaptive: the paper's Adaptive Best-of-N (Sec. 4.2, UCB Pandora's box) for a cost per sample;
- target: the target-acceptance variant (Sec. 4.3);
- fixed: classic Best-of-N with N = the plan's max-samples.
The app factory takes any other ``PolicyFactory`` (tests inject simple ones).
"""

from __future__ import annotations

from collections.abc import Callable

from server.control import SamplingPlan
from stoppers.base import StoppingPolicy

__all__ = ["PolicyFactory", "build_policy"]

PolicyFactory = Callable[[SamplingPlan], StoppingPolicy]


def build_policy(plan: SamplingPlan) -> StoppingPolicy:
    import stoppers

    # n > 1 distinct answers need at least n samples before a stop.
    min_samples = max(plan.min_samples or 1, plan.n)
    min_samples = None if min_samples <= 1 else min_samples
    if plan.mode == "adaptive":
        assert plan.cost is not None
        return stoppers.default_cost_policy(
            plan.cost, max_samples=plan.max_samples, min_samples=min_samples
        )
    if plan.mode == "target":
        assert plan.target is not None
        return stoppers.default_target_policy(
            plan.target, max_samples=plan.max_samples, min_samples=min_samples
        )
    if plan.mode == "fixed":
        return stoppers.FixedN(plan.max_samples)
    raise ValueError(f"mode {plan.mode!r} has no stopping policy")
