"""Reward-model scoring: the batching worker service and the clients that reach any backend.

``import reward`` imports neither torch, transformers nor httpx; each backend loads what it needs.
"""

from reward.base import RewardBackend, RewardError, RewardInputError
from reward.factory import BACKEND_KINDS, create_backend

__all__ = ["BACKEND_KINDS", "RewardBackend", "RewardError", "RewardInputError", "create_backend"]
