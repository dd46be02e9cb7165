"""Mode off: a plain proxy, byte for byte, streamed chunk by chunk."""

from __future__ import annotations

import httpx
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.fakes import Fault

MESSAGES = [{"role": "user", "content": "hi there"}]


def test_off_mode_forwards_the_request_unchanged(gateway_factory, fake_upstream):
    server = gateway_factory(default_mode="off")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, n=2, seed=3, extra_body={"best_of": 2, "top_k": 4}
    )
    completion = raw.parse()
    assert isinstance(completion, ChatCompletion)
    assert completion.id.startswith("chatcmpl-fake-")  # the upstream's own answer
    assert raw.headers["X-Pandora-Mode"] == "off"
    assert "X-Pandora-Samples" not in raw.headers
    (body,) = fake_upstream.requests
    assert body == {"model": "m", "messages": MESSAGES, "n": 2, "seed": 3, "best_of": 2, "top_k": 4}
    assert server.metric("pandora_requests_total", mode="off", status="200") == 1


def test_off_mode_streams_chunk_by_chunk(gateway_factory, fake_upstream):
    server = gateway_factory()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Pandora-Mode": "off"},
            extra_body={"pandora": {"max_samples": 3}},
        )
    )
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("answer ")
    assert chunks[-1].usage.completion_tokens == 6
    (body,) = fake_upstream.requests
    assert "pandora" not in body and body["stream"] is True


def test_off_mode_passes_upstream_errors_through(gateway_factory, fake_upstream):
    server = gateway_factory(default_mode="off")
    fake_upstream.inject(Fault("status", status=429, message="slow down", retry_after=3))
    response = httpx.post(
        server.url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES}
    )
    assert response.status_code == 429
    assert response.json()["error"]["message"] == "slow down"


def test_off_mode_unreachable_upstream_is_502(gateway_factory):
    from tests.fakes import free_port

    server = gateway_factory(default_mode="off", upstream_url=f"http://127.0.0.1:{free_port()}/v1")
    response = httpx.post(
        server.url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES}
    )
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"


def test_off_mode_reuses_connections_and_survives_a_stale_one(gateway_factory, fake_upstream):
    server = gateway_factory(default_mode="off")
    url = server.url + "/v1/chat/completions"
    body = {"model": "m", "messages": MESSAGES}
    for _ in range(3):
        assert httpx.post(url, json=body, timeout=10).status_code == 200
    assert fake_upstream.open_connections == 1  # one keep-alive connection, reused
    # the upstream drops the pooled connection without answering: the gateway retries once
    # on a fresh connection (nothing was processed), the client never notices
    fake_upstream.inject(Fault("close"))
    assert httpx.post(url, json=body, timeout=10).status_code == 200
    assert fake_upstream.request_count == 5


def test_off_mode_broken_and_hanging_streams_end_cleanly(gateway_factory, fake_upstream):
    server = gateway_factory(default_mode="off", request_timeout=0.5)
    url = server.url + "/v1/chat/completions"
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    for fault in ("reset", "hang"):
        fake_upstream.inject(Fault(fault))
        with httpx.stream("POST", url, json=body, timeout=10) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        assert lines and "[DONE]" not in lines[-1]  # the client sees a cut stream, as direct
        assert fake_upstream.wait_idle()
    assert server.metric("pandora_requests_total", mode="off", status="502") == 2
    assert server.metric("pandora_inflight_requests") == 0
    # and the next request works on a fresh connection
    assert httpx.post(url, json={**body, "stream": False}, timeout=10).status_code == 200
