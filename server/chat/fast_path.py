"""Plain-ASGI fast path for ``POST /v1/chat/completions``, outside FastAPI's middleware stack.

The FastAPI route (``api_router``) documents the endpoint in the OpenAPI schema, but serving
each request through FastAPI's error, telemetry and body-limit middlewares, exception
middleware, exit stack, router and route wrappers costs more CPU than a pass-through proxy is
allowed per request (each layer also wraps ``send`` and ``receive``). :func:`install_fast_path`
puts this wrapper around the whole stack: the endpoint is answered directly by the same handler
(which enforces the body limit itself), every other request goes on to FastAPI unchanged.
An unexpected exception is answered with a 500 in OpenAI's error shape (what Starlette's
ServerErrorMiddleware would do, in our shape) and re-raised for uvicorn to log.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from server.chat.serving import handle_chat
from server.errors import GatewayError, error_body

__all__ = ["ChatFastPath", "install_fast_path"]

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
        except Exception:
            # handle_chat never sends, so nothing has started: answer, then let uvicorn log it
            await JSONResponse(
                error_body("internal server error", "internal_error"), status_code=500
            )(scope, receive, send)
            raise
        await response(scope, receive, send)


def install_fast_path(app: FastAPI) -> None:
    """Serve the chat endpoint from :class:`ChatFastPath` wrapped around the app's whole
    middleware stack (built lazily by Starlette on the first request, as usual)."""
    build = app.build_middleware_stack

    def build_with_fast_path() -> ASGIApp:
        return ChatFastPath(build())

    app.build_middleware_stack = build_with_fast_path  # type: ignore[method-assign]
