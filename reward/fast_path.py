"""Plain-ASGI fast path for ``POST /v1/rewards``.

The FastAPI route documents the endpoint in the OpenAPI schema, but serving each request through
FastAPI's middleware (error, telemetry, body limit, exception, exit stack), router, dependency
solver and body parsing cost the worker ~1.5 ms of event-loop CPU per request, as much as
scoring a pair in a batched forward pass of a small model (py-spy, concurrency 32). This ASGI
app, outermost in the worker's stack, answers the endpoint directly: it reads the raw body and
hands it to the same handler the route uses (pydantic validates the bytes in one
``model_validate_json`` call), then writes the JSON answer; an unexpected exception is logged
and answered 500 in OpenAI's error shape. Every other path, and this one whenever the route has
dependencies (the ``--api-key`` check is one), goes on to FastAPI unchanged, so nothing the
route enforces is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from pydantic_core import to_json
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["PATH", "RewardsFastPath"]

PATH = "/v1/rewards"

logger = logging.getLogger(__name__)

# raw request body -> (HTTP status, JSON body)
Handler = Callable[[bytes], Awaitable[tuple[int, bytes]]]


class RewardsFastPath:
    """Serves ``POST /v1/rewards`` with ``handle`` while ``enabled()`` says the route is plain."""

    def __init__(self, app: ASGIApp, *, handle: Handler, enabled: Callable[[], bool]) -> None:
        self.app = app
        self.handle = handle
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != PATH
            or scope["method"] != "POST"
            or not self.enabled()
        ):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nobody to answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            status, payload = await self.handle(b"".join(chunks))
        except Exception as exc:
            logger.exception("POST %s failed", PATH)
            error = {"message": f"internal error: {exc}", "type": "server_error"}
            status, payload = 500, to_json({"error": error | {"param": None, "code": None}})
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
