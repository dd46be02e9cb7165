"""A lean pooled HTTP/1.1 client for the upstream hot path (candidates and mode ``off``).

httpx spends most of a proxied request's CPU in its layered client and in httpcore's pool
bookkeeping; a pass-through needs none of it: keep-alive connections in a deque, the request
written in one ``write``, a status line, headers, and a body framed by ``Content-Length`` or
chunked encoding. Measured on loopback it cut the gateway's CPU per proxied request about 3x
(README, "Gateway", benchmark). It is used only for plain ``http://`` upstreams with no proxy
configured (``--upstream-transport auto``); HTTPS, proxies and injected clients go through httpx,
the injectable seam.
Errors are ``httpx.TransportError`` subclasses, so callers handle both clients alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx

__all__ = ["LeanPool", "LeanResponse", "LeanTransportError"]

MAX_IDLE = 256
# Close connections idle longer than this: servers drop them anyway (uvicorn, vLLM's server,
# after 5 s by default) and each one holds a file descriptor until we close our side.
IDLE_SECONDS = 4.0
READ_SIZE = 65536


class LeanTransportError(httpx.TransportError):
    """Connection refused/reset, timeout, or a malformed response; ``kind`` says which
    (one of the gateway's upstream error kinds: connection, timeout, protocol)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _StaleConnection(Exception):
    """A kept-alive connection the server had closed while idle (nothing was answered)."""


class _Connection:
    __slots__ = ("idle", "idle_since", "live", "reader", "writer")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, live: set[_Connection]
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.idle = False
        self.idle_since = 0.0
        self.live = live
        live.add(self)

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def is_idle(self) -> bool:
        """Pooled and waiting (no response in flight on it)."""
        return self.idle

    def close(self) -> None:
        self.idle = False
        self.live.discard(self)
        self.writer.close()


class LeanResponse:
    """A response whose body is read once (raw or whole); ``aclose`` recycles the connection."""

    def __init__(
        self, pool: LeanPool, conn: _Connection, status: int, headers: dict[str, str]
    ) -> None:
        self.pool = pool
        self.conn: _Connection | None = conn
        self.status_code = status
        self.headers = headers
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._length = int(length) if length is not None and not self._chunked else None
        self._keep_alive = headers.get("connection", "").lower() != "close"
        self._done = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        assert self.conn is not None
        reader, timeout = self.conn.reader, self.pool.timeout
        try:
            if self._chunked:
                while True:
                    async with asyncio.timeout(timeout):
                        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                        if size == 0:
                            await reader.readuntil(b"\r\n")  # end of (empty) trailers
                            break
                        data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif self._length is not None:
                remaining = self._length
                while remaining:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(min(remaining, READ_SIZE))
                    if not data:
                        raise LeanTransportError("protocol", "upstream closed mid-body")
                    remaining -= len(data)
                    yield data
            else:  # no framing: the body ends when the connection does
                self._keep_alive = False
                while True:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(READ_SIZE)
                    if not data:
                        break
                    yield data
        except TimeoutError:
            raise LeanTransportError("timeout", "upstream timed out mid-body") from None
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            raise LeanTransportError("protocol", "upstream sent a broken body") from None
        except OSError:
            raise LeanTransportError("connection", "upstream connection lost") from None
        self._done = True

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if self._done and self._keep_alive:
            self.pool.release(conn)
        else:
            conn.close()  # unread body: the connection cannot be reused (closing aborts it)


class LeanPool:
    """Keep-alive connections to one upstream origin (the ``--upstream-url``)."""

    def __init__(
        self, base_url: str, *, timeout: float, headers: dict[str, str] | None = None
    ) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        host_header = self.host if parts.port is None else f"{self.host}:{self.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._static_headers = f"host: {host_header}\r\n{extra}"
        self._idle: deque[_Connection] = deque()
        self._live: set[_Connection] = set()

    def connections(self) -> list[_Connection]:
        """Every open connection (idle or carrying a response), for leak checks in tests."""
        return list(self._live)

    async def request(self, method: str, path: str, body: bytes) -> LeanResponse:
        payload = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._static_headers}"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body
        self._prune(time.monotonic())
        while self._idle:
            conn = self._idle.pop()
            conn.idle = False
            if not conn.usable():
                conn.close()
                continue
            try:
                return await self._exchange(conn, payload)
            except _StaleConnection:
                conn.close()  # closed by the server while idle: try the next one
        conn = await self._connect()
        try:
            return await self._exchange(conn, payload)
        except _StaleConnection:
            conn.close()
            raise LeanTransportError("connection", "upstream closed the connection") from None

    def _prune(self, now: float) -> None:
        """Close connections idle past IDLE_SECONDS (the oldest sit on the left: reuse is LIFO)."""
        while self._idle and now - self._idle[0].idle_since > IDLE_SECONDS:
            conn = self._idle.popleft()
            conn.idle = False
            conn.close()

    def release(self, conn: _Connection) -> None:
        now = time.monotonic()
        self._prune(now)
        if conn.usable() and len(self._idle) < MAX_IDLE:
            conn.idle = True
            conn.idle_since = now
            self._idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        while self._idle:
            with contextlib.suppress(Exception):
                self._idle.pop().close()

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls)
        except TimeoutError:
            raise LeanTransportError("timeout", "upstream connect timed out") from None
        except OSError as exc:
            raise LeanTransportError(
                "connection", f"upstream connection failed ({type(exc).__name__})"
            ) from None
        return _Connection(reader, writer, self._live)

    async def _exchange(self, conn: _Connection, payload: bytes) -> LeanResponse:
        try:
            conn.writer.write(payload)
            async with asyncio.timeout(self.timeout):
                head = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _StaleConnection() from None
            conn.close()
            raise LeanTransportError("protocol", "upstream sent a truncated response") from None
        except TimeoutError:
            conn.close()
            raise LeanTransportError("timeout", "upstream timed out") from None
        except asyncio.LimitOverrunError:
            conn.close()
            raise LeanTransportError("protocol", "upstream headers too large") from None
        except OSError:
            raise _StaleConnection() from None
        except BaseException:  # cancelled mid-exchange: the connection state is unknown
            conn.close()
            raise
        lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            conn.close()
            raise LeanTransportError("protocol", "upstream sent a malformed status line") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return LeanResponse(self, conn, status, headers)
