"""The chat fast path (outside FastAPI's middleware stack): the duties it took over from the
stack - body limit, unexpected errors - and the lazy disconnect watcher of a pass-through."""

from __future__ import annotations

import time

import httpx
import pytest

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
URL = "/v1/chat/completions"


def lean_connections(server) -> list:
    lean = server.config.app.state.gateway.upstream.lean
    assert lean is not None  # a plain http:// upstream: the lean client serves mode off
    return lean.connections()


def wait_for(condition, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_declared_oversized_body_is_a_counted_413_with_a_request_id(gateway_factory):
    server = gateway_factory(default_mode="off", max_body_bytes=2048)
    response = httpx.post(
        server.url + URL,
        content=b"{" + b" " * 4000 + b"}",
        headers={"content-type": "application/json", "X-Request-Id": "req-413"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    assert response.headers["X-Request-Id"] == "req-413"
    assert server.metric("pandora_requests_total", mode="unknown", status="413") == 1


def test_chunked_body_past_the_limit_is_refused(gateway_factory, fake_upstream):
    server = gateway_factory(default_mode="off", max_body_bytes=2048)

    def chunks():  # no Content-Length: the limit is counted as the body arrives
        yield b'{"model": "m", "pad": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    response = httpx.post(server.url + URL, content=chunks())
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert fake_upstream.request_count == 0
    ok = httpx.post(server.url + URL, json=BODY)  # the gateway carries on
    assert ok.status_code == 200


def test_unexpected_error_is_a_500_in_openai_shape_and_counted(gateway_factory, fake_upstream):
    server = gateway_factory(default_mode="off")
    upstream = server.config.app.state.gateway.upstream

    async def broken(body, *, stream):
        raise RuntimeError("a bug, not a client or upstream error")

    original = upstream.passthrough
    upstream.passthrough = broken
    try:
        response = httpx.post(server.url + URL, json=BODY)
    finally:
        upstream.passthrough = original
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "internal_error" and "a bug" not in error["message"]
    assert server.metric("pandora_requests_total", mode="off", status="500") == 1
    assert server.metric("pandora_inflight_requests") == 0
    assert httpx.post(server.url + URL, json=BODY).status_code == 200


def test_disconnect_during_a_non_stream_pass_through_closes_the_upstream_request(
    gateway_factory, fake_upstream
):
    fake_upstream.token_delay = 1.0  # ~6 s before the upstream would answer
    server = gateway_factory(default_mode="off")
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + URL, json=BODY, timeout=0.6)
    # the gateway noticed the hang-up and aborted its upstream request (closing its connection;
    # the fake upstream, asleep until its answer is due, only sees that when it writes)
    assert wait_for(lambda: server.metric("pandora_requests_total", mode="off", status="499") == 1)
    assert wait_for(lambda: lean_connections(server) == [])
    assert time.monotonic() - started < 4.0  # long before the upstream would have answered
    assert server.metric("pandora_inflight_requests") == 0


def test_a_hang_up_before_the_watcher_starts_is_still_noticed(
    gateway_factory, fake_upstream, monkeypatch
):
    """The disconnect watcher starts only after WATCH_AFTER seconds of work; a client that
    left earlier is then seen at once (uvicorn's receive reports a past disconnect)."""
    from server.chat import serving

    monkeypatch.setattr(serving, "WATCH_AFTER", 1.0)
    fake_upstream.token_delay = 1.0
    server = gateway_factory(default_mode="off")
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + URL, json=BODY, timeout=0.3)
    assert wait_for(lambda: server.metric("pandora_requests_total", mode="off", status="499") == 1)
    elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 4.0, elapsed  # at the watcher's start, not at the upstream's answer
    assert wait_for(lambda: lean_connections(server) == [])
