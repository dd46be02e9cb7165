"""Cancelling work that runs httpx leaves its connection pool clean (server.scoped_tasks).

A native ``Task.cancel()`` that lands while httpcore closes a finished response, or between
connecting and sending, strands a pooled connection (encode/httpcore#1115). These tests cancel
real httpx exchanges with a loopback server at every event-loop step of their life, through the
gateway's own code paths (a candidate stream, a reward call), and check that afterwards every
pooled connection is idle and the pool holds no request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx
import pytest

from reward.clients import VLLMRewardClient, WorkerRewardClient
from server.candidate import CandidateBuilder
from server.scoped_tasks import ScopedTask, cancel_all, run_scoped
from server.upstream import UpstreamClient

T = TypeVar("T")
MIN_STEPS = 48  # an exchange with the loopback server below ends within ~20 steps here
MAX_STEPS = 1000  # a slow machine may need more: sweep on until the work outlives no cancel
ROUNDS = 3

CANDIDATE = {"model": "m", "messages": [], "stream": True}  # one candidate's request body
_CHUNK = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
SSE = f"data: {json.dumps(_CHUNK)}\n\ndata: [DONE]\n\n".encode()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 keep-alive: SSE for chat completions, a score per response for rewards."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            request = json.loads(await reader.readexactly(length)) if length else {}
            if b"/chat/completions" in head:
                body, kind = SSE, b"text/event-stream"
            elif b"/classify" in head:
                body, kind = b'{"data": [{"probs": [0.5]}]}', b"application/json"
            else:
                scores = [0.5] * len(request.get("responses", []))
                body, kind = json.dumps({"scores": scores}).encode(), b"application/json"
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                % (kind, len(body), body)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _pool(client: httpx.AsyncClient) -> Any:
    return client._transport._pool  # type: ignore[attr-defined]  # read-only inspection


def _stranded(client: httpx.AsyncClient) -> list[str]:
    pool = _pool(client)
    busy = [repr(c) for c in pool.connections if not c.is_idle()]
    return busy + ([f"{len(pool._requests)} pool requests"] if pool._requests else [])


async def _sweep(
    start: Callable[[], Any], cancel: Callable[[Any], Awaitable[asyncio.Task[Any]]]
) -> tuple[int, int]:
    """Start the work, let it run ``steps`` event-loop steps, cancel it; for every step count
    from 0 until the work has finished on its own 3 times running (at least MIN_STEPS).
    Returns (cancelled, finished) counts: both must be non-zero for the sweep to have crossed
    the whole exchange, its close included."""
    cancelled = finished = 0
    for _ in range(ROUNDS):
        in_a_row = 0
        for steps in range(MAX_STEPS):
            if steps >= MIN_STEPS and in_a_row >= 3:
                break
            work = start()
            for _ in range(steps):
                await asyncio.sleep(0)
            task = await cancel(work)
            if task.cancelled():
                cancelled += 1
                in_a_row = 0
            else:
                task.result()  # no error of its own
                finished += 1
                in_a_row += 1
    await asyncio.sleep(0.05)  # anything still closing in the background gets its chance
    return cancelled, finished


async def _with_server(body: Callable[[str], Awaitable[T]]) -> T:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    try:
        return await body(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    finally:
        server.close()


def _upstream_client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url + "/v1", limits=httpx.Limits(max_connections=None))


async def _cancel_natively(task: asyncio.Task[Any]) -> asyncio.Task[Any]:
    """As the request's own cancellers do (a client that hangs up, a deadline)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return task


async def _cancel_scoped(scoped: ScopedTask[Any]) -> asyncio.Task[Any]:
    """As the sampler's cancel_in_flight does."""
    await cancel_all([scoped])
    return scoped.task


def test_candidates_cancelled_at_any_step_leave_the_httpx_pool_clean():
    """The sampler's path: UpstreamClient.generate in a ScopedTask, stopped by cancel_all."""

    async def main(url: str) -> None:
        client = _upstream_client(url)
        upstream = UpstreamClient(client, retries=0, backoff=0.0)

        async with client:
            counts = await _sweep(
                lambda: ScopedTask(upstream.generate(CANDIDATE, CandidateBuilder(0))),
                _cancel_scoped,
            )
            assert all(counts), counts
            assert _stranded(client) == []

    asyncio.run(_with_server(main))


@pytest.mark.parametrize("backend", [WorkerRewardClient, VLLMRewardClient])
def test_reward_calls_of_a_cancelled_request_leave_the_reward_pool_clean(backend):
    """The sampler's scoring call when the request's task is cancelled natively, as a client
    disconnect or the request deadline does: the HTTP reward clients run each exchange in a
    task group of their own. Their pools are bounded (64 connections), so a stranded connection
    per unlucky cancellation would end in a reward outage."""

    async def main(url: str) -> None:
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None))
        scorer = backend(url, client=client)

        async def request() -> list[float]:
            return await scorer.score([{"role": "user", "content": "q"}], ["a", "b"])

        async with client:
            counts = await _sweep(lambda: asyncio.create_task(request()), _cancel_natively)
            assert all(counts), counts
            assert _stranded(client) == []

    asyncio.run(_with_server(main))


def test_candidates_on_the_lean_client_may_be_cancelled_natively():
    """Why the sampler skips the cancel scope on the lean transport: its cleanup never waits,
    so a native cancel at any step leaves no connection open or half-used."""
    from server.lean_http import LeanPool

    async def main(url: str) -> None:
        lean = LeanPool(url + "/v1", timeout=5.0)
        client = httpx.AsyncClient(base_url=url + "/v1")
        upstream = UpstreamClient(client, retries=0, backoff=0.0, lean=lean)
        assert not upstream.needs_scoped_cancel

        async with client:
            counts = await _sweep(
                lambda: asyncio.create_task(upstream.generate(CANDIDATE, CandidateBuilder(0))),
                _cancel_natively,
            )
            assert all(counts), counts
            assert all(conn.idle for conn in lean.connections()), lean.connections()
            await lean.aclose()

    asyncio.run(_with_server(main))


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_passthrough_cancelled_by_a_leaving_client_leaves_the_pool_clean(stream):
    """Mode off on the httpx transport: UpstreamClient.send, then reading and closing the
    response with UpstreamClient.close, in a task cancelled natively at any step."""

    async def main(url: str) -> None:
        client = _upstream_client(url)
        upstream = UpstreamClient(client, retries=0, backoff=0.0)

        async def request() -> bytes:
            built = client.build_request("POST", "/chat/completions", json={"model": "m"})
            response = await upstream.send(built, stream=stream)
            try:
                if not stream:
                    return response.content
                return b"".join([chunk async for chunk in upstream.raw_chunks(response)])
            finally:
                await upstream.close(response)

        async with client:
            counts = await _sweep(lambda: asyncio.create_task(request()), _cancel_natively)
            assert all(counts), counts
            assert _stranded(client) == []

    asyncio.run(_with_server(main))


def test_native_cancellation_strands_connections_on_this_httpcore():
    """The reason for server.scoped_tasks, checked on the installed httpcore: the same sweep
    with a native Task.cancel() strands connections. Skips once httpcore fixes it (then the
    scoped cancellation above is merely harmless)."""

    async def main(url: str) -> list[str]:
        client = _upstream_client(url)
        upstream = UpstreamClient(client, retries=0, backoff=0.0)

        async with client:
            await _sweep(
                lambda: asyncio.create_task(upstream.generate(CANDIDATE, CandidateBuilder(0))),
                _cancel_natively,
            )
            return _stranded(client)

    stranded = asyncio.run(_with_server(main))
    if not stranded:
        pytest.skip("this httpcore no longer strands connections on a native cancel")
    assert any("ACTIVE" in s or "NEW" in s for s in stranded), stranded


# -- the helpers' own contract -------------------------------------------------------------------
def test_scoped_task_reports_cancellation_result_or_error():
    async def main() -> None:
        forever = ScopedTask(asyncio.sleep(60))
        quick = ScopedTask(asyncio.sleep(0, result="done"))
        await asyncio.sleep(0.01)

        async def boom() -> None:
            raise ValueError("own error")

        failing = ScopedTask(boom())
        await cancel_all([forever, quick, failing])
        assert forever.task.cancelled()
        assert quick.task.result() == "done"
        assert isinstance(failing.task.exception(), ValueError)

    asyncio.run(main())


def test_scoped_cancellation_waits_for_a_shielded_cleanup():
    """What a native cancel would cut short: cleanup in a shielded scope runs to its end."""
    cleaned: list[str] = []

    async def work() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            with anyio.CancelScope(shield=True):
                await asyncio.sleep(0.02)
                cleaned.append("closed")

    async def main() -> None:
        scoped = ScopedTask(work())
        await asyncio.sleep(0.01)
        scoped.cancel()
        await asyncio.sleep(0.005)
        scoped.cancel()  # again, while it is cleaning up: held off by the shield
        await cancel_all([scoped])
        assert scoped.task.cancelled() and cleaned == ["closed"]

    asyncio.run(main())


def test_cancel_all_holds_the_callers_cancellation_until_the_tasks_end():
    """A request cancelled while it reaps its candidates still reaps them all first."""
    order: list[str] = []

    async def slow_cleanup() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            with anyio.CancelScope(shield=True):
                await asyncio.sleep(0.05)
            order.append("task ended")

    async def caller(scoped: ScopedTask[None]) -> None:
        try:
            await cancel_all([scoped])
        finally:
            order.append("caller ended")

    async def main() -> None:
        scoped = ScopedTask(slow_cleanup())
        await asyncio.sleep(0.01)
        reaper = asyncio.create_task(caller(scoped))
        await asyncio.sleep(0.01)
        reaper.cancel()
        await asyncio.gather(reaper, return_exceptions=True)
        assert reaper.cancelled()
        assert order == ["task ended", "caller ended"]

    asyncio.run(main())


def test_run_scoped_returns_the_result_or_passes_the_cancellation_on():
    async def main() -> None:
        assert await run_scoped(asyncio.sleep(0, result=7)) == 7
        started = asyncio.Event()
        ended: list[str] = []

        async def work() -> None:
            started.set()
            try:
                await asyncio.sleep(60)
            finally:
                ended.append("work")

        caller = asyncio.create_task(run_scoped(work()))
        await started.wait()
        caller.cancel()
        await asyncio.gather(caller, return_exceptions=True)
        assert caller.cancelled() and ended == ["work"]  # not left running

    asyncio.run(main())


def test_run_scoped_under_an_anyio_deadline_times_out_and_reaps_the_work():
    """The sampler's reward timeout: anyio re-delivers a scope's cancellation at every step,
    which must neither spin the reaping nor leave the work running."""
    ended: list[str] = []

    async def work() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            ended.append("work")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.05):
                await run_scoped(work())
        assert ended == ["work"] and loop.time() - started < 5.0

    asyncio.run(asyncio.wait_for(main(), 10))
