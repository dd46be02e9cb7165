"""Server-sent events: framing, and a streaming ASGI response that stops when the client leaves.

Starlette's ``StreamingResponse`` (ASGI spec 2.4) only notices a gone client at its next write;
a gateway waiting seconds for candidates must notice at once, so this response watches the
``http.disconnect`` message itself and closes the body iterator (whose ``finally`` cancels the
upstream work).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["DONE", "KEEPALIVE", "EventStreamResponse", "sse_data"]

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"


def sse_data(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class EventStreamResponse(Response):
    """Stream ``body`` as ``text/event-stream``; close it as soon as the client disconnects."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str = "text/event-stream",
    ) -> None:
        self.body_iterator = body
        self.status_code = status_code
        self.background = None
        self.raw_headers = [
            (b"content-type", media_type.encode()),
            (b"cache-control", b"no-cache"),
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.create_task(self._write(send))
        # Let the writer start the body before anything can cancel it: an async generator that
        # never started never runs its ``finally``, which is where upstream work is released.
        await asyncio.sleep(0)
        watcher = asyncio.create_task(_wait_disconnect(receive))
        try:
            await asyncio.wait({writer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (writer, watcher):
                task.cancel()
            await asyncio.gather(writer, watcher, return_exceptions=True)
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        if writer.done() and not writer.cancelled() and writer.exception() is not None:
            raise writer.exception()  # type: ignore[misc]

    async def _write(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except OSError:  # the client went away mid-write
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
