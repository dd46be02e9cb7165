"""Turn a request's :class:`SamplingPlan` into its stopping policy (from ``stoppers``).

- adaptive: ``stoppers.default_cost_policy`` for a cost per sample (Weitzman's rule, the paper's
  Sec. 4.2 with a robust tail model and a deployment-learned reward shape);
- target: ``stoppers.default_target_policy``, a target acceptance rate (the paper's Sec. 4.3
  variant, on a deployment-learned shape);
- fixed: classic Best-of-N with N = the plan's max-samples.
The app factory takes any other ``PolicyFactory`` (tests inject simple ones). A factory that
accepts a ``prior`` keyword gets the deployment's learned prior (one per model and mode, see
:mod:`server.priors`) for adaptive and target requests; others are called with the plan only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from server.control import SamplingPlan
from stoppers.base import StoppingPolicy
from stoppers.deployment import DeploymentPrior

__all__ = ["PolicyFactory", "accepts_prior", "build_policy"]

# (plan) -> policy, or (plan, *, prior=None) -> policy for factories that use the learned prior.
PolicyFactory = Callable[..., StoppingPolicy]


def accepts_prior(factory: PolicyFactory) -> bool:
    """True if ``factory`` takes a ``prior`` keyword (then the gateway passes the model's prior)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "prior" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def build_policy(plan: SamplingPlan, *, prior: DeploymentPrior | None = None) -> StoppingPolicy:
    import stoppers

    # n > 1 distinct answers need at least n samples before a stop.
    min_samples = max(plan.min_samples or 1, plan.n)
    min_samples = None if min_samples <= 1 else min_samples
    if plan.mode == "adaptive":
        assert plan.cost is not None
        return stoppers.default_cost_policy(
            plan.cost, max_samples=plan.max_samples, min_samples=min_samples, prior=prior
        )
    if plan.mode == "target":
        assert plan.target is not None
        return stoppers.default_target_policy(
            plan.target, max_samples=plan.max_samples, min_samples=min_samples, prior=prior
        )
    if plan.mode == "fixed":
        return stoppers.FixedN(plan.max_samples)
    raise ValueError(f"mode {plan.mode!r} has no stopping policy")
