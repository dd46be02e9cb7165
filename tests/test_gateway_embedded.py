"""The embedded default: in-process generation and scoring with tiny local models."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from server.app import create_app
from server.config import Settings
from server.embedded import LocalChatTransport, LocalGenerator, build_local_reward
from tests.fakes import ServerThread, free_port
from tests.fakes.policies import StopAbove
from tests.tiny_models import build_tiny_chat_model, build_tiny_reward_model

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> tuple[Path, Path]:
    chat = build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"), max_new_tokens=8)
    reward = build_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"))
    return chat, reward


@pytest.fixture(scope="module")
def embedded_gateway(tiny_models):
    chat, reward_path = tiny_models
    settings = Settings(max_samples=3, parallelism=2, device="cpu", keepalive_interval=0.2)
    generator = LocalGenerator.from_pretrained(str(chat), device="cpu")
    upstream = httpx.AsyncClient(
        transport=LocalChatTransport(generator), base_url="http://embedded/v1"
    )
    reward = build_local_reward(settings, str(reward_path))
    app = create_app(
        settings,
        upstream=upstream,
        reward=reward,
        policy_factory=lambda plan: StopAbove(1e9, max_samples=plan.max_samples),
    )
    with ServerThread(app) as server:
        yield server


def test_embedded_non_stream_scores_real_generations(embedded_gateway):
    client = openai.OpenAI(base_url=embedded_gateway.url + "/v1", api_key="x", max_retries=0)
    completion = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, seed=11
    )
    assert isinstance(completion, ChatCompletion)
    pandora = completion.model_extra["pandora"]
    assert pandora["samples"] == 3 and len(pandora["rewards"]) == 3
    assert len(set(pandora["rewards"])) > 1  # a real reward model, different texts
    assert pandora["rewards"][pandora["chosen_index"]] == max(pandora["rewards"])
    assert 3 <= completion.usage.completion_tokens <= 18
    assert completion.usage.prompt_tokens > 0
    again = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, seed=11)
    assert again.choices[0].message.content == completion.choices[0].message.content
    assert again.model_extra["pandora"]["rewards"] == pandora["rewards"]  # seed + i per candidate


def test_embedded_stream_and_pass_through(embedded_gateway):
    client = openai.OpenAI(base_url=embedded_gateway.url + "/v1", api_key="x", max_retries=0)
    chunks = list(
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].model_extra["pandora"]["samples"] == 3
    off = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, extra_headers={"X-Pandora-Mode": "off"}
    )
    assert off.usage.completion_tokens <= 4
    assert [m.id for m in client.models.list().data]
    assert httpx.get(embedded_gateway.url + "/ready").json()["upstream"] is True


def test_pandora_serve_runs_the_embedded_default(tiny_models):
    chat, reward = tiny_models
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server.cli",
            "serve",
            "--generator-model",
            str(chat),
            "--reward-model",
            str(reward),
            "--port",
            str(port),
            "--max-samples",
            "2",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        response = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4},
            headers={"X-Pandora-Mode": "fixed"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert response.headers["X-Pandora-Samples"] == "2"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
