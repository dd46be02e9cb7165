"""Reward API keys: the worker checks them (401, OpenAI's shape), the worker and vLLM clients
send them, and the gateway's ``--reward-api-key`` reaches the worker but nothing the client,
the metrics or the logs show."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry
from reward_fixtures import PROMPT, RESPONSES, load_tiny_scorer, serve

from reward import RewardError, create_backend
from reward.app import create_app
from reward.cli import register
from reward.scorer import RewardScorer
from reward.settings import WorkerSettings
from server.app import create_app as create_gateway
from server.config import Settings
from tests.fakes import ServerThread
from tests.fakes.policies import StopAbove

SECRET = "sk-reward-SECRET-4821"
OTHER = "sk-reward-OTHER-77"
BODY = {"messages": PROMPT, "responses": RESPONSES[:2]}


@pytest.fixture(scope="module")
def scorer() -> RewardScorer:
    return load_tiny_scorer()


def _worker(scorer: RewardScorer, **overrides: object):
    settings = WorkerSettings(model="tiny-rm", device="cpu", dtype="float32", **overrides)
    return create_app(settings, registry=CollectorRegistry(), load_scorer=lambda: scorer)


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 30
    while httpx.get(f"{url}/health").status_code != 200:
        assert time.monotonic() < deadline, "worker never became healthy"
        time.sleep(0.02)


def _assert_401(response: httpx.Response, fragment: str) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_api_key" and error["type"] == "authentication_error"
    assert fragment in error["message"]
    assert response.headers["www-authenticate"] == "Bearer"


def test_worker_requires_a_configured_key(scorer):
    with serve(_worker(scorer, api_key=[SECRET, OTHER])) as url:
        _wait_healthy(url)  # /health needs no key (orchestrator probes)
        assert httpx.get(f"{url}/metrics").status_code == 200  # nor do Prometheus scrapes
        rewards = f"{url}/v1/rewards"
        _assert_401(httpx.post(rewards, json=BODY), "missing API key")
        _assert_401(httpx.post(rewards, json=BODY, headers={"Authorization": "Bearer"}), "missing")
        basic = {"Authorization": f"Basic {SECRET}"}
        _assert_401(httpx.post(rewards, json=BODY, headers=basic), "missing API key")
        wrong = {"Authorization": f"Bearer {SECRET}x"}
        response = httpx.post(rewards, json=BODY, headers=wrong)
        _assert_401(response, "invalid API key")
        assert SECRET not in response.text
        # A bad body without a key is still 401: nothing is parsed for strangers.
        _assert_401(httpx.post(rewards, content=b"{not json"), "missing API key")
        for key in (SECRET, OTHER):
            ok = httpx.post(rewards, json=BODY, headers={"Authorization": f"bearer {key}"})
            assert ok.status_code == 200, ok.text
            assert len(ok.json()["scores"]) == 2


def test_worker_without_keys_is_open_and_keeps_its_fast_path(scorer):
    app = _worker(scorer)
    assert not app.router.dependencies
    with serve(app) as url:
        _wait_healthy(url)
        assert httpx.post(f"{url}/v1/rewards", json=BODY).status_code == 200


def test_worker_client_sends_the_key(scorer):
    async def score(key: str) -> list[float]:
        client = create_backend("worker", url=url, api_key=key, timeout=30)
        try:
            return await client.score(PROMPT, RESPONSES[:3])
        finally:
            await client.aclose()

    with serve(_worker(scorer, api_key=[SECRET])) as url:
        _wait_healthy(url)
        assert len(asyncio.run(score(SECRET))) == 3
        with pytest.raises(RewardError) as caught:
            asyncio.run(score("sk-wrong-key-999"))
    assert "401" in str(caught.value) and "invalid API key" in str(caught.value)
    assert "sk-wrong-key-999" not in str(caught.value)


def test_vllm_client_sends_the_key():
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"data": [{"probs": [0.5]}]})

    async def score() -> list[float]:
        from reward.clients import VLLMRewardClient

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            client = VLLMRewardClient("http://vllm:8000", api_key=SECRET, client=http)
            return await client.score(PROMPT, ["a", "b"])

    assert asyncio.run(score()) == [0.5, 0.5]
    assert seen == [f"Bearer {SECRET}"] * 2


def test_ready_checks_the_key_not_just_health():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        ok = request.headers.get("authorization") == f"Bearer {SECRET}"
        return httpx.Response(200 if ok else 401, json={"data": []})

    async def ready(key: str | None) -> bool:
        from reward.clients import VLLMRewardClient

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await VLLMRewardClient("http://vllm:8000", api_key=key, client=http).ready()

    assert asyncio.run(ready(SECRET)) is True
    assert asyncio.run(ready("sk-wrong")) is False
    assert asyncio.run(ready(None)) is True  # no key: /health is the whole check


def test_one_env_variable_configures_gateway_and_worker(monkeypatch):
    monkeypatch.setenv("PANDORA_REWARD_API_KEY", SECRET)
    gateway = Settings(upstream_url="http://u:1/v1", reward_url="http://w:2")
    assert gateway.reward_api_key is not None
    assert gateway.reward_api_key.get_secret_value() == SECRET
    assert SECRET not in repr(gateway)
    worker = WorkerSettings(model="m")
    assert [k.get_secret_value() for k in worker.api_key] == [SECRET]
    monkeypatch.setenv("PANDORA_REWARD_API_KEY", f"{SECRET}, {OTHER}")
    assert [k.get_secret_value() for k in WorkerSettings(model="m").api_key] == [SECRET, OTHER]


def test_worker_cli_takes_repeated_api_keys(monkeypatch):
    import reward.cli

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["reward-worker", "--model", "m", "--api-key", "a", "--api-key", "b"])
    captured: dict[str, WorkerSettings] = {}

    def fake_create_app(settings, **kwargs):
        captured["settings"] = settings
        raise SystemExit(0)  # stop before uvicorn starts

    monkeypatch.setattr("reward.app.create_app", fake_create_app)
    with pytest.raises(SystemExit):
        reward.cli.run(args)
    assert [k.get_secret_value() for k in captured["settings"].api_key] == ["a", "b"]


def _gateway(upstream_url: str, reward_url: str, key: str) -> ServerThread:
    settings = Settings(
        upstream_url=upstream_url,
        reward_url=reward_url,
        reward_api_key=key,
        max_samples=2,
        retry_backoff=0.01,
        learn_prior=False,
    )
    app = create_gateway(
        settings, policy_factory=lambda plan: StopAbove(1e9, max_samples=plan.max_samples)
    )
    return ServerThread(app)


def test_gateway_scores_with_the_key_and_never_shows_it(scorer, fake_upstream, caplog):
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with serve(_worker(scorer, api_key=[SECRET])) as worker_url:
        _wait_healthy(worker_url)
        with _gateway(fake_upstream.base_url, worker_url, SECRET) as good:
            response = httpx.post(good.url + "/v1/chat/completions", json=chat, timeout=30)
            assert response.status_code == 200, response.text
            assert len(response.json()["pandora"]["rewards"]) == 2
            assert httpx.get(good.url + "/ready").status_code == 200
        wrong = "sk-gateway-WRONG-5150"
        with (
            caplog.at_level(logging.DEBUG),
            _gateway(fake_upstream.base_url, worker_url, wrong) as bad,
        ):
            failed = httpx.post(bad.url + "/v1/chat/completions", json=chat, timeout=30)
            streamed = httpx.post(
                bad.url + "/v1/chat/completions", json={**chat, "stream": True}, timeout=30
            )
            metrics = httpx.get(bad.url + "/metrics").text
            ready = httpx.get(bad.url + "/ready")
    assert failed.status_code == 503
    assert ready.status_code == 503  # a rejected key is not ready (/health alone would say yes)
    assert ready.json()["reward"] is False
    assert "invalid API key" in failed.json()["error"]["message"]
    shown = [
        failed.text,
        json.dumps(dict(failed.headers)),
        streamed.text,
        metrics,
        ready.text,
        caplog.text,
    ]
    for text in shown:
        assert wrong not in text and SECRET not in text
