"""Faults, over real HTTP: for each, the expected answer, then the invariants of a clean proxy.

Every test ends with :func:`assert_no_leaks` (in-flight gauges at zero, no upstream stream open,
every pooled upstream connection idle and matching the fake's open connections, no unhandled
exception in the captured uvicorn/asyncio/app logs) and, after the gateway stops, the fake
upstream's open connections back to zero.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.fakes import FakeReward, Fault, free_port
from tests.fakes.policies import StopAbove
from tests.reliability_fakes import LogCapture, assert_no_leaks, eventually, switchable_proxy

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**BODY, "stream": True}


def never_stop(plan):
    return StopAbove(99.0, max_samples=plan.max_samples)


@pytest.fixture(params=["lean", "httpx"])
def harness(request, gateway_factory, fake_upstream):
    """``start(**settings)`` -> a gateway with log capture attached; teardown checks that the
    fake upstream's connections all close once the gateway is gone. Every fault runs on both
    upstream clients (the lean HTTP/1.1 pool and httpx, used for HTTPS and proxied upstreams)."""
    captures: list[LogCapture] = []
    servers = []

    def start(**settings):
        values = {
            "policy_factory": never_stop,
            "max_samples": 4,
            "parallelism": 2,
            "upstream_retries": 1,
            "upstream_transport": request.param,
            **settings,
        }
        server = gateway_factory(**values)
        servers.append(server)
        capture = LogCapture().__enter__()  # after uvicorn configured its loggers
        captures.append(capture)
        server.logs = capture
        return server

    yield start
    for capture in captures:
        capture.__exit__()
    for server in servers:
        server.stop()
    assert fake_upstream.wait_connections_closed(5.0), (
        f"{fake_upstream.open_connections} upstream connections outlived the gateway"
    )


# One client for the module: building an httpx client costs ~0.1-0.2 s on a busy box.
HTTP = httpx.Client(timeout=20.0, verify=False)


def post(server, body=BODY, timeout=20.0, **kw) -> httpx.Response:
    return HTTP.post(server.url + "/v1/chat/completions", json=body, timeout=timeout, **kw)


def openai_error(response: httpx.Response, status: int, error_type: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == error_type and error["message"]
    return error


def stream_events(server, body=STREAM, **kw) -> tuple[int, list[str]]:
    with HTTP.stream("POST", server.url + "/v1/chat/completions", json=body, **kw) as response:
        lines = [line for line in response.iter_lines() if line]
        return response.status_code, lines


def upstream_errors(server) -> dict[str, float]:
    from server.metrics import UPSTREAM_ERROR_KINDS

    counts = {
        k: server.metric("pandora_upstream_errors_total", kind=k) for k in UPSTREAM_ERROR_KINDS
    }
    return {k: v for k, v in counts.items() if v}


# -- upstream faults that never heal: the request fails cleanly ----------------------------------
PERSISTENT = [
    # fault, status, OpenAI error type, upstream error kinds it may be counted as
    (Fault("status", status=500, message="GPU on fire"), 502, "upstream_error", {"server_error"}),
    (Fault("status", status=429, retry_after=0.01), 502, "upstream_error", {"rate_limited"}),
    (Fault("reset"), 502, "upstream_error", {"protocol", "connection"}),
    (Fault("truncate"), 502, "upstream_error", {"protocol"}),
    (Fault("invalid_json"), 502, "upstream_error", {"protocol"}),
    (Fault("mid_stream_error", message="engine dead"), 502, "upstream_error", {"server_error"}),
    (Fault("close"), 502, "upstream_error", {"protocol", "connection"}),
    (Fault("hang"), 504, "timeout_error", set()),  # the request deadline ends it
    (Fault("slow_first_byte", delay=1.5), 504, "timeout_error", set()),
]


@pytest.mark.parametrize(
    ("fault", "status", "error_type", "kinds"),
    PERSISTENT,
    ids=[f"{f.kind}-{f.status}" for f, *_ in PERSISTENT],
)
def test_persistent_upstream_fault_fails_cleanly(
    harness, fake_upstream, fault, status, error_type, kinds
):
    fake_upstream.fault_rule = lambda index, body: fault
    server = harness(request_timeout=0.5)
    error = openai_error(post(server), status, error_type)
    if fault.kind == "status" and fault.status == 500:
        assert "GPU on fire" in error["message"]
    if fault.kind == "mid_stream_error":
        assert "engine dead" in error["message"]
    # one wave of 2 candidates x (1 + 1 retry) attempts, then the gateway stops hammering
    if kinds:
        assert set(upstream_errors(server)) <= kinds
        assert sum(upstream_errors(server).values()) == 4
        assert fake_upstream.request_count == 4
    assert server.metric("pandora_requests_total", mode="adaptive", status=str(status)) == 1
    assert server.metric("pandora_candidates_total", outcome="scored") == 0
    assert_no_leaks(server, fake_upstream, server.logs)


@pytest.mark.parametrize("fault", [Fault("hang"), Fault("status", status=503), Fault("reset")])
def test_persistent_fault_while_streaming_ends_in_an_error_event(harness, fake_upstream, fault):
    """Once keep-alives went out the status is 200; the failure arrives as an OpenAI-shaped
    error event followed by [DONE]."""
    fake_upstream.fault_rule = lambda index, body: fault
    fake_upstream.first_token_delay = 0.3  # so that keep-alives go out first
    timeout = 0.6 if fault.kind == "hang" else 3.0
    server = harness(request_timeout=timeout, keepalive_interval=0.1, retry_backoff=0.8)
    status, lines = stream_events(server)
    assert status == 200
    assert lines[0] == ": keep-alive" and lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    expected = "timeout_error" if fault.kind == "hang" else "upstream_error"
    assert error["type"] == expected and error["message"]
    assert_no_leaks(server, fake_upstream, server.logs)


def test_connection_refused(harness):
    server = harness(upstream_url=f"http://127.0.0.1:{free_port()}/v1")
    error = openai_error(post(server), 502, "upstream_error")
    assert "connection" in error["message"]
    assert upstream_errors(server) == {"connection": 4}
    assert_no_leaks(server, None, server.logs)
    assert pool_is_empty(server)


def pool_is_empty(server) -> bool:
    from tests.reliability_fakes import pool_connections

    return eventually(lambda: not pool_connections(server))


# -- transient faults: retried, the client never notices ----------------------------------------
def test_429_retry_after_is_honoured(harness, fake_upstream):
    fake_upstream.inject(Fault("status", status=429, retry_after=0.4, message="slow down"))
    server = harness(max_samples=1, parallelism=1, retry_backoff=0.0)
    started = time.monotonic()
    response = post(server)
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert elapsed >= 0.4, f"retried after {elapsed:.3f} s, before Retry-After (0.4 s)"
    assert fake_upstream.request_count == 2
    assert upstream_errors(server) == {"rate_limited": 1}
    assert_no_leaks(server, fake_upstream, server.logs)


@pytest.mark.parametrize(
    "fault",
    [
        Fault("reset"),
        Fault("truncate"),
        Fault("invalid_json"),
        Fault("slow_first_byte", delay=0.2),
        Fault("status", status=502),
    ],
    ids=lambda f: f.kind,
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_transient_fault_is_invisible_to_the_client(harness, fake_upstream, fault, stream):
    fake_upstream.inject(fault)
    server = harness(max_samples=2, parallelism=2, request_timeout=5.0)
    if stream:
        status, lines = stream_events(server)
        assert status == 200 and lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert "error" not in chunks[-1]
        pandora = chunks[-1]["pandora"]
    else:
        response = post(server)
        assert response.status_code == 200, response.text
        pandora = response.json()["pandora"]
    assert pandora["samples"] == 2 and pandora["failed"] == 0
    assert_no_leaks(server, fake_upstream, server.logs)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_some_candidates_fail_and_the_request_still_answers(harness, fake_upstream, stream):
    faults = {1: Fault("reset"), 3: Fault("status", status=500), 4: Fault("invalid_json")}
    fake_upstream.fault_rule = lambda index, body: faults.get(body["seed"] - 100)
    server = harness(max_samples=6, parallelism=3, upstream_retries=0)
    body = {**BODY, "seed": 100}
    if stream:
        status, lines = stream_events(server, {**body, "stream": True})
        assert status == 200
        pandora = json.loads(lines[-2][6:])["pandora"]
    else:
        response = post(server, body)
        assert response.status_code == 200, response.text
        pandora = response.json()["pandora"]
    assert pandora["samples"] == 3 and pandora["failed"] == 3
    assert server.metric("pandora_candidates_total", outcome="failed") == 3
    assert sum(upstream_errors(server).values()) == 3
    assert_no_leaks(server, fake_upstream, server.logs)


# -- reward backend faults ----------------------------------------------------------------------
@pytest.mark.parametrize("failure", ["down", "nan", "wrong_count", "slow"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_reward_faults_are_503(harness, fake_upstream, failure, stream):
    reward = FakeReward()
    if failure == "slow":
        reward.delay = 3.0
    else:
        setattr(reward, failure, True)
    server = harness(reward=reward, reward_timeout=0.3, keepalive_interval=5.0)
    response = post(server, STREAM if stream else BODY)
    error = openai_error(response, 503, "reward_unavailable")
    assert "reward" in error["message"]
    assert server.metric("pandora_requests_total", mode="adaptive", status="503") == 1
    assert_no_leaks(server, fake_upstream, server.logs)


def test_unreachable_reward_worker_is_503(harness, fake_upstream):
    """The real HTTP reward client against a port nobody listens on."""
    import reward

    url = f"http://127.0.0.1:{free_port()}"
    backend = reward.create_backend("worker", url=url, timeout=2)
    server = harness(reward=backend)
    error = openai_error(post(server), 503, "reward_unavailable")
    assert "unreachable" in error["message"]
    assert url not in error["message"] and "127.0.0.1" not in error["message"]  # internal address
    assert url in server.logs.text()  # operators still see where
    assert_no_leaks(server, fake_upstream, server.logs)


# -- clients that leave ---------------------------------------------------------------------------
def wait_streams(upstream, count: int) -> None:
    assert eventually(lambda: upstream.active_streams == count, 3.0), upstream.active_streams


def test_client_disconnect_mid_sampling(harness, fake_upstream):
    fake_upstream.token_delay = 0.5
    server = harness(max_samples=8, parallelism=4)
    with pytest.raises(httpx.ReadTimeout):
        post(server, timeout=0.5)
    assert fake_upstream.wait_idle(2.0)
    assert fake_upstream.aborted_streams == 4 and fake_upstream.completed_streams == 0
    assert_no_leaks(server, fake_upstream, server.logs)
    assert server.metric("pandora_requests_total", mode="adaptive", status="499") == 1


@pytest.mark.parametrize("mode", ["adaptive", "off"])
def test_client_disconnect_mid_stream(harness, fake_upstream, mode):
    fake_upstream.token_delay = 0.5
    server = harness(max_samples=8, parallelism=4, keepalive_interval=0.1)
    with HTTP.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json=STREAM,
        headers={"X-Pandora-Mode": mode},
        timeout=5,
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()  # keep a reference: a collected iterator closes the stream
        next(lines)
        wait_streams(fake_upstream, 4 if mode == "adaptive" else 1)
    assert fake_upstream.wait_idle(2.0)
    assert_no_leaks(server, fake_upstream, server.logs)
    assert server.metric("pandora_requests_total", mode=mode, status="499") == 1


def test_client_disconnect_while_the_chosen_answer_streams(harness, fake_upstream):
    """A client that hangs up while reading the final chunks leaves nothing behind either."""
    fake_upstream.content = lambda body, index: "answer 0.5 " + "word " * 20_000
    fake_upstream.tokens = 2000
    server = harness(max_samples=2, parallelism=2)
    with HTTP.stream("POST", server.url + "/v1/chat/completions", json=STREAM) as response:
        assert response.status_code == 200
        next(response.iter_bytes())
    assert_no_leaks(server, fake_upstream, server.logs)


# -- outage and recovery ----------------------------------------------------------------------
def test_upstream_recovers_after_an_outage(harness, fake_upstream):
    with switchable_proxy(fake_upstream.port) as proxy:
        server = harness(upstream_url=proxy.base_url, max_samples=2, parallelism=2)
        assert post(server).status_code == 200  # warm: pooled connections through the proxy
        assert HTTP.get(server.url + "/ready").status_code == 200

        proxy.down()  # refused, and the pooled connections are reset
        openai_error(post(server), 502, "upstream_error")
        ready = HTTP.get(server.url + "/ready")
        assert ready.status_code == 503 and ready.json()["upstream"] is False
        assert server.metric("pandora_inflight_requests") == 0

        proxy.up()  # same address: no gateway restart
        response = post(server)
        assert response.status_code == 200, response.text
        assert response.json()["pandora"]["failed"] == 0
        assert HTTP.get(server.url + "/ready").status_code == 200
        assert server.metric("pandora_requests_total", mode="adaptive", status="200") == 2
        assert_no_leaks(server, None, server.logs)
        server.stop()
        assert eventually(lambda: proxy.open_connections == 0)
