"""The lean upstream client closes keep-alive connections it no longer needs."""

from __future__ import annotations

import asyncio
import json

import pytest

from server import lean_http
from server.lean_http import LeanPool, LeanTransportError
from tests.fakes import FakeUpstream

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def _burst(pool: LeanPool, count: int) -> None:
    async def one() -> None:
        response = await pool.request("POST", "/chat/completions", BODY)
        assert response.status_code == 200
        await response.aread()
        await response.aclose()

    await asyncio.gather(*(one() for _ in range(count)))


def test_connections_idle_past_the_limit_are_closed(monkeypatch):
    monkeypatch.setattr(lean_http, "IDLE_SECONDS", 0.2)

    async def scenario(upstream: FakeUpstream) -> tuple[int, int, int]:
        pool = LeanPool(upstream.base_url, timeout=10.0)
        try:
            await _burst(pool, 8)  # 8 concurrent requests: 8 pooled connections
            after_burst = len(pool.connections())
            await asyncio.sleep(0.4)  # all now idle past the limit
            await _burst(pool, 1)  # one request prunes the stale ones, then reuses or connects
            return after_burst, len(pool.connections()), upstream.open_connections
        finally:
            await pool.aclose()

    with FakeUpstream(tokens=2) as upstream:
        after_burst, after_quiet, _ = asyncio.run(scenario(upstream))
        assert after_burst == 8
        assert after_quiet == 1
        assert upstream.wait_connections_closed(5.0)


# -- response framing and failures, against a scripted raw HTTP server -------------------------
Script = list  # per request: a list of byte strings to write (None = close the connection)


async def _scripted(scripts: list[Script]):
    """A server answering the n-th request on any connection with ``scripts[n]``, writing each
    piece separately (a short pause between them), then keeping the connection open unless a
    piece is ``None``. Returns (server, base_url, connection count list)."""
    served = iter(scripts)
    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                for piece in next(served):
                    if piece is None:
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
        except (asyncio.IncompleteReadError, ConnectionError, StopIteration):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1", connections


OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


def _run(scripts: list[Script], scenario, timeout: float = 5.0):
    async def main():
        server, url, connections = await _scripted(scripts)
        pool = LeanPool(url, timeout=timeout)
        try:
            return await scenario(pool), connections
        finally:
            await pool.aclose()
            server.close()

    return asyncio.run(main())


def test_chunked_body_arrives_piece_by_piece_and_the_connection_is_reused():
    chunked = [
        OK_HEAD + b"transfer-encoding: chunked\r\n\r\n",
        b"6\r\ndata: \r\n",
        b"3\r\nabc\r\n5\r\n\n\nxyz\r\n",
        b"0\r\n\r\n",
    ]
    length = [OK_HEAD + b"content-length: 5\r\n\r\nhe", b"llo"]

    async def scenario(pool):
        response = await pool.request("POST", "/chat/completions", BODY)
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
        pieces = [piece async for piece in response.aiter_raw()]
        await response.aclose()
        second = await pool.request("POST", "/chat/completions", BODY)
        body = await second.aread()
        await second.aclose()
        return pieces, body, len(pool.connections())

    (pieces, body, pooled), connections = _run([chunked, length], scenario)
    assert b"".join(pieces) == b"data: abc\n\nxyz"
    assert len(pieces) >= 2  # streamed as it came, not buffered whole
    assert body == b"hello"
    assert pooled == 1 and len(connections) == 1  # one keep-alive connection for both


def test_body_framed_by_the_connection_end_is_read_whole_and_not_reused():
    script = [OK_HEAD + b"\r\npart one, ", b"part two", None]

    async def scenario(pool):
        response = await pool.request("POST", "/chat/completions", BODY)
        body = await response.aread()
        await response.aclose()
        return body, len(pool.connections())

    (body, pooled), _ = _run([script], scenario)
    assert body == b"part one, part two"
    assert pooled == 0


@pytest.mark.parametrize(
    ("script", "kind"),
    [
        ([b"HTTQ/1.1 200 OK\r\n\r\n"], "protocol"),  # not HTTP
        ([OK_HEAD + b"content-length: 100\r\n\r\nonly this", None], "protocol"),  # truncated
        ([OK_HEAD + b"transfer-encoding: chunked\r\n\r\nzz\r\n"], "protocol"),  # bad chunk size
        ([OK_HEAD + b"content-le"], "timeout"),  # the head never completes
        ([OK_HEAD + b"content-length: 10\r\n\r\nabc"], "timeout"),  # the body stalls
    ],
)
def test_broken_responses_are_transport_errors_of_the_right_kind(script, kind):
    async def scenario(pool):
        try:
            response = await pool.request("POST", "/chat/completions", BODY)
        except LeanTransportError as exc:
            return exc.kind, len(pool.connections())
        got = "no error"
        try:
            await response.aread()
        except LeanTransportError as exc:
            got = exc.kind
        await response.aclose()
        return got, len(pool.connections())

    (got, left), _ = _run([script], scenario, timeout=0.3)
    assert got == kind
    assert left == 0  # a connection in an unknown state is never pooled


def test_a_keep_alive_connection_closed_while_idle_is_replaced_transparently():
    first = [OK_HEAD + b"content-length: 2\r\n\r\nok", None]  # then the server hangs up
    second = [OK_HEAD + b"content-length: 3\r\n\r\nnew"]

    async def scenario(pool):
        response = await pool.request("POST", "/chat/completions", BODY)
        assert await response.aread() == b"ok"
        await response.aclose()
        await asyncio.sleep(0.1)  # the close reaches us while the connection sits in the pool
        again = await pool.request("POST", "/chat/completions", BODY)
        body = await again.aread()
        await again.aclose()
        return body

    body, connections = _run([first, second], scenario)
    assert body == b"new"
    assert len(connections) == 2
