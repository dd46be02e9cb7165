"""HTTP clients: the vLLM ``/classify`` client against a fake server with vLLM's documented shapes,
failure mapping with mock transports, ``create_backend``, and import lightness."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from reward_fixtures import PROMPT, serve

from reward import BACKEND_KINDS, RewardBackend, RewardError, create_backend
from reward.clients import VLLMRewardClient, WorkerRewardClient
from reward.local import LocalRewardBackend

ROOT = Path(__file__).resolve().parents[1]


# -- a fake vLLM pooling server ----------------------------------------------------------------
# Mirrors vllm/entrypoints/pooling/classify/protocol.py: ClassificationChatRequest (model,
# messages, use_activation, ...) answered by ClassificationResponse {id, object, created, model,
# data: [{index, label, probs, num_classes}], usage}. Unknown fields are refused here (vLLM only
# warns), so a misspelt field name fails the test instead of silently applying the sigmoid.


class _ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class _ClassificationChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    messages: list[_ChatMessage]
    use_activation: bool | None = None
    add_generation_prompt: bool = False


def fake_logit(response: str) -> float:
    return len(response) / 4 - 3.0


def fake_vllm(served_model: str = "org/reward-model") -> FastAPI:
    app = FastAPI()
    app.state.requests = []
    app.state.in_flight = app.state.max_in_flight = 0

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.post("/classify")
    async def classify(request: Request) -> JSONResponse:
        try:
            body = _ClassificationChatRequest.model_validate(await request.json())
        except ValidationError as exc:
            message = exc.errors()[0]["msg"]
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"error": error}, status_code=400)
        if body.model not in (None, served_model):
            error = {"message": f"The model `{body.model}` does not exist.", "type": "NotFound"}
            return JSONResponse({"error": error, "code": 404}, status_code=404)
        app.state.requests.append(body)
        app.state.in_flight += 1
        app.state.max_in_flight = max(app.state.max_in_flight, app.state.in_flight)
        await asyncio.sleep(0.02)
        app.state.in_flight -= 1
        last = body.messages[-1]
        logit = fake_logit(last.content) if last.role == "assistant" else 99.0
        activated = body.use_activation is None or body.use_activation
        prob = 1 / (1 + math.exp(-logit)) if activated else logit
        return JSONResponse(
            {
                "id": "classify-123",
                "object": "list",
                "created": int(time.time()),
                "model": served_model,
                "data": [{"index": 0, "label": "LABEL_0", "probs": [prob], "num_classes": 1}],
                "usage": {"prompt_tokens": 10, "total_tokens": 10, "completion_tokens": 0},
            }
        )

    return app


def test_vllm_client_sends_the_dialogue_with_use_activation_false_and_reads_raw_logits() -> None:
    app = fake_vllm()
    responses = ["Paris.", "It is Paris, on the Seine.", "x", "Lyon, I believe"]

    async def use(url: str) -> list[float]:
        client = create_backend("vllm", url=url, model="org/reward-model")
        try:
            assert await client.ready()
            return await client.score(PROMPT, responses)
        finally:
            await client.aclose()

    with serve(app) as url:
        scores = asyncio.run(use(url))
    assert scores == pytest.approx([fake_logit(r) for r in responses])
    assert any(score < 0 for score in scores)  # raw logits, not sigmoid probabilities
    sent = app.state.requests
    assert len(sent) == len(responses)
    assert all(body.use_activation is False and body.model == "org/reward-model" for body in sent)
    assert all([m.model_dump() for m in body.messages[:-1]] == PROMPT for body in sent)
    assert sorted(body.messages[-1].content for body in sent) == sorted(responses)
    assert app.state.max_in_flight > 1  # one request per response, sent concurrently


def test_vllm_client_reports_server_errors_and_malformed_answers() -> None:
    app = fake_vllm()

    async def use(url: str) -> None:
        wrong_model = VLLMRewardClient(url, model="someone/else", timeout=5)
        try:
            with pytest.raises(RewardError, match=r"404.*does not exist"):
                await wrong_model.score(PROMPT, ["a", "b"])
        finally:
            await wrong_model.aclose()

    with serve(app) as url:
        asyncio.run(use(url))

    def no_probs(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"index": 0}]})

    def two_probs(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"index": 0, "probs": [0.5, 0.25]}]})

    def nan_probs(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"data": [{"index": 0, "probs": [NaN]}]}')

    async def malformed() -> None:
        for handler, match in (
            (no_probs, "data\\[0\\].probs"),
            (nan_probs, "non-finite"),
        ):
            async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
                with pytest.raises(RewardError, match=match):
                    await VLLMRewardClient("http://vllm", client=http).score(PROMPT, ["a"])
        async with httpx.AsyncClient(transport=httpx.MockTransport(two_probs)) as http:
            # a multi-label answer: the first probability is the score, as documented
            assert await VLLMRewardClient("http://vllm", client=http).score(PROMPT, ["a"]) == [0.5]

    asyncio.run(malformed())


def _mock_worker(handler: Any) -> tuple[WorkerRewardClient, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return WorkerRewardClient("http://worker/", client=http, api_key="sekret", timeout=3), http


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (httpx.Response(200, json={"scores": [1.0]}), "1 scores for 2 responses"),
        (httpx.Response(200, content=b'{"scores": [1.0, Infinity]}'), "non-finite"),
        (httpx.Response(200, json={"scores": [1.0, "2"]}), "non-numeric"),
        (httpx.Response(200, json={"oops": True}), "without a list of scores"),
        (httpx.Response(200, content=b"<html>"), "invalid JSON"),
        (
            httpx.Response(500, json={"error": {"message": "forward pass failed: OOM"}}),
            "500: forward pass failed: OOM",
        ),
        (httpx.Response(503, text="upstream connect error"), "503: upstream connect error"),
    ],
)
def test_worker_client_turns_every_bad_answer_into_reward_error(
    answer: httpx.Response, match: str
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer

    async def use() -> None:
        client, http = _mock_worker(handler)
        async with http:
            with pytest.raises(RewardError, match=match):
                await client.score(PROMPT, ["a", "b"])
            await client.aclose()  # an injected client is not closed by the backend
            assert not http.is_closed

    asyncio.run(use())
    assert str(seen[0].url) == "http://worker/v1/rewards"
    assert seen[0].headers["authorization"] == "Bearer sekret"
    assert json.loads(seen[0].content) == {"messages": PROMPT, "responses": ["a", "b"]}


def test_worker_client_timeout_is_reward_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    async def use() -> None:
        client, http = _mock_worker(handler)
        async with http:
            with pytest.raises(RewardError, match="timed out after 3s"):
                await client.score(PROMPT, ["a"])
            assert not await client.ready()

    asyncio.run(use())


def test_create_backend_builds_each_kind_and_refuses_bad_arguments() -> None:
    async def build() -> None:
        for kind, kwargs, cls in (
            ("worker", {"url": "http://w:8081"}, WorkerRewardClient),
            ("vllm", {"url": "http://v:8000", "model": "m"}, VLLMRewardClient),
            ("local", {"model": "/models/rm", "device": "cpu"}, LocalRewardBackend),
        ):
            backend = create_backend(kind, **kwargs)
            assert isinstance(backend, cls) and isinstance(backend, RewardBackend)
            await backend.aclose()

    asyncio.run(build())
    assert BACKEND_KINDS == ("worker", "vllm", "local")
    for kind, kwargs, message in (
        ("triton", {"url": "http://x"}, "unknown reward backend 'triton'"),
        ("worker", {}, "needs a url"),
        ("vllm", {"model": "m"}, "needs a url"),
        ("local", {"url": "http://x"}, "needs a model"),
    ):
        with pytest.raises(ValueError, match=message) as caught:
            create_backend(kind, **kwargs)
        assert "\n" not in str(caught.value)


def test_importing_reward_and_its_clients_loads_no_torch_or_transformers() -> None:
    code = (
        "import sys, reward, reward.clients, reward.local, reward.cli\n"
        "heavy = {'torch', 'transformers', 'fastapi'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "import reward as r\n"
        "assert 'httpx' not in sys.modules or 'reward.clients' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    bare = "import sys, reward\nassert not {'torch', 'httpx'} & set(sys.modules)\n"
    subprocess.run([sys.executable, "-c", bare], check=True, cwd=ROOT)
