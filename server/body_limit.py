"""Plain-ASGI middleware that refuses request bodies above a byte limit with a 413.

Checks ``Content-Length`` up front and counts streamed bytes too (chunked bodies have none),
so an oversized body is never buffered whole. Never touches responses.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import PayloadTooLargeError, error_bytes

__all__ = ["BodyLimitMiddleware"]


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await self._reject(send)
                    return
        received = 0
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._error()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except PayloadTooLargeError:
            if not response_started:
                await self._reject(send)

    def _error(self) -> PayloadTooLargeError:
        return PayloadTooLargeError(
            f"request body exceeds the limit of {self.max_bytes} bytes", code="body_too_large"
        )

    async def _reject(self, send: Send) -> None:
        body = error_bytes(self._error())
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
