"""A client that hangs up leaves nothing running: every upstream stream of its request closes."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.fakes.policies import StopAbove

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def never_stop(plan):
    return StopAbove(99.0, max_samples=plan.max_samples)


@pytest.fixture
def slow_gateway(gateway_factory, fake_upstream):
    fake_upstream.token_delay = 1.0  # ~6 s per candidate: far longer than the test waits
    return gateway_factory(policy_factory=never_stop, max_samples=8, parallelism=4)


def wait_streams(upstream, count: int, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while upstream.active_streams < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert upstream.active_streams == count


def test_disconnect_while_sampling_non_stream(slow_gateway, fake_upstream):
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(slow_gateway.url + "/v1/chat/completions", json=BODY, timeout=0.6)
    assert fake_upstream.max_active_streams == 4
    assert fake_upstream.wait_idle(1.5), "upstream streams outlived the client"
    assert time.monotonic() - started < 4.0  # well before any candidate could finish
    assert fake_upstream.aborted_streams == 4 and fake_upstream.completed_streams == 0
    deadline = time.monotonic() + 2
    while slow_gateway.metric("pandora_inflight_requests") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slow_gateway.metric("pandora_inflight_requests") == 0
    assert slow_gateway.metric("pandora_inflight_candidates") == 0
    assert slow_gateway.metric("pandora_requests_total", mode="adaptive", status="499") == 1
    assert slow_gateway.metric("pandora_candidates_total", outcome="cancelled") == 4


def test_disconnect_while_streaming_keepalives(slow_gateway, fake_upstream):
    with httpx.stream(
        "POST",
        slow_gateway.url + "/v1/chat/completions",
        json={**BODY, "stream": True},
        timeout=5,
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()  # keep a reference: a collected iterator closes the stream
        assert next(lines) == ": keep-alive"
        wait_streams(fake_upstream, 4)
    # leaving the block closed the connection mid-stream
    assert fake_upstream.wait_idle(1.5), "upstream streams outlived the client"
    assert fake_upstream.aborted_streams == 4
    deadline = time.monotonic() + 2
    while slow_gateway.metric("pandora_inflight_requests") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slow_gateway.metric("pandora_inflight_candidates") == 0
    assert slow_gateway.metric("pandora_requests_total", mode="adaptive", status="499") == 1


def test_disconnect_during_pass_through_stream(gateway_factory, fake_upstream):
    fake_upstream.token_delay = 2.0  # ~10 s if nobody hangs up: no race with a busy machine
    server = gateway_factory(policy_factory=never_stop)
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={**BODY, "stream": True},
        headers={"X-Pandora-Mode": "off"},
        timeout=5,
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()  # keep a reference: a collected iterator closes the stream
        next(lines)
        wait_streams(fake_upstream, 1)
    assert fake_upstream.wait_idle(1.5)
    assert fake_upstream.aborted_streams == 1


def test_connections_close_when_the_gateway_stops(gateway_factory, fake_upstream):
    server = gateway_factory(policy_factory=never_stop, max_samples=3)
    assert httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=10).is_success
    assert fake_upstream.open_connections >= 1  # pooled keep-alive connections
    server.stop()
    assert fake_upstream.wait_connections_closed(3.0)
