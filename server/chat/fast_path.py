"""Plain-ASGI fast path for ``POST /v1/chat/completions``.

The FastAPI route (``api_router``) documents the endpoint in the OpenAPI schema, but serving
each request through FastAPI's exception middleware, exit stack, router and route wrappers costs
more CPU than a pass-through proxy is allowed per request. This middleware, installed inside
the body-size limit, answers the endpoint directly with the same handler; every other path goes
on to FastAPI unchanged. Unexpected exceptions still reach Starlette's ServerErrorMiddleware.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from server.chat.serving import handle_chat
from server.errors import GatewayError

__all__ = ["ChatFastPath"]

PATH = "/v1/chat/completions"


class ChatFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await handle_chat(scope["app"].state.gateway, scope, receive)
        except GatewayError as error:
            response = JSONResponse(error.to_dict(), status_code=error.status_code)
        await response(scope, receive, send)
