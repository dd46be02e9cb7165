"""Typed application state, built in the lifespan (no module globals, no untyped lookups)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from prometheus_client import CollectorRegistry

from reward.base import RewardBackend
from server.config import Settings
from server.metrics import GatewayMetrics
from server.sampling import Sampler
from server.upstream import UpstreamClient

__all__ = ["GatewayState", "get_state"]


@dataclass
class GatewayState:
    settings: Settings
    registry: CollectorRegistry
    metrics: GatewayMetrics
    upstream: UpstreamClient
    reward: RewardBackend
    sampler: Sampler


async def get_state(request: Request) -> GatewayState:
    # async: FastAPI would run a plain function in its thread pool
    return request.app.state.gateway
