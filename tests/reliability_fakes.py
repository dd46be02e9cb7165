"""Helpers for the reliability and security suites (on top of ``tests.fakes``).

- :class:`LogCapture`: records every log record of the gateway process (uvicorn, asyncio, the
  app, httpx) so a test can assert that nothing was logged as an unhandled exception and that a
  secret never reached a log line.
- :class:`SwitchableProxy`: a loopback TCP forwarder in front of the fake upstream that can be
  switched off (connection refused, every open connection aborted) and on again on the same
  port: a real outage and recovery, without restarting the gateway.
- :func:`assert_no_leaks`: the invariants every fault must keep: in-flight gauges back to zero,
  no upstream stream still open, every pooled upstream connection idle and accounted for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "ConnectionCounter",
    "LogCapture",
    "SwitchableProxy",
    "assert_no_leaks",
    "eventually",
    "pool_connections",
]

# uvicorn reconfigures its own loggers (and drops foreign handlers) when a server is built,
# so the capture attaches directly to each of these after the servers are up.
LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "asyncio", "server", "reward")


class LogCapture(logging.Handler):
    """Collects records from the gateway's loggers while active (use as a context manager)."""

    def __init__(self, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()
        self._saved: list[tuple[logging.Logger, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_records:
            self.records.append(record)

    def __enter__(self) -> LogCapture:
        for name in LOGGERS:
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.level))
            logger.addHandler(self)
            if logger.level == logging.NOTSET or logger.level > self.level:
                logger.setLevel(self.level)
        return self

    def __exit__(self, *exc: object) -> None:
        for logger, level in self._saved:
            logger.removeHandler(self)
            logger.setLevel(level)
        self._saved.clear()

    def text(self) -> str:
        """Every captured line, formatted with its traceback (what a log file would hold)."""
        formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
        with self._lock_records:
            return "\n".join(formatter.format(record) for record in self.records)

    def problems(self) -> list[str]:
        """Records that signal an unhandled or logged exception."""
        found = []
        with self._lock_records:
            records = list(self.records)
        for record in records:
            message = record.getMessage()
            if (
                record.levelno >= logging.ERROR
                or record.exc_info
                or "Traceback" in message
                or "never retrieved" in message
                or "was destroyed but it is pending" in message
            ):
                found.append(f"{record.name}: {message}")
        return found


def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def pool_connections(server: Any) -> list[Any]:
    """The gateway's pooled upstream connections (httpcore objects; read-only inspection)."""
    upstream = server.config.app.state.gateway.upstream
    connections = []
    for client in getattr(upstream, "clients", None) or [upstream.client]:
        pool = getattr(client._transport, "_pool", None)
        connections += list(pool.connections) if pool is not None else []
    lean = getattr(upstream, "lean", None)  # the gateway's lean client (remote upstreams)
    connections += lean.connections() if lean is not None else []
    return connections


def assert_no_leaks(server: Any, upstream: Any = None, logs: LogCapture | None = None) -> None:
    """In-flight gauges at zero, no upstream stream open, every pooled connection idle (no
    response left unclosed) and the fake's open connections equal to the idle pool, and no
    unhandled exception logged."""
    assert eventually(
        lambda: (
            server.metric("pandora_inflight_requests") == 0
            and server.metric("pandora_inflight_candidates") == 0
        )
    ), (
        "in-flight gauges did not return to zero: "
        f"requests={server.metric('pandora_inflight_requests')}, "
        f"candidates={server.metric('pandora_inflight_candidates')}"
    )
    if upstream is not None:
        assert upstream.wait_idle(5.0), f"{upstream.active_streams} upstream streams still open"

        def pool_idle_and_counted() -> bool:
            connections = pool_connections(server)
            return all(c.is_idle() for c in connections) and upstream.open_connections == len(
                connections
            )

        assert eventually(pool_idle_and_counted), (
            f"upstream open connections {upstream.open_connections}, gateway pool "
            f"{[repr(c) for c in pool_connections(server)]}"
        )
    if logs is not None:
        assert logs.problems() == [], logs.problems()


class SwitchableProxy:
    """``127.0.0.1:port`` -> ``target_port``, switchable off (refused + aborted) and on."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = _free_port()
        self.open_connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.Transport] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def up(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_server(
                self._handle, "127.0.0.1", self.port, reuse_address=True
            )

        self._call(start())

    def down(self) -> None:
        """Stop listening (connection refused) and abort every open connection (RST)."""

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
                self._server = None
            for transport in list(self._transports):
                transport.abort()

        self._call(stop())

    def close(self) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        self._transports.add(writer.transport)  # type: ignore[arg-type]
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            self.open_connections -= 1
            return
        self._transports.add(up_writer.transport)  # type: ignore[arg-type]
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._transports.discard(w.transport)  # type: ignore[arg-type]
                w.transport.abort()
            self.open_connections -= 1


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(Exception):
        writer.transport.abort()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def switchable_proxy(target_port: int) -> Iterator[SwitchableProxy]:
    proxy = SwitchableProxy(target_port)
    proxy.up()
    try:
        yield proxy
    finally:
        proxy.close()


class ConnectionCounter:
    """A loopback listener that only counts who connects (an SSRF target that must stay quiet)."""

    def __init__(self) -> None:
        self.connections = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()
