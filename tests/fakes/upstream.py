"""A fake vLLM: an OpenAI-compatible chat server over real HTTP/1.1 on 127.0.0.1.

It runs its own asyncio loop in a background thread (so sync tests, the gateway's thread and
the benchmark can all use it) and is written on raw asyncio streams so it can misbehave the way
real servers do: reset a connection mid-stream, truncate the SSE stream, send invalid JSON,
hang, answer 429 with ``Retry-After``. It notices a client hanging up at once, so tests can
assert that the gateway left nothing running: ``active_streams`` and ``open_connections``.

Content is deterministic: every completion starts with ``"answer <quality>"`` where the quality
in [0, 1) is drawn from the request's ``seed`` (or a counter), and :class:`FakeReward` reads it
back, so tests know which candidate is best.

Example::

    with FakeUpstream(tokens=8, token_delay=0.001) as upstream:
        upstream.inject(Fault("status", status=500), times=2)
        client = httpx.Client(base_url=upstream.base_url)
        ...
        assert upstream.wait_idle()
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["FakeUpstream", "Fault", "quality_for_seed"]

FaultKind = Literal[
    "status",  # an HTTP error answer (500, 429 + Retry-After, 400, ...)
    "reset",  # a few chunks, then the TCP connection is aborted (RST)
    "truncate",  # a few chunks, then the stream ends cleanly without finish_reason or [DONE]
    "invalid_json",  # a chunk whose data is not JSON
    "mid_stream_error",  # vLLM-style `data: {"error": ...}` in the stream
    "hang",  # headers, then silence until the client leaves
    "slow_first_byte",  # sleep `delay` seconds before answering at all
    "close",  # close the connection without any answer
]


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    status: int = 500
    retry_after: float | None = None
    message: str = "fake upstream failure"
    delay: float = 0.0


def quality_for_seed(seed: int) -> float:
    return round(random.Random(seed).random(), 6)


class FakeUpstream:
    """See the module docstring. All counters are safe to read from any thread."""

    def __init__(
        self,
        *,
        tokens: int = 8,
        token_delay: float = 0.0,
        first_token_delay: float = 0.0,
        model: str = "fake-model",
        content: Callable[[dict[str, Any], int], str] | None = None,
        token_delay_rule: Callable[[int, dict[str, Any]], float] | None = None,
    ) -> None:
        self.tokens = tokens
        self.token_delay = token_delay
        self.first_token_delay = first_token_delay
        self.model = model
        self.content = content
        # (request index, body) -> per-token delay for that request (overrides token_delay)
        self.token_delay_rule = token_delay_rule
        self.fault_rule: Callable[[int, dict[str, Any]], Fault | None] | None = None
        self.requests: list[dict[str, Any]] = []  # chat bodies received, in order
        self.request_headers: list[dict[str, str]] = []  # their headers (lower-case names)
        self.request_count = 0
        self.open_connections = 0
        self.active_streams = 0  # chat responses still being written
        self.completed_streams = 0
        self.aborted_streams = 0  # the client hung up before the end
        self.max_active_streams = 0
        self._faults: deque[Fault] = deque()
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._leftover: dict[int, bytes] = {}
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- control ------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def inject(self, fault: Fault, times: int = 1) -> None:
        """The next ``times`` chat requests misbehave as ``fault``."""
        with self._lock:
            self._faults.extend([fault] * times)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
        self.fault_rule = None

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """True once no chat stream is open (the gateway cancelled or finished everything)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.active_streams == 0:
                return True
            time.sleep(0.01)
        return self.active_streams == 0

    def wait_connections_closed(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.open_connections == 0:
                return True
            time.sleep(0.01)
        return self.open_connections == 0

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> FakeUpstream:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-upstream", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP -------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        self._writers.add(writer)
        try:
            while True:
                request = await _read_request(reader, self._leftover.pop(id(writer), b""))
                if request is None:
                    return
                method, path, headers, body = request
                if path.endswith("/chat/completions"):
                    self.request_headers.append(headers)
                keep_open = await self._route(method, path, body, reader, writer)
                if not keep_open:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            self._writers.discard(writer)
            self.open_connections -= 1
            self._leftover.pop(id(writer), None)
            writer.close()

    async def _route(
        self,
        method: str,
        path: str,
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if method == "GET" and path.rstrip("/") == "/v1/models":
            payload = {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}],
            }
            await _send_json(writer, 200, payload)
            return True
        if method == "POST" and path == "/v1/chat/completions":
            try:
                data = json.loads(body)
            except ValueError:
                await _send_json(writer, 400, _error("invalid JSON body"))
                return True
            return await self._chat(data, reader, writer)
        await _send_json(writer, 404, _error(f"no route {method} {path}"))
        return True

    def _next_fault(self, index: int, data: dict[str, Any]) -> Fault | None:
        with self._lock:
            if self._faults:
                return self._faults.popleft()
        return self.fault_rule(index, data) if self.fault_rule else None

    async def _chat(
        self, data: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        index = next(self._counter)
        self.request_count += 1
        self.requests.append(data)
        fault = self._next_fault(index, data)
        if fault is not None and fault.kind == "slow_first_byte":
            await asyncio.sleep(fault.delay)
            fault = None
        if fault is not None and fault.kind == "close":
            return False
        if fault is not None and fault.kind == "status":
            extra = {"retry-after": f"{fault.retry_after:g}"} if fault.retry_after else {}
            await _send_json(writer, fault.status, _error(fault.message), extra)
            return True
        text = self._content(data, index)
        pieces = _split(text, self.tokens)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in data["messages"])
        if not data.get("stream"):
            await asyncio.sleep(self.first_token_delay + self.token_delay * len(pieces))
            await _send_json(writer, 200, self._completion(data, text, prompt_tokens, pieces))
            return True
        return await self._stream(index, data, pieces, prompt_tokens, fault, reader, writer)

    def _content(self, data: dict[str, Any], index: int) -> str:
        if self.content is not None:
            return self.content(data, index)
        seed = data.get("seed")
        quality = quality_for_seed(seed if isinstance(seed, int) else 1_000_003 + index)
        return f"answer {quality:.6f} from the fake upstream with some more words"

    def _completion(
        self, data: dict[str, Any], text: str, prompt_tokens: int, pieces: list[str]
    ) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-fake-{self.request_count}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": data.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(pieces),
                "total_tokens": prompt_tokens + len(pieces),
            },
        }

    async def _stream(
        self,
        index: int,
        data: dict[str, Any],
        pieces: list[str],
        prompt_tokens: int,
        fault: Fault | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        self.active_streams += 1
        self.max_active_streams = max(self.max_active_streams, self.active_streams)
        hung_up = asyncio.ensure_future(reader.read(1))  # b"" once the client closes
        finished = False
        try:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            base = {
                "id": f"chatcmpl-fake-{self.request_count}",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": data.get("model") or self.model,
            }
            events = [_chunk(base, {"role": "assistant", "content": ""}, None)]
            events += [_chunk(base, {"content": piece}, None) for piece in pieces]
            events.append(_chunk(base, {}, "stop"))
            if (data.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(pieces),
                    "total_tokens": prompt_tokens + len(pieces),
                }
                events.append({**base, "choices": [], "usage": usage})
            frames = [_frame(json.dumps(event).encode()) for event in events]
            frames.append(_frame(b"[DONE]"))
            if fault is not None:
                frames = _apply_fault(fault, frames)
            token_delay = self.token_delay
            if self.token_delay_rule is not None:
                token_delay = self.token_delay_rule(index, data)
            for i, frame in enumerate(frames):
                delay = self.first_token_delay if i == 1 else token_delay if i > 1 else 0
                if frame is None:  # hang or reset marker
                    if fault is not None and fault.kind == "reset":
                        writer.transport.abort()
                        return False
                    await hung_up
                    return False
                if delay:
                    await writer.drain()
                    done, _ = await asyncio.wait({hung_up}, timeout=delay)
                    if done:
                        return False
                elif hung_up.done():
                    return False
                writer.write(frame)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            finished = True
            return True
        finally:
            if finished:
                self.completed_streams += 1
            else:
                self.aborted_streams += 1
            self.active_streams -= 1
            if not hung_up.done():
                hung_up.cancel()
                with contextlib.suppress(BaseException):
                    await hung_up
            elif not hung_up.cancelled() and hung_up.exception() is None and hung_up.result():
                # The client already sent the first byte of its next request: keep it.
                self._leftover[id(writer)] = hung_up.result()


def _apply_fault(fault: Fault, frames: list[bytes]) -> list[bytes | None]:
    head: list[bytes | None] = list(frames[:3])  # role chunk + two content chunks
    if fault.kind in ("reset", "hang"):
        return [*head, None]
    if fault.kind == "truncate":
        return head
    if fault.kind == "invalid_json":
        return [*head, _frame(b'{"id": "broken", "choices": [')]
    if fault.kind == "mid_stream_error":
        return [*head, _frame(json.dumps(_error(fault.message)).encode())]
    return list(frames)


def _frame(data: bytes) -> bytes:
    payload = b"data: " + data + b"\n\n"
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def _chunk(base: dict[str, Any], delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        **base,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def _split(text: str, tokens: int) -> list[str]:
    """Exactly ``tokens`` pieces (fewer only if the text has fewer words): one per "token"."""
    words = text.split(" ")
    count = max(1, min(tokens, len(words)))
    size, extra = divmod(len(words), count)
    pieces, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        pieces.append(("" if i == 0 else " ") + " ".join(words[start:end]))
        start = end
    return pieces


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "fake_error", "param": None, "code": None}}


async def _read_request(
    reader: asyncio.StreamReader, prefix: bytes = b""
) -> tuple[str, str, dict[str, str], bytes] | None:
    try:
        head = prefix + await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return method, path, headers, body


async def _send_json(
    writer: asyncio.StreamWriter, status: int, payload: Any, extra: dict[str, str] | None = None
) -> None:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 404: "Not Found", 429: "Too Many Requests"}.get(status, "Error")
    headers = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
    headers += f"content-length: {len(body)}\r\n"
    for name, value in (extra or {}).items():
        headers += f"{name}: {value}\r\n"
    writer.write(headers.encode() + b"\r\n" + body)
    await writer.drain()
