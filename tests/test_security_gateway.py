"""Security at the gateway's edge: client keys, the upstream key, SSRF, CORS, metric labels.

- client API keys are compared in constant time and every failure is a 401 in OpenAI's shape;
- the upstream API key never reaches a client, a log line or a metric, not even when the
  upstream echoes it back in an error;
- nothing in a request can change where the gateway connects (upstream or reward): no SSRF;
- CORS is off unless configured;
- hostile header values cannot create metric series.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server import metrics as gateway_metrics
from server.auth import key_matches
from server.config import Settings
from server.priors import POLICY_SHAPES, UPDATE_RESULTS
from tests.fakes import FakeReward, FakeUpstream, Fault
from tests.fakes.gateway import start_gateway
from tests.fakes.policies import StopAbove
from tests.reliability_fakes import ConnectionCounter, LogCapture

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
HTTP = httpx.Client(timeout=20.0, verify=False)
SECRET = "sk-upstream-Q7x9SECRETkey0042"


def never_stop(plan):
    return StopAbove(99.0, max_samples=plan.max_samples)


def post(server, body=BODY, headers=None) -> httpx.Response:
    return HTTP.post(server.url + "/v1/chat/completions", json=body, headers=headers)


def assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"


# -- client API keys ------------------------------------------------------------------------------
def test_keys_are_compared_with_compare_digest_against_every_key(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    keys = [b"first-key", b"second-key", b"third-key"]
    assert key_matches("first-key", keys)
    assert len(calls) == 3, "stopped at the first match: timing tells which key matched"
    calls.clear()
    assert not key_matches("first-ke", keys)
    assert len(calls) == 3 and all(isinstance(a, bytes) for a, _ in calls)


@pytest.fixture(scope="module")
def locked():
    """A gateway with two client keys and /metrics, /ready behind them."""
    with FakeUpstream(tokens=2) as upstream:
        server = start_gateway(
            upstream,
            FakeReward(),
            policy_factory=never_stop,
            max_samples=1,
            api_key=["key-one-123", "key-two-456"],
            protect_metrics=True,
        )
        try:
            yield server, upstream
        finally:
            server.stop()


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer  \tx",  # whitespace, then a non-key
        "Bearer key-one-12",  # prefix of a key
        "Bearer key-one-1234",  # key plus a suffix
        "Bearer KEY-ONE-123",
        "Bearer key-one-123,key-two-456",
        "Basic key-one-123",
        "key-one-123",
        "Bearer " + "k" * 10_000,
        "Bearer key-one-123\u00ff",
    ],
    ids=lambda v: repr(v)[:24],
)
def test_missing_or_wrong_key_is_401_everywhere(locked, authorization):
    server, upstream = locked
    before = upstream.request_count
    rejected = server.metric("pandora_requests_total", mode="unknown", status="401")
    headers = {} if authorization is None else {"Authorization": authorization.encode("latin-1")}
    assert_401(post(server, headers=headers))
    # counted (label values from the fixed sets), so a flood of bad keys shows on the dashboard
    assert server.metric("pandora_requests_total", mode="unknown", status="401") == rejected + 1
    for path in ("/v1/models", "/metrics", "/ready"):
        assert_401(HTTP.get(server.url + path, headers=headers))
    assert upstream.request_count == before, "an unauthenticated request reached the upstream"


def test_every_configured_key_works_and_health_stays_open(locked):
    server, _ = locked
    for key in ("key-one-123", "key-two-456"):
        auth = {"Authorization": f"Bearer {key}"}
        assert post(server, headers=auth).status_code == 200
        assert HTTP.get(server.url + "/metrics", headers=auth).status_code == 200
        assert HTTP.get(server.url + "/ready", headers=auth).status_code == 200
    assert HTTP.get(server.url + "/health").status_code == 200  # liveness probes carry no key


def test_metrics_and_ready_are_open_unless_protected(gateway_factory):
    server = gateway_factory(policy_factory=never_stop, api_key=["k"])
    assert HTTP.get(server.url + "/metrics").status_code == 200
    assert HTTP.get(server.url + "/ready").status_code == 200
    assert_401(HTTP.get(server.url + "/v1/models"))


# -- the upstream API key -------------------------------------------------------------------------
ECHOES = [
    Fault("status", status=401, message=f"Incorrect API key provided: {SECRET}"),
    Fault("status", status=500, message=f"internal error for Authorization: Bearer {SECRET}"),
    Fault("status", status=429, message=f"rate limit for key {SECRET}", retry_after=0.01),
    Fault("mid_stream_error", message=f"engine died serving key {SECRET}"),
]


LEAK_CASES = [
    pytest.param(fault, mode, stream, id=f"{fault.kind}-{fault.status}-{mode}-{int(stream)}")
    for fault in ECHOES
    for mode in ("adaptive", "off")
    for stream in (False, True)
    # a plain JSON pass-through has no stream that could break
    if not (fault.kind == "mid_stream_error" and mode == "off" and not stream)
]


@pytest.mark.parametrize(("fault", "mode", "stream"), LEAK_CASES)
def test_upstream_key_never_leaks_even_when_the_upstream_echoes_it(
    gateway_factory, fake_upstream, fault, mode, stream
):
    server = gateway_factory(
        policy_factory=never_stop,
        upstream_api_key=SECRET,
        max_samples=2,
        upstream_retries=1,
        keepalive_interval=0.05,
    )
    fake_upstream.fault_rule = lambda index, body: fault
    with LogCapture(logging.DEBUG) as logs:
        response = post(server, {**BODY, "stream": stream}, {"X-Pandora-Mode": mode})
        seen = [
            response.text,
            json.dumps(dict(response.headers)),
            HTTP.get(server.url + "/metrics").text,
            HTTP.get(server.url + "/ready").text,
            HTTP.get(server.url + "/v1/models").text,
            HTTP.get(server.url + "/openapi.json").text,
        ]
    assert response.status_code >= 400 or "error" in response.text, response.text
    # the upstream really got the key (so a leak would have been possible)
    assert fake_upstream.request_headers[0]["authorization"] == f"Bearer {SECRET}"
    for text in [*seen, logs.text()]:
        assert SECRET not in text
        assert SECRET[8:] not in text  # nor most of it


def test_settings_never_print_the_keys():
    config = Settings(upstream_url="http://u/v1", upstream_api_key=SECRET, api_key=["client-k"])
    for text in (repr(config), str(config), str(config.model_dump())):
        assert SECRET not in text and "client-k" not in text


# -- no SSRF --------------------------------------------------------------------------------------
SSRF_BODIES = [
    {"upstream_url": "{evil}/v1"},
    {"base_url": "{evil}/v1"},
    {"api_base": "{evil}/v1"},
    {"url": "{evil}/v1/chat/completions"},
    {"reward_url": "{evil}"},
    {"model": "{evil}/v1"},
    {"extra_body": {"base_url": "{evil}/v1"}},
]
SSRF_HEADERS = [
    {"X-Pandora-Upstream-Url": "{evil}/v1"},
    {"X-Pandora-Reward-Url": "{evil}"},
    {"X-Upstream-Url": "{evil}/v1"},
    {"X-Forwarded-Host": "{host}"},
    {"X-Forwarded-Proto": "http", "X-Forwarded-Port": "{port}"},
    {"Forwarded": "host={host}"},
    {"Host": "{host}"},
]


def test_no_request_can_redirect_the_gateway(fake_upstream):
    """The upstream and reward URLs come from start-up settings only: whatever a request
    says, the gateway never connects anywhere else."""
    import reward

    evil, legit_reward = ConnectionCounter(), ConnectionCounter()
    server = start_gateway(fake_upstream, FakeReward(), policy_factory=never_stop, max_samples=1)
    # a second gateway scoring through the real HTTP reward client (its worker just hangs up)
    worker = reward.create_backend("worker", url=legit_reward.url, timeout=2)
    scored = start_gateway(fake_upstream, worker, policy_factory=never_stop, max_samples=1)
    try:
        fill = {"evil": evil.url, "host": f"127.0.0.1:{evil.port}", "port": str(evil.port)}
        sent = 0
        for extra in SSRF_BODIES:
            body = json.loads(json.dumps({**BODY, **extra}).replace("{evil}", evil.url))
            assert post(server, body).status_code == 200
            assert post(server, body, {"X-Pandora-Mode": "off"}).status_code == 200
            assert post(scored, body).status_code == 503  # scored at the configured worker
            sent += 3
        for headers in SSRF_HEADERS:
            headers = {k: v.format(**fill) for k, v in headers.items()}
            for mode in ("adaptive", "off"):
                response = post(server, headers={**headers, "X-Pandora-Mode": mode})
                assert response.status_code == 200, response.text
                sent += 1
            assert post(scored, headers=headers).status_code == 503
            sent += 1
        # pandora.* accepts only the documented control keys
        response = post(server, {**BODY, "pandora": {"upstream_url": evil.url}})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "pandora.upstream_url"
        # an absolute-form request line naming another host: still our upstream
        raw = absolute_form_request(server.port, f"{evil.url}/v1/chat/completions")
        assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        sent += 1
        assert evil.connections == 0
        assert fake_upstream.request_count == sent
        assert legit_reward.connections >= len(SSRF_BODIES) + len(SSRF_HEADERS)
    finally:
        server.stop()
        scored.stop()
        evil.close()
        legit_reward.close()


def absolute_form_request(port: int, target: str) -> bytes:
    body = json.dumps(BODY).encode()
    request = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_settings_are_frozen():
    config = Settings(upstream_url="http://u/v1")
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        config.upstream_url = "http://evil/v1"  # type: ignore[misc]


# -- CORS -----------------------------------------------------------------------------------------
def test_cors_is_off_by_default(gateway_factory):
    server = gateway_factory(policy_factory=never_stop, max_samples=1)
    origin = {"Origin": "https://evil.example"}
    preflight = HTTP.options(
        server.url + "/v1/chat/completions",
        headers={
            **origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    responses = [
        preflight,
        post(server, headers=origin),
        HTTP.get(server.url + "/v1/models", headers=origin),
        HTTP.get(server.url + "/metrics", headers=origin),
    ]
    assert responses[1].status_code == 200
    for response in responses:
        assert not any(name.lower().startswith("access-control-") for name in response.headers), (
            response.request.method,
            response.headers,
        )


# -- metric labels ---------------------------------------------------------------------------------
ALLOWED_LABELS = {
    "mode": {*gateway_metrics.REQUEST_MODES, "other"},  # "other": pandora_task_* only
    "status": {*gateway_metrics.STATUSES, "other"},
    "outcome": set(gateway_metrics.CANDIDATE_OUTCOMES),
    "kind": {*gateway_metrics.TOKEN_KINDS, *gateway_metrics.UPSTREAM_ERROR_KINDS},
    "reason": set(gateway_metrics.STOP_REASONS),
    "result": set(UPDATE_RESULTS),  # pandora_prior_updates_total
    "shape": set(POLICY_SHAPES),  # pandora_prior_policies_total
    "task": {"other", "none"},  # pandora_task_*: no --metric-tasks declared here
}
HOSTILE = [
    "<script>alert(1)</script>",
    "x" * 10_000,
    'adaptive",status="200',
    "off\\n",
    "ADAPTIVE x",
]


def series(text: str) -> set[tuple[str, tuple]]:
    found = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.add((sample.name, tuple(sorted(sample.labels.items()))))
    return found


def test_hostile_values_cannot_create_metric_series(gateway_factory, fake_upstream):
    server = gateway_factory(policy_factory=never_stop, max_samples=2, max_body_bytes=2048)
    post(server)  # every series that normal traffic creates
    before = series(HTTP.get(server.url + "/metrics").text)
    for value in HOSTILE:
        for header in (
            "X-Pandora-Mode",
            "X-Pandora-Cost",
            "X-Pandora-Task",
            "X-Request-Id",
            "User-Agent",
        ):
            post(server, headers={header: value})
        post(server, {**BODY, "pandora": {"mode": value}})
        post(server, {**BODY, "model": value, "messages": [{"role": value, "content": value}]})
        HTTP.post(server.url + "/v1/chat/completions/" + value[:100], json=BODY)
    post(server, headers={"X-Pandora-Task": "user-4242"})  # valid, undeclared: "other"
    post(server, {**BODY, "pad": "x" * 5000})  # 413
    fake_upstream.inject(Fault("status", status=418, message="<script>"), times=2)
    post(server)  # an unusual upstream status
    text = HTTP.get(server.url + "/metrics").text
    after = series(text)
    # the only series hostile traffic may add: unusual statuses folded into "other"
    added = [labels for name, labels in after - before if not name.endswith("_created")]
    assert all(dict(labels).get("status") == "other" for labels in added), added[:10]
    for name, labels in after:
        for label, value in labels:
            if name.startswith("pandora_") and label != "le":
                assert value in ALLOWED_LABELS[label], (name, label, value[:80])
    assert "<script>" not in text and "x" * 100 not in text
    assert server.metric("pandora_requests_total", mode="unknown", status="400") >= 10
