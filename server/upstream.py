"""The one place the gateway talks to the generation upstream (an OpenAI-compatible server).

The seam is an ``httpx.AsyncClient`` handed in by the app factory (tests give it a client for a
fake server; the embedded default gives it an in-process transport). Each candidate is one
streamed ``n=1`` request, so cancelling the task closes the stream and vLLM aborts the
generation. Network failures are translated into :class:`UpstreamFailure` here and nowhere else.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from server.candidate import Candidate, CandidateBuilder
from server.lean_http import LeanPool, LeanResponse, LeanTransportError
from server.scoped_tasks import ScopedTask, cancel_all, run_scoped

__all__ = ["UpstreamClient", "UpstreamFailure"]

MAX_RETRY_DELAY = 10.0
REDACTED = b"[redacted]"


class UpstreamFailure(Exception):
    """One failed upstream attempt. ``kind`` is one of metrics.UPSTREAM_ERROR_KINDS."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.kind != "client_error"


@dataclass(frozen=True)
class RetryPolicy:
    retries: int
    backoff: float

    def delay(self, attempt: int, failure: UpstreamFailure) -> float:
        if failure.retry_after is not None:
            return min(failure.retry_after, MAX_RETRY_DELAY)
        base = self.backoff * (2**attempt)
        return min(base * (0.5 + random.random() / 2), MAX_RETRY_DELAY)


def _status_failure(status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamFailure:
    message = _upstream_message(body) or f"upstream answered HTTP {status}"
    if status == 429:
        return UpstreamFailure(
            "rate_limited", message, status=status, retry_after=_retry_after(headers)
        )
    if status >= 500:
        return UpstreamFailure("server_error", message, status=status)
    return UpstreamFailure("client_error", message, status=status)


def _upstream_message(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text[:500] or None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:2000]
        if isinstance(data.get("detail"), str):
            return data["detail"][:2000]
    return None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except ValueError:
        return None


def _transport_failure(exc: httpx.HTTPError) -> UpstreamFailure:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamFailure("timeout", f"upstream timed out ({type(exc).__name__})")
    if isinstance(exc, httpx.ConnectError | httpx.NetworkError):
        return UpstreamFailure("connection", f"upstream connection failed ({type(exc).__name__})")
    return UpstreamFailure("protocol", f"upstream stream broken ({type(exc).__name__})")


class UpstreamClient:
    """Generates candidates and proxies pass-through requests over one pooled client."""

    def __init__(
        self,
        client: httpx.AsyncClient | Sequence[httpx.AsyncClient],
        *,
        retries: int,
        backoff: float,
        on_attempt: Callable[[float, UpstreamFailure | None], None] | None = None,
        lean: LeanPool | None = None,
    ) -> None:
        self.lean = lean  # the pass-through's lean client (remote upstreams), else httpx
        # Several pools used in turn: httpcore's pool scans all of its connections (quadratically
        # when idle) on every request, so many small pools cost far less CPU than one big one.
        self.clients = [client] if isinstance(client, httpx.AsyncClient) else list(client)
        self.client = self.clients[0]
        self._turn = itertools.cycle(self.clients)
        self.retry = RetryPolicy(retries, backoff)
        self._on_attempt = on_attempt or (lambda seconds, failure: None)
        # The upstream key must never reach a client or a log, even when the upstream echoes
        # it back in an error ("Incorrect API key provided: sk-..."): it is cut out of every
        # upstream message and pass-through body.
        self._secrets = sorted(
            {
                token.encode()
                for c in self.clients
                if len(token := c.headers.get("authorization", "").partition(" ")[2]) >= 4
            },
            key=len,
            reverse=True,
        )

    @property
    def needs_scoped_cancel(self) -> bool:
        """True when candidates stream over httpx, whose connection pool a native cancel can
        corrupt (server.scoped_tasks); the lean client's cleanup never waits, so a native
        cancel is safe there (tests/test_scoped_tasks.py sweeps both)."""
        return self.lean is None

    def redact(self, data: bytes) -> bytes:
        for secret in self._secrets:
            data = data.replace(secret, REDACTED)
        return data

    async def generate(self, body: dict[str, Any], builder: CandidateBuilder) -> Candidate:
        """One candidate, retried on retryable failures; raises the last UpstreamFailure."""
        attempt = 0
        while True:
            builder.reset()
            started = time.perf_counter()
            try:
                await self._stream_once(body, builder)
            except UpstreamFailure as failure:
                if self._secrets:
                    failure.message = self.redact(failure.message.encode()).decode()
                    failure.args = (failure.message,)
                self._on_attempt(time.perf_counter() - started, failure)
                if not failure.retryable or attempt >= self.retry.retries:
                    raise
                await asyncio.sleep(self.retry.delay(attempt, failure))
                attempt += 1
                continue
            self._on_attempt(time.perf_counter() - started, None)
            return builder.build()

    async def _stream_once(self, body: dict[str, Any], builder: CandidateBuilder) -> None:
        if self.lean is not None:
            await self._stream_once_lean(body, builder)
            return
        try:
            client = next(self._turn)
            async with client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code != 200:
                    raise _status_failure(
                        response.status_code, await response.aread(), response.headers
                    )
                done = await _consume_sse(response.aiter_lines(), builder)
        except httpx.HTTPError as exc:
            raise _transport_failure(exc) from None
        if not done and builder.finish_reason is None:
            raise UpstreamFailure("protocol", "upstream stream ended before the completion did")

    async def _stream_once_lean(self, body: dict[str, Any], builder: CandidateBuilder) -> None:
        """The same exchange on the lean client (remote upstreams): ~3x less CPU than httpx.
        Cancelling closes the connection mid-body, which makes vLLM abort the generation."""
        assert self.lean is not None
        try:
            response = await self.lean.request("POST", "/chat/completions", _dumps(body))
        except LeanTransportError as exc:
            raise UpstreamFailure(exc.kind, str(exc)) from None
        try:
            if response.status_code != 200:
                raise _status_failure(
                    response.status_code, await response.aread(), response.headers
                )
            done = await _consume_sse(_lines(response.aiter_raw()), builder)
        except LeanTransportError as exc:
            raise UpstreamFailure(exc.kind, str(exc)) from None
        finally:
            await response.aclose()
        if not done and builder.finish_reason is None:
            raise UpstreamFailure("protocol", "upstream stream ended before the completion did")

    # -- pass-through (mode off) and the small endpoints ---------------------------------
    async def send(self, request: httpx.Request, *, stream: bool) -> httpx.Response:
        """Send a prepared request; transport errors become UpstreamFailure.

        The exchange runs in a :class:`ScopedTask`, so a caller cancelled natively (a client
        that leaves) cancels it through a scope: a native cancel landing mid-connect or
        mid-close would strand a pooled connection (server.scoped_tasks). A streamed response
        that arrived just as the caller was cancelled is closed, not dropped open.
        """
        scoped = ScopedTask(next(self._turn).send(request, stream=stream))
        try:
            return await asyncio.shield(scoped.task)
        except httpx.HTTPError as exc:
            raise _transport_failure(exc) from None
        except asyncio.CancelledError:
            await cancel_all([scoped])
            if not scoped.task.cancelled() and scoped.task.exception() is None:
                await self.close(scoped.task.result())
            raise

    @staticmethod
    async def raw_chunks(response: httpx.Response | LeanResponse) -> AsyncIterator[bytes]:
        """A streamed body as it arrives, left open at its end for :meth:`close`.

        httpx's ``aiter_raw`` closes the response itself when the body ends, in the reader's
        task, where a native cancel (the client leaving) would strand the connection; its
        ``stream`` is the same bytes without that close. Errors are ``httpx.HTTPError``s.
        """
        chunks = response.stream if isinstance(response, httpx.Response) else response.aiter_raw()
        async for chunk in chunks:  # type: ignore[union-attr]
            yield chunk

    @staticmethod
    async def close(response: httpx.Response | LeanResponse) -> None:
        """Close a response whatever happens to the caller meanwhile (see :meth:`send`)."""
        if isinstance(response, httpx.Response):
            await run_scoped(response.aclose())
        else:
            await response.aclose()  # the lean client's close does not wait on anything

    async def passthrough(self, body: bytes, *, stream: bool) -> httpx.Response | LeanResponse:
        """POST ``body`` to ``/chat/completions`` unchanged (mode off). The answer has
        ``status_code``, ``headers.get``, ``aread``, ``aiter_raw`` and ``aclose``; body errors
        are ``httpx.TransportError``s."""
        if self.lean is None:
            request = self.client.build_request(
                "POST",
                "/chat/completions",
                content=body,
                headers={"content-type": "application/json"},
            )
            return await self.send(request, stream=stream)
        try:
            return await self.lean.request("POST", "/chat/completions", body)
        except LeanTransportError as exc:
            raise UpstreamFailure(exc.kind, str(exc)) from None

    async def models(self) -> tuple[int, bytes, str]:
        response = await self.send(self.client.build_request("GET", "/models"), stream=False)
        return (
            response.status_code,
            self.redact(response.content),
            response.headers.get("content-type", "application/json"),
        )

    async def ready(self) -> bool:
        try:
            response = await self.client.get("/models", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """Split a raw body into text lines (what httpx's ``aiter_lines`` does)."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if buffer:
        yield buffer.decode("utf-8", "replace")


async def _consume_sse(lines: AsyncIterator[str], builder: CandidateBuilder) -> bool:
    """Feed every ``data:`` event to the builder; True when ``[DONE]`` arrived.

    Reads to the end of the body even after ``[DONE]`` so the connection goes back to the pool.
    """
    done = False
    async for line in lines:
        if done or not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise UpstreamFailure("protocol", "upstream sent invalid JSON in a chunk") from None
        if not isinstance(chunk, dict):
            raise UpstreamFailure("protocol", "upstream sent a chunk that is not an object")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise UpstreamFailure("server_error", f"upstream error mid-stream: {message}")
        builder.feed(chunk)
    return done
