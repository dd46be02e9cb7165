"""A cross-prompt prior on the reward tail's shape, kept per model by the gateway.

Why: one request sees a handful of rewards; its own estimate of the GPD shape xi is noisy
(xi decides how far the benchmark quantile lies beyond what was seen). But the prompts of one
deployment share a reward model and a generator, so their tails tend to share a shape. A
:class:`TailPrior` pools per-request shape estimates from *finished* requests (their observed
rewards only - never a full sample set) and hands the pooled shape to new requests as the
shrinkage target ``xi0`` of :func:`stoppers.robust.gpd_tail.fit_tail`.

It is a plain dataclass: serialise with :meth:`to_dict` / :meth:`from_dict` (JSON-safe), update
with :meth:`update` as requests finish. Thread-safety is the owner's business (one asyncio loop
needs none).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from stoppers.robust.gpd_tail import choose_tail_size, fit_tail

__all__ = ["TailPrior"]


@dataclass
class TailPrior:
    """Shape prior xi0 with strength ``weight`` (in pseudo-exceedances).

    ``base_xi`` / ``base_strength``: where the pooled shape starts and how many exceedances'
    worth of evidence that start is worth. ``xi0`` is the exceedance-weighted mean of the
    per-request shape estimates, shrunk to ``base_xi``.
    """

    base_xi: float = 0.0
    base_strength: float = 50.0
    weight: float = 30.0
    requests: int = 0
    exceedances: float = 0.0
    xi_sum: float = 0.0
    min_rewards: int = field(default=8)

    def __post_init__(self) -> None:
        for name in ("base_xi", "base_strength", "weight", "exceedances", "xi_sum"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
        if self.base_strength <= 0.0:
            raise ValueError(f"base_strength must be > 0, got {self.base_strength!r}")
        if self.weight < 0.0:
            raise ValueError(f"weight must be >= 0, got {self.weight!r}")

    @property
    def xi0(self) -> float:
        """Pooled shape: (base_strength base_xi + sum k_i xi_i) / (base_strength + sum k_i)."""
        return (self.base_strength * self.base_xi + self.xi_sum) / (
            self.base_strength + self.exceedances
        )

    def update(self, rewards: list[float] | np.ndarray) -> bool:
        """Learn from one finished request's observed rewards. Returns True if it counted.

        Requests with fewer than ``min_rewards`` rewards, or no fittable tail (all tied), teach
        nothing about the shape and are skipped.
        """
        values = np.sort(np.asarray(rewards, dtype=float))
        if values.size < self.min_rewards or not np.all(np.isfinite(values)):
            return False
        fit = fit_tail(values, xi0=0.0, prior_weight=0.0, k=choose_tail_size(values.size))
        if fit is None:
            return False
        self.requests += 1
        self.exceedances += fit.k
        self.xi_sum += fit.k * fit.xi
        return True

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, float | int]) -> TailPrior:
        return cls(**data)
