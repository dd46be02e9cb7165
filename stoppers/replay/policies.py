"""Which policies replay can run, how to build them, and which have a vectorised fast path.

Every CLI policy name maps to a :class:`~stoppers.base.StoppingPolicy` class exported by
``stoppers``. The per-object loop builds that class; the fast path (AdaptiveBestOfN and
TargetAcceptance) calls the very same decision kernel the class uses,
:func:`stoppers.adaptive_math.cost_decision` / :func:`~stoppers.adaptive_math.target_decision`,
with the parameters taken from the constructor call (explicit values, else the class's own
defaults read from its signature), so the two paths cannot disagree on a setting.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoppers.replay.batch import Outcome, PromptBatch
from stoppers.replay.loop import PolicyFactory
from stoppers.replay.streaming import Decider, StreamStats

__all__ = [
    "PATIENCE_K",
    "PolicyChoice",
    "available_policies",
    "patience_outcome",
    "resolve_policy",
]


@dataclass(frozen=True)
class PolicyChoice:
    name: str  # CLI name
    class_path: str  # "module:Class" (also looked up on the ``stoppers`` package first)
    parameter: str  # "cost" or "target": what the experiment varies
    fast: str | None = None  # "cost" / "target" (shared kernel), "patience"; None: loop only
    median: str = "mean"  # the kernel's median convention (np.median: mean of the middles)
    fixed: tuple[tuple[str, Any], ...] = ()  # constructor arguments replay always passes

    @property
    def has_fast_path(self) -> bool:
        return self.fast is not None

    def policy_class(self) -> type:
        module_name, class_name = self.class_path.split(":")
        cls = getattr(importlib.import_module("stoppers"), class_name, None)
        if cls is None:
            try:
                cls = getattr(importlib.import_module(module_name), class_name, None)
            except ModuleNotFoundError:
                cls = None
        if cls is None:
            raise ValueError(
                f"policy {self.name!r} needs {module_name}.{class_name}, which this install "
                "does not provide"
            )
        return cls

    def constructor_kwargs(self, value: float, config: Any, budget: int | None) -> dict:
        """Keyword arguments for the policy class (only those its constructor accepts)."""
        wanted = {
            **dict(self.fixed),
            **dict(getattr(config, "policy_options", ())),
            self.parameter: value,
            "alpha": config.alpha,
            "delta": config.delta,
            "min_samples": config.min_samples,
            "max_samples": budget,
        }
        params = inspect.signature(self.policy_class()).parameters
        accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        unknown = [k for k, _ in getattr(config, "policy_options", ()) if k not in params]
        if unknown and not accepts_any:
            raise ValueError(
                f"policy {self.name!r} has no option {', '.join(map(repr, unknown))} "
                f"(it takes: {', '.join(p for p in params if p != 'max_samples')})"
            )
        return {k: v for k, v in wanted.items() if v is not None and (accepts_any or k in params)}

    def factory(self, value: float, config: Any, batch: PromptBatch) -> PolicyFactory:
        cls = self.policy_class()

        def build(_prompt: int, budget: int):
            return cls(**self.constructor_kwargs(value, config, budget))

        return build

    def kernel(self):
        from stoppers import adaptive_math

        return adaptive_math.cost_decision if self.fast == "cost" else adaptive_math.target_decision

    def kernel_kwargs(self, value: float, config: Any) -> dict:
        """The kernel's keyword arguments exactly as the policy object would pass them: every
        keyword the kernel and the constructor share, explicit or the constructor's default."""
        kernel_params = inspect.signature(self.kernel()).parameters
        shared = {
            name
            for name, p in kernel_params.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and name != self.parameter
        }
        out = {self.parameter: value}
        for name, setting in self.effective_parameters(config).items():
            if name in shared:
                out[name] = setting
        return out

    def effective_parameters(self, config: Any) -> dict[str, Any]:
        """Every constructor setting the replay uses (explicit or the class default), for
        ``results.json``; the varied cost/target and the per-prompt budget are left out."""
        params = inspect.signature(self.policy_class()).parameters
        explicit = self.constructor_kwargs(1.0, config, None)
        out = {}
        for name, param in params.items():
            if name in (self.parameter, "max_samples") or param.kind in (
                inspect.Parameter.VAR_KEYWORD,
                inspect.Parameter.VAR_POSITIONAL,
            ):
                continue
            if name in explicit:
                out[name] = explicit[name]
            elif param.default is not inspect.Parameter.empty:
                out[name] = param.default
        return out

    def decider(self, value: float, config: Any) -> Decider:
        if self.fast not in ("cost", "target"):
            raise ValueError(f"policy {self.name!r} has no vectorised path")
        from stoppers import adaptive_math

        kernel = (
            adaptive_math.cost_decision if self.fast == "cost" else adaptive_math.target_decision
        )
        kwargs = self.kernel_kwargs(value, config)

        def decide(s: StreamStats) -> np.ndarray:
            decision = kernel(
                s.n.astype(np.float64),
                s.median,
                s.tail_count.astype(np.float64),
                s.tail_sum,
                s.reference,
                s.best,
                **kwargs,
            )
            return np.asarray(decision.stop, dtype=bool)

        # The kernel never stops before min_samples: the engine need not ask it there.
        decide.min_samples = int(kwargs.get("min_samples", 1))  # type: ignore[attr-defined]
        return decide


# Patience's k: the authors' replay compares against k = 5 (PATIENCE_STEPS).
PATIENCE_K = 5

_CHOICES = {
    "adaptive": PolicyChoice("adaptive", "stoppers.adaptive:AdaptiveBestOfN", "cost", fast="cost"),
    "target": PolicyChoice("target", "stoppers.adaptive:TargetAcceptance", "target", fast="target"),
    "tail-cost": PolicyChoice("tail-cost", "stoppers.robust.cost:TailPandora", "cost"),
    "shape-cost": PolicyChoice("shape-cost", "stoppers.robust.shape_cost:ShapePandora", "cost"),
    "bayes-shape-cost": PolicyChoice(
        "bayes-shape-cost", "stoppers.robust.bayes_cost:BayesShapePandora", "cost"
    ),
    "tail-target": PolicyChoice(
        "tail-target", "stoppers.robust.target:TailTargetAcceptance", "target"
    ),
    "pooled-target": PolicyChoice(
        "pooled-target", "stoppers.robust.pooled_target:PooledTargetAcceptance", "target"
    ),
    "ucb-exp": PolicyChoice("ucb-exp", "stoppers.weitzman:UCBExponential", "cost"),
    "beacon": PolicyChoice("beacon", "stoppers.beacon:Beacon", "cost"),
    "patience": PolicyChoice(
        "patience", "stoppers.classic:Patience", "cost", fast="patience", fixed=(("k", PATIENCE_K),)
    ),
}


def patience_outcome(batch: PromptBatch, k: int, prefix_max: np.ndarray) -> Outcome:
    """Patience(k) on every row at once: stop after k rewards in a row that do not beat the best.

    A reward "improves" when it is strictly above the best so far (ties do not reset the count),
    exactly as :class:`stoppers.classic.Patience` counts.
    """
    values = batch.values
    previous = np.concatenate([np.full((batch.rows, 1), -np.inf), prefix_max[:, :-1]], axis=1)
    steps = np.arange(batch.horizon)
    last = np.maximum.accumulate(np.where(values > previous, steps, 0), axis=1)
    stop = ((steps - last) >= k) | (steps[None, :] + 1 >= batch.budget[:, None])
    n = np.argmax(stop, axis=1) + 1
    return Outcome(n=n, best=prefix_max[np.arange(batch.rows), n - 1])


def available_policies() -> tuple[str, ...]:
    return tuple(_CHOICES)


def resolve_policy(name: str) -> PolicyChoice:
    """The :class:`PolicyChoice` for a CLI name; ValueError if unknown or not installed."""
    try:
        choice = _CHOICES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(_CHOICES)}") from None
    choice.policy_class()
    return choice
