"""The lean upstream client closes keep-alive connections it no longer needs."""

from __future__ import annotations

import asyncio
import json

from server import lean_http
from server.lean_http import LeanPool
from tests.fakes import FakeUpstream

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def _burst(pool: LeanPool, count: int) -> None:
    async def one() -> None:
        response = await pool.request("POST", "/chat/completions", BODY)
        assert response.status_code == 200
        await response.aread()
        await response.aclose()

    await asyncio.gather(*(one() for _ in range(count)))


def test_connections_idle_past_the_limit_are_closed(monkeypatch):
    monkeypatch.setattr(lean_http, "IDLE_SECONDS", 0.2)

    async def scenario(upstream: FakeUpstream) -> tuple[int, int, int]:
        pool = LeanPool(upstream.base_url, timeout=10.0)
        try:
            await _burst(pool, 8)  # 8 concurrent requests: 8 pooled connections
            after_burst = len(pool.connections())
            await asyncio.sleep(0.4)  # all now idle past the limit
            await _burst(pool, 1)  # one request prunes the stale ones, then reuses or connects
            return after_burst, len(pool.connections()), upstream.open_connections
        finally:
            await pool.aclose()

    with FakeUpstream(tokens=2) as upstream:
        after_burst, after_quiet, _ = asyncio.run(scenario(upstream))
        assert after_burst == 8
        assert after_quiet == 1
        assert upstream.wait_connections_closed(5.0)
