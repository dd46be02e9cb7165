"""A real OpenAI-compatible upstream not written here: `transformers serve <tiny local model>`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import httpx
import openai
import pytest

from tests.fakes import FakeReward, free_port
from tests.fakes.gateway import start_gateway
from tests.fakes.policies import StopAbove
from tests.tiny_models import build_tiny_chat_model


@pytest.fixture(scope="module")
def transformers_serve(tmp_path_factory):
    executable = shutil.which("transformers")
    assert executable, "the transformers CLI is part of the dev install"
    model = build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-serve"), max_new_tokens=8)
    port = free_port()
    log = tmp_path_factory.mktemp("ts-log") / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                executable,
                "serve",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--device",
                "cpu",
            ],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 150
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "transformers serve did not start"
            time.sleep(0.3)
        yield base + "/v1", str(model)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_gateway_over_transformers_serve(transformers_serve):
    upstream_url, model = transformers_serve
    reward = FakeReward(scorer=lambda text: float(len(text)))

    class NoFake:  # start_gateway only needs the base URL
        base_url = upstream_url

    server = start_gateway(
        NoFake(),  # type: ignore[arg-type]
        reward,
        policy_factory=lambda plan: StopAbove(1e9, max_samples=plan.max_samples),
        max_samples=3,
        parallelism=2,
        request_timeout=60,
    )
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=6, seed=1
        )
        completion = raw.parse()
        pandora = completion.model_extra["pandora"]
        assert raw.headers["X-Pandora-Samples"] == "3" and pandora["failed"] == 0
        texts = [batch for call in reward.calls for batch in call]
        assert len(texts) == 3
        assert completion.choices[0].message.content == max(texts, key=len)
        # usage summed over the three candidates, as transformers serve reported it
        assert 3 <= completion.usage.completion_tokens <= 18
        assert completion.usage.prompt_tokens > 0
        chunks = list(
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
            )
        )
        assert chunks[-1].model_extra["pandora"]["samples"] == 3
        assert server.metric("pandora_upstream_errors_total", kind="protocol") == 0
    finally:
        server.stop()
