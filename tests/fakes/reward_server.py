"""The fake reward backend as a real HTTP server speaking the reward worker's protocol.

``POST /v1/rewards`` ``{"messages", "responses"}`` -> ``{"model", "scores", "truncated",
"usage"}`` and ``GET /health``, on 127.0.0.1 in a background thread. Scores and failures come
from the wrapped :class:`FakeReward` (``down`` -> 503, ``nan`` -> a NaN in the JSON,
``wrong_count``, ``delay``), so the gateway can be tested with ``--reward-backend worker``.

Example::

    reward = FakeReward()
    with FakeRewardServer(reward) as server:
        start_gateway(upstream, reward, reward_url=server.base_url, reward_backend="worker")
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from reward.base import RewardError
from tests.fakes.reward import FakeReward
from tests.fakes.upstream import _read_request

__all__ = ["FakeRewardServer"]


class FakeRewardServer:
    def __init__(self, reward: FakeReward | None = None) -> None:
        self.reward = reward or FakeReward()
        self.port = 0
        self.requests = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeRewardServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-reward", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            self._loop.stop()  # type: ignore[union-attr]

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FakeRewardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await _read_request(reader)) is not None:
                method, path, _, body = request
                status, payload = await self._route(method, path, body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        if method == "GET" and path == "/health":
            ok = await self.reward.ready()
            return (200, {"status": "ok"}) if ok else (503, _error("not ready"))
        if method == "POST" and path == "/v1/rewards":
            self.requests += 1
            data = json.loads(body)
            try:
                scores = await self.reward.score(data["messages"], data["responses"])
            except RewardError as exc:
                return 503, _error(str(exc))
            return 200, json.dumps(
                {
                    "model": "fake-reward-model",
                    "scores": scores,  # NaN stays NaN: invalid JSON, as a broken worker sends
                    "truncated": [False] * len(scores),
                    "usage": {"prompt_tokens": 0},
                }
            ).encode()
        return 404, _error(f"no route {method} {path}")


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "fake_error", "param": None, "code": None}}
