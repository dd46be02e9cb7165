"""The chat-completions logic: parse, plan, then pass through (mode off) or sample and choose.

Every path ends in exactly one call to :meth:`RequestRecord.finish`, which is where the request
counters, the latency histogram and the in-flight gauge are kept honest (also for streams, which
finish long after the handler returned, and for clients that hang up).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from server.auth import check_api_key
from server.chat.protocol import (
    ChatCompletionRequest,
    candidate_body,
    completion_body,
    completion_chunks,
)
from server.config import Settings
from server.control import SamplingPlan, is_greedy, resolve_plan
from server.errors import (
    GatewayError,
    InvalidRequestError,
    NoCandidateError,
    PayloadTooLargeError,
    UpstreamTimeoutError,
)
from server.metrics import GatewayMetrics
from server.sampling import SamplingOutcome
from server.sse import DONE, KEEPALIVE, EventStreamResponse, sse_data
from server.state import GatewayState
from server.upstream import UpstreamFailure

__all__ = ["create_chat_completion", "handle_chat", "request_id_for"]

T = TypeVar("T")
REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # cheap pre-filter
CLIENT_CLOSED = 499  # nginx's convention; the client never sees it
WATCH_AFTER = 0.1  # seconds of work before a client disconnect is watched for (see below)
NO_HEADERS: Mapping[str, str] = {}  # no X-Pandora-* header was sent


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def _valid_request_id(given: str | None) -> str:
    if given and REQUEST_ID.fullmatch(given):
        return given
    return os.urandom(16).hex()  # as unique as uuid4().hex, at a tenth of its cost


def request_id_for(request: Request) -> str:
    return _valid_request_id(request.headers.get("x-request-id"))


class RequestRecord:
    """Per-request metrics bookkeeping, finished exactly once."""

    __slots__ = ("_finished", "metrics", "mode", "started")

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self.started = time.perf_counter()
        self.mode = "unknown"
        self._finished = False
        metrics.requests_in_flight += 1

    def finish(self, status: int) -> None:
        if self._finished:
            return
        self._finished = True
        self.metrics.requests_in_flight -= 1
        self.metrics.request_finished(self.mode, status, time.perf_counter() - self.started)


class RawResponse(Response):
    """A complete response with a ready raw header list: what Starlette's ``Response`` sends,
    without its header building and checks on every proxied request (a ``Response`` subclass,
    so FastAPI's route sends it as it is)."""

    def __init__(  # not calling Response.__init__: that is the cost saved
        self, body: bytes, status_code: int, media_type: str, headers: Mapping[str, str]
    ) -> None:
        self.body = body
        self.status_code = status_code
        self.background = None
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", media_type.encode("latin-1")),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": self.body})


def _scan_headers(scope: Scope) -> tuple[str | None, bool, int]:
    """One pass over the raw headers: the client's X-Request-Id, whether any X-Pandora-*
    header was sent (only then is a case-insensitive header map worth building) and the
    declared Content-Length (-1 if none or unreadable)."""
    request_id = None
    pandora = False
    length = -1
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            if request_id is None:
                request_id = value.decode("latin-1")
        elif name[:10] == b"x-pandora-":
            pandora = True
        elif name == b"content-length":
            with contextlib.suppress(ValueError):
                length = max(length, int(value))
    return request_id, pandora, length


def _too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"request body exceeds the limit of {limit} bytes", code="body_too_large"
    )


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, refused with a 413 past ``limit`` bytes (also when it arrives chunked,
    with no Content-Length), so an oversized body is never buffered whole."""
    message = await receive()
    if message["type"] != "http.request":
        raise ClientDisconnect()
    body = message.get("body", b"")
    if len(body) > limit:
        raise _too_large(limit)
    if not message.get("more_body", False):
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def create_chat_completion(request: Request, state: GatewayState) -> Response:
    """The schema route's entry; the fast path (``server.chat.fast_path``) calls
    :func:`handle_chat` with the same ASGI scope and receive."""
    return await handle_chat(state, request.scope, request.receive)


async def handle_chat(state: GatewayState, scope: Scope, receive: Receive) -> Response:
    """Answer one ``POST /v1/chat/completions`` (the body not yet read) with a response to send."""
    record = RequestRecord(state.metrics)
    given_id, pandora_headers, declared_length = _scan_headers(scope)
    headers = {"X-Request-Id": _valid_request_id(given_id)}
    limit = state.settings.max_body_bytes
    try:
        if declared_length > limit:
            raise _too_large(limit)
        app_state = scope["app"].state
        if app_state.api_keys:  # inside the record, so rejected keys count as 401
            check_api_key(Request(scope))
        raw_bytes = await _read_body(receive, limit)
        data = _parse_json(raw_bytes)
        chat = _validate(data)
        control = data.get("pandora")
        greedy = is_greedy(data)
        if pandora_headers or control is not None:
            headers_map = Headers(scope=scope) if pandora_headers else NO_HEADERS
            plan = resolve_plan(headers_map, control, state.settings, n=chat.n, greedy=greedy)
        else:
            plan = _default_plan(app_state, state.settings, chat.n, greedy)
        record.mode = plan.mode
        headers["X-Pandora-Mode"] = plan.mode
        if plan.mode == "off":
            return await _passthrough(receive, state, record, raw_bytes, data, chat, headers)
        if chat.stream:
            return await _sample_streaming(receive, state, record, data, chat, plan, headers)
        outcome = await _until_disconnect(receive, _run_sampler(state, data, chat, plan))
        _record_outcome(state, plan, outcome)
        body = completion_body(
            outcome,
            completion_id=_completion_id(),
            model=chat.model,
            mode=plan.mode,
            task=plan.task,
        )
        record.finish(200)
        return JSONResponse(body, headers={**headers, **_outcome_headers(outcome)})
    except GatewayError as error:
        record.finish(error.status_code)
        return JSONResponse(error.to_dict(), status_code=error.status_code, headers=headers)
    except (ClientGone, ClientDisconnect):
        record.finish(CLIENT_CLOSED)
        return Response(status_code=CLIENT_CLOSED)
    except BaseException:
        record.finish(500)
        raise


def _default_plan(app_state: Any, settings: Settings, n: int, greedy: bool) -> SamplingPlan:
    """The plan of a request with no ``X-Pandora-*`` header and no ``pandora`` object: it
    depends only on the app's settings, ``n`` and greedy decoding, so it is resolved once per
    app and (n, greedy)."""
    plans: dict[tuple[int, bool], SamplingPlan] | None = getattr(app_state, "default_plans", None)
    if plans is None:
        plans = app_state.default_plans = {}
    plan = plans.get((n, greedy))
    if plan is None:
        plan = resolve_plan(NO_HEADERS, None, settings, n=n, greedy=greedy)
        if len(plans) < 64:
            plans[n, greedy] = plan
    return plan


# -- parsing ------------------------------------------------------------------------------------
def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]!r} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON value")


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)


def _parse_json(raw: bytes) -> dict[str, Any]:
    """Strict JSON: Python's parser also takes NaN/Infinity (and 1e400 as inf), which no
    upstream accepts and which cannot be re-encoded; deep nesting exhausts the recursion limit.
    Both are the client's error (400), never a 500."""
    try:
        # json.loads(raw, ...) would build a new decoder per call; decode as it does
        data = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except UnicodeDecodeError:
        raise InvalidRequestError("request body is not valid UTF-8") from None
    except ValueError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequestError("request body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("request body must be a JSON object")
    if LONE_SURROGATE_ESCAPE.search(raw):
        # Valid JSON can spell invalid Unicode (an unpaired "\\ud800" escape); such a string
        # cannot be encoded for the upstream or the response, so refuse it here (not a 500).
        try:
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise InvalidRequestError(
                "request body is not valid Unicode: unpaired UTF-16 surrogate escape"
            ) from None
    return data


def _validate(data: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise InvalidRequestError(f"{param}: {first['msg']}", param=param) from None


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


# -- sampled modes ------------------------------------------------------------------------------
def _run_sampler(
    state: GatewayState, data: dict[str, Any], chat: ChatCompletionRequest, plan: SamplingPlan
) -> Awaitable[SamplingOutcome]:
    messages = [m.model_dump(exclude_none=True) for m in chat.messages]
    return state.sampler.run(
        messages, candidate_body(data), plan, deadline=state.settings.request_timeout
    )


def _outcome_headers(outcome: SamplingOutcome) -> dict[str, str]:
    headers = {
        "X-Pandora-Samples": str(len(outcome.scored)),
        "X-Pandora-Stop-Reason": outcome.stop_reason,
        "X-Pandora-Cancelled": str(outcome.cancelled),
    }
    if outcome.best_reward is not None:
        headers["X-Pandora-Reward"] = f"{outcome.best_reward:.6g}"
    return headers


def _record_outcome(state: GatewayState, plan: SamplingPlan, outcome: SamplingOutcome) -> None:
    metrics = state.metrics
    used = len(outcome.scored) + outcome.cancelled
    metrics.samples_per_request.labels(mode=plan.mode).observe(len(outcome.scored))
    saved = max(0, state.settings.effective_baseline_n - used)
    metrics.samples_saved.inc(saved)
    metrics.task_outcome(plan.task, plan.mode, generations=used, saved=saved)
    metrics.add_tokens(outcome.prompt_tokens, outcome.completion_tokens)
    metrics.stop_reason(outcome.stop_reason)
    if outcome.best_reward is not None:
        metrics.best_reward.observe(outcome.best_reward)


async def _sample_streaming(
    receive: Receive,
    state: GatewayState,
    record: RequestRecord,
    data: dict[str, Any],
    chat: ChatCompletionRequest,
    plan: SamplingPlan,
    headers: dict[str, str],
) -> Response:
    """Wait one keep-alive period for the result: a fast failure still gets its real status
    and a fast success gets the ``X-Pandora-*`` headers; after that, stream keep-alives."""
    task = asyncio.create_task(_run_sampler(state, data, chat, plan))
    keepalive = state.settings.keepalive_interval
    try:
        await _until_disconnect(receive, asyncio.wait({task}, timeout=keepalive))
    except BaseException:
        await _cancel(task)
        raise
    if task.done():
        error = task.exception()
        if error is not None:
            raise error
        headers = {**headers, **_outcome_headers(task.result())}

    async def events() -> AsyncIterator[bytes]:
        status = CLIENT_CLOSED
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=keepalive)
                if not task.done():
                    yield KEEPALIVE
            try:
                outcome = task.result()
            except GatewayError as error:
                status = error.status_code
                yield sse_data(error.to_dict())
                yield DONE
                return
            _record_outcome(state, plan, outcome)
            for chunk in completion_chunks(
                outcome,
                completion_id=_completion_id(),
                model=chat.model,
                mode=plan.mode,
                include_usage=chat.include_usage,
                task=plan.task,
            ):
                yield sse_data(chunk)
            yield DONE
            status = 200
        finally:
            await _cancel(task)
            record.finish(status)

    return EventStreamResponse(events(), headers=headers)


# -- mode off: a plain proxy --------------------------------------------------------------------
async def _passthrough(
    receive: Receive,
    state: GatewayState,
    record: RequestRecord,
    raw_bytes: bytes,
    data: dict[str, Any],
    chat: ChatCompletionRequest,
    headers: dict[str, str],
) -> Response:
    upstream = state.upstream
    if "pandora" in data:
        raw_bytes = json.dumps({k: v for k, v in data.items() if k != "pandora"}).encode()
    try:
        response = await _until_disconnect(
            receive, upstream.passthrough(raw_bytes, stream=chat.stream), discard=upstream.close
        )
    except UpstreamFailure as failure:
        state.metrics.upstream_error(failure.kind)
        error_cls = UpstreamTimeoutError if failure.kind == "timeout" else NoCandidateError
        raise error_cls(failure.message) from None
    media_type = response.headers.get("content-type", "application/json")
    if not chat.stream or response.status_code != 200:
        content = upstream.redact(await response.aread())  # no upstream key echoed back
        await upstream.close(response)
        record.finish(response.status_code)
        return RawResponse(content, response.status_code, media_type, headers)

    async def relay() -> AsyncIterator[bytes]:
        status = CLIENT_CLOSED
        try:
            async for chunk in upstream.raw_chunks(response):
                yield upstream.redact(chunk)  # (a key split across two reads is not caught)
            status = 200
        except httpx.HTTPError:
            state.metrics.upstream_error("protocol")
            status = 502
        finally:
            await upstream.close(response)  # the writer may be cancelled mid-close
            record.finish(status)

    return EventStreamResponse(relay(), headers=headers, media_type=media_type)


# -- cancellation helpers -----------------------------------------------------------------------
async def _until_disconnect(receive: Receive, work: Awaitable[T], *, discard=None) -> T:
    """Await ``work`` unless the client disconnects first; then cancel it and raise ClientGone.

    (vLLM's ``with_cancellation``: nothing keeps running for a client that left.) The work runs
    in the request's own task. A watcher task that waits for ``http.disconnect`` and cancels it
    is started only once the work has taken WATCH_AFTER seconds: a task per request was the
    largest single CPU cost of a fast pass-through, and a client that leaves earlier is still
    noticed then (uvicorn's ``receive`` reports a past disconnect at once).
    """
    current = asyncio.current_task()
    assert current is not None
    loop = asyncio.get_running_loop()
    gone = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        current.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER, start_watching)
    try:
        result = await work
    except BaseException:
        if not gone:
            raise  # not the watcher's doing (e.g. server shutdown): not ours to absorb
        current.uncancel()  # the work may have turned the cancellation into its own error
        raise ClientGone() from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
    if gone:  # the work swallowed the cancellation, or finished just before it landed
        current.uncancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)  # a cancellation still pending is delivered (and dropped) here
        if discard is not None:
            await discard(result)
        raise ClientGone()
    return result


async def _cancel(task: asyncio.Future[Any]) -> None:
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
