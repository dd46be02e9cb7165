"""Hostile input: schema-driven fuzzing, oversized bodies, broken encodings, absurd headers.

Every rejection must be a 4xx in OpenAI's error shape; nothing a client sends may cause a 5xx.
The fuzzing runs in-process (``httpx.ASGITransport`` with the app's lifespan entered by hand)
for speed, while the upstream is still the fake vLLM over real loopback HTTP, so generated
requests that are valid really are sampled, scored and answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from schemathesis.core import NotSet
from schemathesis.generation import GenerationMode

from server.app import create_app
from server.config import Settings
from tests.fakes import FakeReward, FakeUpstream
from tests.fakes.gateway import start_gateway

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CONTROL_HEADERS = (
    "X-Pandora-Mode",
    "X-Pandora-Cost",
    "X-Pandora-Target-Acceptance",
    "X-Pandora-Max-Samples",
    "X-Pandora-Min-Samples",
    "X-Pandora-Parallelism",
    "X-Pandora-Task",
    "X-Request-Id",
)
HTTP = httpx.Client(timeout=20.0, verify=False)


def assert_openai_error(response: httpx.Response, status: int | None = None) -> dict:
    if status is not None:
        assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    return error


# -- the OpenAPI document itself ------------------------------------------------------------------
def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_openapi_refs_resolve_within_the_document():
    """Regression: the body schema carried pydantic's local ``$defs``, so its refs pointed at
    ``#/$defs/...`` in a document that has none and fuzzers/clients could not read it."""
    app = create_app(Settings(upstream_url="http://127.0.0.1:9/v1"), reward=FakeReward())
    document = app.openapi()
    for ref in _refs(document):
        assert ref.startswith("#/"), ref
        node = document
        for part in ref[2:].split("/"):
            assert part in node, f"dangling $ref {ref}"
            node = node[part]
    body = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert schema["properties"]["messages"]["items"]["properties"]["role"]["type"] == "string"


# -- schema-driven fuzzing ------------------------------------------------------------------------
HEADER_VALUES = st.one_of(
    st.sampled_from(["adaptive", "target", "fixed", "off", "0.5", "2", "1e9", "nan", "-1", ""]),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
    st.binary(max_size=40).map(lambda b: bytes(c for c in b if c >= 32 and c != 127)),
)
HOSTILE_HEADERS = st.dictionaries(st.sampled_from(CONTROL_HEADERS), HEADER_VALUES, max_size=3)


class Fuzzer:
    """The app, in-process with its lifespan entered, on one private event loop."""

    def __init__(self, upstream: FakeUpstream) -> None:
        config = Settings(
            upstream_url=upstream.base_url,
            max_samples=4,
            parallelism=2,
            retry_backoff=0.0,
            keepalive_interval=0.05,
            request_timeout=5.0,
            max_body_bytes=256 * 1024,
        )
        self.app = create_app(config, reward=FakeReward(), registry=CollectorRegistry())
        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://gateway"
        )
        self.statuses: list[int] = []

    def __enter__(self) -> Fuzzer:
        self.loop.run_until_complete(
            self.stack.enter_async_context(self.app.router.lifespan_context(self.app))
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.stack.aclose())
        self.loop.close()

    def send(self, case, headers: dict) -> httpx.Response:
        if isinstance(case.body, NotSet):
            content = b""
        elif isinstance(case.body, bytes):  # negative mode also sends raw bytes
            content = case.body
        else:
            content = json.dumps(case.body).encode()
        request_headers = {"content-type": "application/json", **(case.headers or {}), **headers}
        response = self.loop.run_until_complete(
            self.client.post("/v1/chat/completions", content=content, headers=request_headers)
        )
        self.statuses.append(response.status_code)
        return response


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        assert_openai_error(response)
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.rstrip().endswith("data: [DONE]")
    else:
        assert response.json()["choices"], response.text[:500]


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases every CI run (no flaky discoveries)
        suppress_health_check=list(HealthCheck),
    )


# Extra fields (``additionalProperties: true``: forwarded upstream unchanged) are drawn from
# scalars and short lists instead of arbitrary nested JSON: ~3x faster generation, and deep
# nesting has its own handcrafted cases below.
EXTRA_FIELD = {
    "anyOf": [
        {"type": "string", "maxLength": 40},
        {"type": "number"},
        {"type": "integer"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    ]
}


def _bounded_extras(node):
    if isinstance(node, dict):
        return {
            key: EXTRA_FIELD
            if key == "additionalProperties" and value is True
            else _bounded_extras(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_bounded_extras(value) for value in node]
    return node


def test_fuzz_chat_completions_never_answers_5xx():
    with FakeUpstream(tokens=2) as upstream, Fuzzer(upstream) as fuzzer:
        schema = schemathesis.openapi.from_dict(_bounded_extras(fuzzer.app.openapi()))
        operation = schema["/v1/chat/completions"]["POST"]

        for mode, examples in ((GenerationMode.POSITIVE, 300), (GenerationMode.NEGATIVE, 210)):

            @fuzz_settings(examples)
            @given(case=operation.as_strategy(generation_mode=mode), headers=HOSTILE_HEADERS)
            def fuzz(case, headers):
                check(fuzzer.send(case, headers))

            fuzz()

        statuses = fuzzer.statuses
        assert len(statuses) >= 500, len(statuses)
        # the fuzzing reached the sampling loop (not only the validators)
        assert statuses.count(200) >= 50, sorted(set(statuses))
        assert upstream.request_count >= 50
        assert upstream.wait_idle()
        gateway = fuzzer.app.state.gateway
        assert gateway.registry.get_sample_value("pandora_inflight_requests") == 0
        assert gateway.registry.get_sample_value("pandora_inflight_candidates") == 0


# -- handcrafted hostile bodies -------------------------------------------------------------------
@pytest.fixture(scope="module")
def gateway():
    with FakeUpstream(tokens=2) as upstream:
        server = start_gateway(upstream, FakeReward(), max_samples=2, parallelism=2)
        try:
            yield server
        finally:
            server.stop()


def chat(server, content: bytes, headers=None) -> httpx.Response:
    headers = {"content-type": "application/json", **(headers or {})}
    return HTTP.post(server.url + "/v1/chat/completions", content=content, headers=headers)


VALID = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x80\x81\x82",  # not UTF-8
        b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',  # lone surrogate
        b'{"model": "m", "messages": [{"role": "user", "content": "\\udfff x"}], "n": 1}',
        VALID + b', "temperature": NaN}',  # Python's parser takes these; no upstream does
        VALID + b', "temperature": Infinity}',
        VALID + b', "top_p": -Infinity, "pandora": {"mode": "off"}}',
        VALID + b', "temperature": 1e400}',  # parses as inf
        VALID + b', "seed": ' + b"9" * 5000 + b"}",  # int conversion limit
        b"[" * 100_000 + b"]" * 100_000,  # recursion limit
        VALID + b', "x": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}",
        VALID,  # truncated
        VALID + b"} trailing",
        b'"just a string"',
        b"null",
    ],
    ids=lambda c: repr(c[:40]),
)
def test_broken_bodies_are_400(gateway, content):
    assert_openai_error(chat(gateway, content), 400)


def test_paired_surrogates_and_deep_but_sane_nesting_still_work(gateway):
    emoji = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert chat(gateway, emoji).status_code == 200
    nested = VALID + b', "metadata_x": ' + b"[" * 500 + b"]" * 500 + b"}"
    assert chat(gateway, nested).status_code == 200
    assert chat(gateway, nested, {"X-Pandora-Mode": "off"}).status_code == 200


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Pandora-Mode", "x" * 10_000),
        ("X-Pandora-Mode", "<script>alert(1)</script>"),
        ("X-Pandora-Mode", b"\xff\xfe\xfd"),
        ("X-Pandora-Cost", "1e400"),
        ("X-Pandora-Cost", "-0.0"),
        ("X-Pandora-Cost", "0x10"),
        ("X-Pandora-Cost", "9" * 60),
        ("X-Pandora-Target-Acceptance", "Infinity"),
        ("X-Pandora-Max-Samples", "99999999999999999999999"),
        ("X-Pandora-Max-Samples", "1.0000000001"),
        ("X-Pandora-Max-Samples", "-1"),
        ("X-Pandora-Min-Samples", "1 2"),
        ("X-Pandora-Parallelism", "1" * 64),
        ("X-Pandora-Parallelism", "1e308"),
        ("X-Pandora-Task", "../../etc/passwd"),
        ("X-Pandora-Task", "a b"),
        ("X-Pandora-Task", "t" * 65),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_absurd_control_headers_are_400_naming_the_header(gateway, name, value):
    before = gateway.metric("pandora_requests_total", mode="unknown", status="400")
    error = assert_openai_error(chat(gateway, VALID + b"}", {name: value}), 400)
    assert error["param"] == name
    assert gateway.metric("pandora_requests_total", mode="unknown", status="400") == before + 1


@pytest.mark.parametrize(
    "value", ["x" * 100_000, "a b c", "é" * 50, "../../etc/passwd", "", "<script>"]
)
def test_absurd_request_ids_are_replaced_not_echoed(gateway, value):
    response = chat(gateway, VALID + b"}", {"X-Request-Id": value.encode("latin-1")})
    assert response.status_code == 200
    assert response.headers["X-Request-Id"] != value
    assert len(response.headers["X-Request-Id"]) == 32


# -- body size limit ------------------------------------------------------------------------------
def test_default_body_limit_is_10_mib_with_a_413_in_openai_shape(fake_upstream):
    assert Settings().max_body_bytes == 10 * 1024 * 1024
    server = start_gateway(fake_upstream, FakeReward(), max_samples=1)
    try:
        limit = 10 * 1024 * 1024
        content = b" " * (limit + 1)
        error = assert_openai_error(chat(server, content), 413)
        assert str(limit) in error["message"] and error["code"] == "body_too_large"

        def chunks():  # no Content-Length: counted as it streams in
            for _ in range(11):
                yield b" " * (1024 * 1024)

        response = HTTP.post(server.url + "/v1/chat/completions", content=chunks())
        assert_openai_error(response, 413)
        # the gateway still serves afterwards
        assert chat(server, VALID + b"}").status_code == 200
        assert fake_upstream.request_count == 1
    finally:
        server.stop()


def test_configured_limit_is_exact(fake_upstream):
    server = start_gateway(fake_upstream, FakeReward(), max_samples=1, max_body_bytes=2048)
    try:
        body = VALID + b', "pad": "'
        at_limit = body + b"x" * (2048 - len(body) - 2) + b'"}'
        assert len(at_limit) == 2048
        assert chat(server, at_limit).status_code == 200
        over = body + b"x" * (2049 - len(body) - 2) + b'"}'
        assert_openai_error(chat(server, over), 413)
    finally:
        server.stop()
