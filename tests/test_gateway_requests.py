"""Request validation, per-request control and access control at the HTTP edge: every
rejection is a 4xx in OpenAI's error shape naming what was wrong."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes import FakeReward, FakeUpstream
from tests.fakes.gateway import start_gateway
from tests.fakes.policies import StopAbove

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def never_stop(plan):
    return StopAbove(99.0, max_samples=plan.max_samples)


@pytest.fixture(scope="module")
def shared():
    """One gateway for the many validation cases (they never reach the upstream)."""
    with FakeUpstream(tokens=4) as upstream:
        server = start_gateway(
            upstream, FakeReward(), policy_factory=never_stop, max_samples=8, max_body_bytes=4096
        )
        try:
            yield server, upstream
        finally:
            server.stop()


@pytest.fixture
def server(shared):
    return shared[0]


@pytest.fixture
def quiet_upstream(shared):
    """The shared upstream; asserts the test sent it nothing."""
    upstream = shared[1]
    before = upstream.request_count
    yield upstream
    assert upstream.request_count == before


def chat(server, body=BODY, headers=None, content=None) -> httpx.Response:
    url = server.url + "/v1/chat/completions"
    if content is not None:
        return httpx.post(url, content=content, headers=headers, timeout=10)
    return httpx.post(url, json=body, headers=headers, timeout=10)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(
    ("headers", "pandora", "param"),
    [
        ({"X-Pandora-Cost": "0"}, None, "X-Pandora-Cost"),
        ({"X-Pandora-Cost": "1"}, None, "X-Pandora-Cost"),
        ({"X-Pandora-Cost": "abc"}, None, "X-Pandora-Cost"),
        ({"X-Pandora-Cost": "nan"}, None, "X-Pandora-Cost"),
        (None, {"cost": -0.5}, "pandora.cost"),
        ({"X-Pandora-Target-Acceptance": "1.5"}, None, "X-Pandora-Target-Acceptance"),
        ({"X-Pandora-Target-Acceptance": "0"}, None, "X-Pandora-Target-Acceptance"),
        (
            {"X-Pandora-Cost": "0.1", "X-Pandora-Target-Acceptance": "0.5"},
            None,
            "X-Pandora-Target-Acceptance",
        ),
        ({"X-Pandora-Cost": "0.1"}, {"target_acceptance": 0.5}, "pandora.target_acceptance"),
        ({"X-Pandora-Max-Samples": "9"}, None, "X-Pandora-Max-Samples"),
        ({"X-Pandora-Max-Samples": "0"}, None, "X-Pandora-Max-Samples"),
        ({"X-Pandora-Max-Samples": "2.5"}, None, "X-Pandora-Max-Samples"),
        (None, {"max_samples": 100}, "pandora.max_samples"),
        (
            {"X-Pandora-Min-Samples": "5", "X-Pandora-Max-Samples": "3"},
            None,
            "X-Pandora-Min-Samples",
        ),
        ({"X-Pandora-Parallelism": "0"}, None, "X-Pandora-Parallelism"),
        ({"X-Pandora-Mode": "greedy"}, None, "X-Pandora-Mode"),
        ({"X-Pandora-Mode": "fixed", "X-Pandora-Cost": "0.1"}, None, "X-Pandora-Mode"),
        ({"X-Pandora-Mode": "x" * 500}, None, "X-Pandora-Mode"),
        (None, {"colour": "blue"}, "pandora.colour"),
        ({"X-Pandora-Task": "code review"}, None, "X-Pandora-Task"),
        ({"X-Pandora-Task": ""}, None, "X-Pandora-Task"),
        (None, {"task": 7}, "pandora.task"),
        (None, {"task": "x" * 65}, "pandora.task"),
    ],
)
def test_invalid_control_is_a_400_naming_the_field(server, quiet_upstream, headers, pandora, param):
    body = {**BODY, "pandora": pandora} if pandora is not None else BODY
    error = error_of(chat(server, body, headers), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param in error["message"]


def test_cost_selects_adaptive_and_target_selects_target_mode(server):
    response = chat(server, headers={"X-Pandora-Target-Acceptance": "0.8"})
    assert response.headers["X-Pandora-Mode"] == "target"
    response = chat(server, {**BODY, "pandora": {"cost": 0.2}})
    assert response.headers["X-Pandora-Mode"] == "adaptive"
    response = chat(server, headers={"X-Pandora-Mode": "FIXED", "X-Pandora-Max-Samples": "2"})
    assert response.headers["X-Pandora-Mode"] == "fixed"
    assert response.headers["X-Pandora-Samples"] == "2"


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b"{not json", None),
        (b"\xff\xfe\x00garbage", None),
        (b"[1, 2]", None),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', "messages.0.role"),
        (b'{"model": "m", "messages": [{"role": "user"}], "n": 0}', "n"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "maybe"}', "stream"),
    ],
)
def test_malformed_bodies_are_400(server, quiet_upstream, content, param):
    error = error_of(
        chat(server, content=content, headers={"content-type": "application/json"}), 400
    )
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_n_above_the_budget_is_400(server):
    error = error_of(chat(server, {**BODY, "n": 3}, {"X-Pandora-Max-Samples": "2"}), 400)
    assert error["param"] == "n"


def test_body_above_the_limit_is_413(server, quiet_upstream):
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 5000}]}
    error = error_of(chat(server, big), 413)
    assert "4096" in error["message"]

    def chunked():  # no content-length: the streamed bytes are counted
        for _ in range(10):
            yield b" " * 1000

    response = httpx.post(server.url + "/v1/chat/completions", content=chunked(), timeout=10)
    error_of(response, 413)


def test_request_id_is_echoed_only_when_sane(server):
    assert chat(server, headers={"X-Request-Id": "abc-123"}).headers["X-Request-Id"] == "abc-123"
    generated = chat(server, headers={"X-Request-Id": "bad id\twith spaces"})
    assert generated.headers["X-Request-Id"] != "bad id\twith spaces"
    assert len(generated.headers["X-Request-Id"]) == 32
    error = chat(server, content=b"{", headers={"X-Request-Id": "err-1"})
    assert error.headers["X-Request-Id"] == "err-1"


def test_api_keys(gateway_factory):
    server = gateway_factory(policy_factory=never_stop, api_key=["k1", "k2"], max_samples=1)
    assert error_of(chat(server), 401)["type"] == "authentication_error"
    assert error_of(chat(server, headers={"Authorization": "Bearer nope"}), 401)
    assert error_of(chat(server, headers={"Authorization": "Basic k1"}), 401)
    assert chat(server, headers={"Authorization": "Bearer k2"}).status_code == 200
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/metrics").status_code == 200  # open by default
    assert httpx.get(server.url + "/health").status_code == 200


def test_protected_metrics(gateway_factory):
    server = gateway_factory(policy_factory=never_stop, api_key=["k1"], protect_metrics=True)
    assert httpx.get(server.url + "/metrics").status_code == 401
    assert httpx.get(server.url + "/ready").status_code == 401
    auth = {"Authorization": "Bearer k1"}
    assert httpx.get(server.url + "/metrics", headers=auth).status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200


def test_upstream_api_key_is_sent_upstream_and_never_shown(gateway_factory, fake_upstream):
    from tests.fakes import Fault

    secret = "sk-upstream-SECRET-123"
    server = gateway_factory(policy_factory=never_stop, upstream_api_key=secret, max_samples=1)
    fake_upstream.inject(Fault("status", status=500, message="bad"), times=10)
    response = chat(server, headers={"Authorization": "Bearer client-key"})
    assert response.status_code == 502
    texts = [response.text, str(response.headers), httpx.get(server.url + "/metrics").text]
    assert all(secret not in text for text in texts)
    assert fake_upstream.request_headers[0]["authorization"] == f"Bearer {secret}"
