"""A lean pooled HTTP/1.1 client for the upstream hot path (candidates and mode ``off``).

httpx spends most of a proxied request's CPU in its layered client and in httpcore's pool
bookkeeping; a pass-through needs none of it: keep-alive connections in a deque, the request
written in one ``write``, and the response parsed by httptools (llhttp, the C parser uvicorn
uses for the server side) straight from an ``asyncio.Protocol``'s ``data_received``: no stream
reader, no per-read timeout context, no Python-level chunk framing. A response that arrives
whole in one read (the usual non-streamed answer) is complete before its reader even waits.
It is used only for plain ``http://`` upstreams with no proxy configured
(``--upstream-transport auto``); HTTPS, proxies and injected clients go through httpx, the
injectable seam. Errors are ``httpx.TransportError`` subclasses, so callers handle both alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools
import httpx

__all__ = ["LeanPool", "LeanResponse", "LeanTransportError"]

MAX_IDLE = 256
# Close connections idle longer than this: servers drop them anyway (uvicorn, vLLM's server,
# after 5 s by default) and each one holds a file descriptor until we close our side.
IDLE_SECONDS = 4.0
# Stop reading from the upstream while this much body is buffered and not yet consumed.
HIGH_WATER = 1 << 20


class LeanTransportError(httpx.TransportError):
    """Connection refused/reset, timeout, or a malformed response; ``kind`` says which
    (one of the gateway's upstream error kinds: connection, timeout, protocol)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _StaleConnection(Exception):
    """A kept-alive connection the server had closed while idle (nothing was answered)."""


class _Connection(asyncio.Protocol):
    """One upstream connection; it parses the response of the exchange in flight as bytes
    arrive and wakes the one coroutine waiting for the next part (head, body, end)."""

    def __init__(self, live: set[_Connection]) -> None:
        self.live = live
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.got_bytes = False  # any byte of this exchange's response arrived
        self.status = 0
        self.header_list: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = True
        self.error: LeanTransportError | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.live.add(self)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail("protocol", "upstream sent a malformed response")
            self.close()
            return
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # let the transport close; connection_lost settles the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.idle = False
        self.live.discard(self)
        if self.complete or self.error is not None:
            self._wake()
            return
        if self.head_done and self._ends_with_connection():
            self.complete = True  # a body framed by the connection's end
            self.keep_alive = False
            self._wake()
        elif self.head_done:
            self._fail("protocol", "upstream closed mid-body")
        elif self.got_bytes:
            self._fail("protocol", "upstream sent a truncated response")
        else:
            self._wake()  # nothing answered: the reader decides (stale keep-alive or refused)

    # -- httptools callbacks -----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_list.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # -- helpers -----------------------------------------------------------------------------
    def _ends_with_connection(self) -> bool:
        names = {name.lower() for name, _ in self.header_list}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _fail(self, kind: str, message: str) -> None:
        if self.error is None:
            self.error = LeanTransportError(kind, message)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, seconds: float) -> None:
        """Wait for the next event of the exchange; TimeoutError after ``seconds``
        without one (the callers check the state first: events are never missed)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(seconds, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def take(self) -> bytes:
        data = b"".join(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return data

    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def is_idle(self) -> bool:
        """Pooled and waiting (no response in flight on it)."""
        return self.idle

    def close(self) -> None:
        self.idle = False
        self.live.discard(self)
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class LeanResponse:
    """A response whose body is read once (raw or whole); ``aclose`` recycles the connection."""

    def __init__(
        self, pool: LeanPool, conn: _Connection, status: int, headers: dict[str, str]
    ) -> None:
        self.pool = pool
        self.conn: _Connection | None = conn
        self.status_code = status
        self.headers = headers
        self._done = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        conn = self.conn
        assert conn is not None
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.error is not None:
                raise conn.error
            if conn.complete:
                break
            if conn.closed:
                raise LeanTransportError("protocol", "upstream closed mid-body")
            try:
                await conn.wait(self.pool.timeout)
            except TimeoutError:
                raise LeanTransportError("timeout", "upstream timed out mid-body") from None
        self._done = True

    async def aread(self) -> bytes:
        conn = self.conn
        assert conn is not None
        if conn.complete and conn.error is None:  # the usual case: it all came in one read
            self._done = True
            return conn.take()
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if self._done and conn.keep_alive and conn.error is None:
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
        self._heads: dict[tuple[str, str], bytes] = {}
        self._idle: deque[_Connection] = deque()
        self._live: set[_Connection] = set()

    def connections(self) -> list[_Connection]:
        """Every open connection (idle or carrying a response), for leak checks in tests."""
        return list(self._live)

    def _head(self, method: str, path: str) -> bytes:
        key = (method, path)
        head = self._heads.get(key)
        if head is None:
            head = self._heads[key] = (
                f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._static_headers}"
                "content-type: application/json\r\ncontent-length: "
            ).encode()
        return head

    async def request(self, method: str, path: str, body: bytes) -> LeanResponse:
        payload = b"%s%d\r\n\r\n%s" % (self._head(method, path), len(body), body)
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
            conn._reset()
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
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._live),
                    self.host,
                    self.port,
                    ssl=self.tls,
                )
        except TimeoutError:
            raise LeanTransportError("timeout", "upstream connect timed out") from None
        except OSError as exc:
            raise LeanTransportError(
                "connection", f"upstream connection failed ({type(exc).__name__})"
            ) from None
        return conn

    async def _exchange(self, conn: _Connection, payload: bytes) -> LeanResponse:
        assert conn.transport is not None
        try:
            conn.transport.write(payload)
            while not conn.head_done:
                if conn.error is not None:
                    conn.close()
                    raise conn.error
                if conn.closed:
                    raise _StaleConnection()  # closed before answering anything
                await conn.wait(self.timeout)
        except TimeoutError:
            conn.close()
            raise LeanTransportError("timeout", "upstream timed out") from None
        except (LeanTransportError, _StaleConnection):
            raise
        except OSError:
            raise _StaleConnection() from None
        except BaseException:  # cancelled mid-exchange: the connection state is unknown
            conn.close()
            raise
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in conn.header_list
        }
        return LeanResponse(self, conn, conn.status, headers)
