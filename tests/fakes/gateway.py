"""Start the real gateway app (uvicorn, loopback) against a fake upstream and reward backend.

Example::

    with FakeUpstream() as upstream:
        server = start_gateway(upstream, FakeReward(), max_samples=8, parallelism=2)
        try:
            ...  # server.url, server.registry (the app's Prometheus registry)
        finally:
            server.stop()
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from server.app import create_app
from server.config import Settings
from server.policies import PolicyFactory
from tests.fakes.reward import FakeReward
from tests.fakes.servers import ServerThread
from tests.fakes.upstream import FakeUpstream

__all__ = ["GatewayServer", "start_gateway"]

FAST_TEST_DEFAULTS: dict[str, Any] = {
    "retry_backoff": 0.01,
    "keepalive_interval": 0.2,
    "request_timeout": 10.0,
}


class GatewayServer(ServerThread):
    registry: CollectorRegistry
    http_client: httpx.AsyncClient

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def stop(self) -> None:
        super().stop()


def start_gateway(
    upstream: FakeUpstream,
    reward: FakeReward,
    *,
    policy_factory: PolicyFactory | None = None,
    **settings: Any,
) -> GatewayServer:
    values = {**FAST_TEST_DEFAULTS, "upstream_url": upstream.base_url, **settings}
    config = Settings(**values)
    registry = CollectorRegistry()
    app = create_app(config, reward=reward, registry=registry, policy_factory=policy_factory)
    server = GatewayServer(app)
    server.registry = registry
    return server.start()  # type: ignore[return-value]
