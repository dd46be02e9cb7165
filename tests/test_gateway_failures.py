"""Upstream and reward failures: retries, skipped candidates, 502/504/503, client 4xx."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fakes import Fault
from tests.fakes.policies import StopAbove

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def never_stop(plan):
    return StopAbove(99.0, max_samples=plan.max_samples)


def post(server, body=BODY, **kw) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=20, **kw)


def assert_openai_error(response: httpx.Response, status: int, error_type: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == error_type and error["message"]
    return error


def test_5xx_and_429_are_retried_then_succeed(gateway_factory, fake_upstream):
    fake_upstream.inject(Fault("status", status=500), times=1)
    fake_upstream.inject(Fault("status", status=429, retry_after=0.05), times=1)
    server = gateway_factory(policy_factory=never_stop, max_samples=1, upstream_retries=2)
    response = post(server)
    assert response.status_code == 200, response.text
    assert response.json()["pandora"]["failed"] == 0
    assert fake_upstream.request_count == 3
    assert server.metric("pandora_upstream_errors_total", kind="server_error") == 1
    assert server.metric("pandora_upstream_errors_total", kind="rate_limited") == 1


@pytest.mark.parametrize("kind", ["reset", "truncate", "invalid_json", "mid_stream_error", "close"])
def test_broken_streams_are_retried(gateway_factory, fake_upstream, kind):
    fake_upstream.inject(Fault(kind), times=1)
    server = gateway_factory(policy_factory=never_stop, max_samples=1, upstream_retries=1)
    response = post(server)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"].startswith("answer ")
    assert fake_upstream.wait_idle()


def test_failed_candidates_are_skipped_and_counted(gateway_factory, fake_upstream):
    fake_upstream.fault_rule = lambda index, body: Fault("status") if body["seed"] % 2 else None
    server = gateway_factory(policy_factory=never_stop, max_samples=6, upstream_retries=0)
    response = post(server, {**BODY, "seed": 0})
    assert response.status_code == 200
    pandora = response.json()["pandora"]
    assert pandora["samples"] == 3 and pandora["failed"] == 3
    assert pandora["stop_reason"] == "exhausted"
    assert server.metric("pandora_candidates_total", outcome="failed") == 3


def test_all_candidates_failing_is_a_502_with_the_upstream_message(gateway_factory, fake_upstream):
    fake_upstream.fault_rule = lambda index, body: Fault(
        "status", status=503, message="GPU on fire"
    )
    server = gateway_factory(
        policy_factory=never_stop, max_samples=8, parallelism=2, upstream_retries=1
    )
    error = assert_openai_error(post(server), 502, "upstream_error")
    assert "GPU on fire" in error["message"]
    # one failed wave (2 candidates x 2 attempts) and the gateway stops hammering
    assert fake_upstream.request_count == 4
    assert server.metric("pandora_requests_total", mode="adaptive", status="502") == 1


def test_upstream_timeout_is_a_504(gateway_factory, fake_upstream):
    fake_upstream.fault_rule = lambda index, body: Fault("hang")
    server = gateway_factory(
        policy_factory=never_stop,
        max_samples=2,
        parallelism=2,
        upstream_retries=0,
        request_timeout=0.5,
    )
    assert_openai_error(post(server), 504, "timeout_error")
    assert fake_upstream.wait_idle(), "hanging upstream streams were left open"


def test_deadline_returns_the_best_so_far(gateway_factory, fake_upstream):
    fake_upstream.token_delay_rule = lambda index, body: 0.0 if body["seed"] == 0 else 5.0
    server = gateway_factory(
        policy_factory=never_stop, max_samples=4, parallelism=4, request_timeout=0.6
    )
    response = post(server, {**BODY, "seed": 0})
    assert response.status_code == 200
    pandora = response.json()["pandora"]
    assert pandora["stop_reason"] == "timeout" and pandora["samples"] == 1
    assert pandora["cancelled"] == 3
    assert fake_upstream.wait_idle()


def test_upstream_client_error_is_passed_through(gateway_factory, fake_upstream):
    fake_upstream.inject(Fault("status", status=400, message="model 'x' does not exist"), times=9)
    server = gateway_factory(policy_factory=never_stop, max_samples=4, upstream_retries=2)
    error = assert_openai_error(post(server), 400, "invalid_request_error")
    assert "does not exist" in error["message"]
    assert fake_upstream.wait_idle()


def test_connection_refused_is_a_502(gateway_factory, fake_upstream):
    from tests.fakes import free_port

    server = gateway_factory(
        policy_factory=never_stop,
        upstream_url=f"http://127.0.0.1:{free_port()}/v1",
        upstream_retries=1,
        parallelism=2,
    )
    error = assert_openai_error(post(server), 502, "upstream_error")
    assert "connection" in error["message"]
    assert server.metric("pandora_upstream_errors_total", kind="connection") == 4


@pytest.mark.parametrize("failure", ["down", "nan", "wrong_count"])
def test_reward_failures_are_503(gateway_factory, fake_reward, fake_upstream, failure):
    setattr(fake_reward, failure, True)
    server = gateway_factory(policy_factory=never_stop, max_samples=3)
    error = assert_openai_error(post(server), 503, "reward_unavailable")
    assert "reward" in error["message"]
    assert fake_upstream.wait_idle()
    assert server.metric("pandora_inflight_candidates") == 0


def test_reward_timeout_is_503(gateway_factory, fake_reward):
    fake_reward.delay = 2.0
    server = gateway_factory(policy_factory=never_stop, max_samples=2, reward_timeout=0.2)
    error = assert_openai_error(post(server), 503, "reward_unavailable")
    assert "did not answer" in error["message"]


def test_reward_fallback_returns_the_first_candidate(gateway_factory, fake_reward):
    fake_reward.down = True
    server = gateway_factory(
        policy_factory=never_stop, max_samples=3, parallelism=1, reward_failure="first"
    )
    response = post(server, {**BODY, "seed": 40})
    assert response.status_code == 200
    assert response.headers["X-Pandora-Stop-Reason"] == "reward_unavailable"
    assert "X-Pandora-Reward" not in response.headers
    body = response.json()
    assert body["pandora"]["rewards"] == [] and body["pandora"]["samples"] == 1
    assert body["choices"][0]["message"]["content"].startswith("answer ")


def test_stream_failure_before_first_keepalive_keeps_its_status(gateway_factory, fake_reward):
    fake_reward.down = True
    server = gateway_factory(policy_factory=never_stop, max_samples=2, keepalive_interval=5.0)
    response = post(server, {**BODY, "stream": True})
    assert_openai_error(response, 503, "reward_unavailable")


def test_stream_failure_after_keepalives_is_an_error_event(gateway_factory, fake_upstream):
    fake_upstream.token_delay = 0.1
    fake_upstream.fault_rule = lambda index, body: Fault("status", status=500, message="boom")
    fake_upstream.first_token_delay = 0.0
    server = gateway_factory(
        policy_factory=never_stop,
        max_samples=1,
        upstream_retries=3,
        retry_backoff=0.2,
        keepalive_interval=0.1,
    )
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json={**BODY, "stream": True}, timeout=20
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[0] == ": keep-alive"
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["error"]["type"] == "upstream_error"
    assert "boom" in lines[-2]
