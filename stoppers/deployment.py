"""What a deployment learns across its requests, and the one way the gateway gets it.

Why: one request sees a handful of rewards, but the prompts of one deployment share a generator
and a reward model, so the *shape* of their reward distributions is shared too. The gateway keeps
one :class:`DeploymentPrior` per (model, mode), hands it to every new policy
(``stoppers.default_cost_policy(..., prior=p)`` / ``default_target_policy(..., prior=p)``) and
calls :meth:`DeploymentPrior.update` with each finished request's rewards *in the order they
were observed* (the rewards the request saw, never more: a policy must not learn from samples it
did not pay for). The first ``min_samples`` of them were drawn before any stop could happen, so
they are an unbiased sample of the prompt's distribution; what follows is stopping-biased.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["DeploymentPrior", "PriorMode", "new_deployment_prior"]

PriorMode = Literal["cost", "target"]


@runtime_checkable
class DeploymentPrior(Protocol):
    """Cross-request state of one deployment's stopping policies (plain, JSON-serialisable)."""

    def update(self, rewards: Sequence[float]) -> bool:
        """Learn from one finished request's rewards (observation order); True if it counted."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe snapshot (restore with the concrete class's ``from_dict``)."""
        ...


def new_deployment_prior(mode: PriorMode) -> DeploymentPrior:
    """A fresh prior for the default policy of ``mode`` (what the gateway keeps per model)."""

    if mode == "cost":
        from stoppers.robust.cost_prior import cost_shape_prior

        return cost_shape_prior()  # the learned reward shape ShapePandora reads
    if mode == "target":
        from stoppers.robust.shape_prior import ShapePrior  # PooledTargetAcceptance's prior

        return ShapePrior()
    raise ValueError(f"mode must be 'cost' or 'target', got {mode!r}")
