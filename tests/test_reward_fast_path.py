"""The plain-ASGI fast path for POST /v1/rewards: what it serves, what it leaves to FastAPI."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from fastapi import Depends, HTTPException
from fastapi.dependencies.utils import get_parameterless_sub_dependant
from fastapi.routing import APIRoute
from reward_fixtures import PROMPT, load_tiny_scorer

from reward.app import create_app
from reward.fast_path import PATH, RewardsFastPath
from reward.settings import WorkerSettings


def _call(
    middleware: RewardsFastPath, method: str, path: str, chunks: list[bytes]
) -> list[dict[str, Any]]:
    scope = {"type": "http", "method": method, "path": path, "headers": []}
    incoming = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    return sent


def _middleware(enabled: bool = True) -> tuple[RewardsFastPath, list[Any]]:
    seen: list[Any] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append(("inner", scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 404, "headers": []})

    async def handle(raw: bytes) -> tuple[int, bytes]:
        seen.append(("handle", raw))
        return 201, b'{"ok": true}'

    return RewardsFastPath(inner, handle=handle, enabled=lambda: enabled), seen


def test_serves_only_post_to_its_path_with_the_whole_body() -> None:
    middleware, seen = _middleware()
    sent = _call(middleware, "POST", PATH, [b'{"a"', b": 1}"])
    assert seen == [("handle", b'{"a": 1}')]
    assert sent[0]["status"] == 201
    assert dict(sent[0]["headers"]) == {
        b"content-type": b"application/json",
        b"content-length": b"12",
    }
    assert sent[1] == {"type": "http.response.body", "body": b'{"ok": true}'}
    for method, path in (("GET", PATH), ("POST", "/v1/other"), ("POST", PATH + "/")):
        seen.clear()
        _call(middleware, method, path, [b""])
        assert seen == [("inner", method, path)]


def test_leaves_the_route_to_fastapi_when_disabled_and_ignores_a_client_that_left() -> None:
    middleware, seen = _middleware(enabled=False)
    _call(middleware, "POST", PATH, [b"{}"])
    assert seen == [("inner", "POST", PATH)]
    middleware, seen = _middleware()
    assert _call(middleware, "POST", PATH, []) == [] and seen == []  # disconnect before the body


def test_a_route_dependency_such_as_an_auth_check_is_never_skipped() -> None:
    settings = WorkerSettings(model="tiny-rm", device="cpu", dtype="float32")
    scorer = load_tiny_scorer()
    app = create_app(settings, load_scorer=lambda: scorer)

    def deny() -> None:
        raise HTTPException(status_code=401, detail="no key")

    route = next(r for r in app.routes if isinstance(r, APIRoute) and r.path == PATH)
    body = {"messages": PROMPT, "responses": ["Paris."]}

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            await app.state.backend.load()
            try:
                served = await client.post(PATH, json=body)
                route.dependant.dependencies.append(
                    get_parameterless_sub_dependant(depends=Depends(deny), path=route.path_format)
                )
                return served, await client.post(PATH, json=body)
            finally:
                await app.state.backend.aclose()

    served, refused = asyncio.run(scenario())
    assert served.status_code == 200 and len(served.json()["scores"]) == 1
    assert refused.status_code == 401


def test_an_unexpected_handler_failure_is_answered_500_in_openai_shape() -> None:
    async def inner(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not reached")

    async def broken(raw: bytes) -> tuple[int, bytes]:
        raise RuntimeError("boom")

    sent = _call(RewardsFastPath(inner, handle=broken, enabled=lambda: True), "POST", PATH, [b"{}"])
    assert sent[0]["status"] == 500
    error = json.loads(sent[1]["body"])["error"]
    assert error == {
        "message": "internal error: boom",
        "type": "server_error",
        "param": None,
        "code": None,
    }
