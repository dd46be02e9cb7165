"""The embedded generator honours the request (stop, max_tokens, temperature, top_p, seed) and
refuses, with a 400 naming the field, what it cannot do (tools, logprobs, structured output)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from server.app import create_app
from server.config import Settings
from server.embedded import LocalChatTransport, LocalGenerator, build_local_reward
from server.embedded_request import StopMatcher, check_supported
from tests.fakes import ServerThread
from tests.fakes.policies import StopAbove
from tests.tiny_models import tiny_chat_model_path, tiny_reward_model_path

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def transport() -> LocalChatTransport:
    generator = LocalGenerator.from_pretrained(str(tiny_chat_model_path()), device="cpu")
    return LocalChatTransport(generator)


def post(transport: LocalChatTransport, **fields: Any) -> httpx.Response:
    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://e/v1") as client:
            body = {"model": "tiny", "messages": MESSAGES, **fields}
            if not fields.get("stream"):
                response = await client.post("/chat/completions", json=body)
                await response.aread()
                return response
            async with client.stream("POST", "/chat/completions", json=body) as response:
                await response.aread()
                return response

    return asyncio.run(run())


def content(response: httpx.Response) -> tuple[str, str, int]:
    assert response.status_code == 200, response.text
    data = response.json()
    choice = data["choices"][0]
    return choice["message"]["content"], choice["finish_reason"], data["usage"]["completion_tokens"]


def streamed(response: httpx.Response) -> tuple[list[str], str | None]:
    pieces: list[str] = []
    finish = None
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices", []):
            if choice["delta"].get("content"):
                pieces.append(choice["delta"]["content"])
            finish = choice["finish_reason"] or finish
    return pieces, finish


def _stop_inside(text: str) -> tuple[str, int]:
    """A two-character stop string first occurring inside ``text`` (not at the start)."""
    for i in range(2, len(text) - 2):
        candidate = text[i : i + 2]
        if "\ufffd" not in candidate and text.find(candidate) == i:
            return candidate, i
    pytest.skip(f"no usable stop string in the tiny model's output {text!r}")


def test_max_tokens_and_seed_are_honoured(transport):
    text, finish, tokens = content(post(transport, seed=5, max_tokens=7))
    assert (finish, tokens) == ("length", 7)
    assert content(post(transport, seed=5, max_tokens=7))[0] == text  # same seed, same reply
    assert content(post(transport, seed=6, max_tokens=7))[0] != text
    # max_completion_tokens wins over the deprecated max_tokens, as in OpenAI's API
    assert content(post(transport, seed=5, max_tokens=3, max_completion_tokens=5))[2] == 5


def test_temperature_zero_and_tiny_top_p_are_greedy(transport):
    greedy = content(post(transport, temperature=0, seed=1, max_tokens=10))[0]
    assert content(post(transport, temperature=0, seed=2, max_tokens=10))[0] == greedy
    nucleus = content(post(transport, temperature=1.0, top_p=1e-6, seed=3, max_tokens=10))[0]
    assert nucleus == greedy  # only the most likely token survives
    sampled = content(post(transport, temperature=1.0, seed=3, max_tokens=10))[0]
    assert sampled != greedy


@pytest.mark.parametrize("as_list", [False, True])
def test_stop_cuts_before_the_stop_string(transport, as_list):
    full = content(post(transport, seed=9, max_tokens=24))[0]
    stop, at = _stop_inside(full)
    stops: Any = ["never-generated-xyz", stop] if as_list else stop
    text, finish, tokens = content(post(transport, seed=9, max_tokens=24, stop=stops))
    assert text == full[:at]
    assert finish == "stop" and tokens < 24
    pieces, finish = streamed(post(transport, seed=9, max_tokens=24, stop=stops, stream=True))
    assert "".join(pieces) == full[:at] and finish == "stop"


def test_held_back_prefix_is_released_when_no_stop_follows(transport):
    full = content(post(transport, seed=9, max_tokens=24))[0]
    # A stop string that starts like the reply's last character but never completes.
    stop = full[-1] + "\x00never"
    pieces, finish = streamed(post(transport, seed=9, max_tokens=24, stop=stop, stream=True))
    assert "".join(pieces) == full and finish == "length"


def test_stop_matcher_holds_back_possible_prefixes():
    matcher = StopMatcher(["END", "##"])
    assert matcher.cut("abc EN") == ("abc ", False)
    assert matcher.cut("abc #") == ("abc ", False)
    assert matcher.cut("abc E x") == ("abc E x", False)
    assert matcher.cut("abc ## END") == ("abc ", True)
    assert matcher.cut("ENDING") == ("", True)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": "5"}, "max_completion_tokens"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content",
        ),
    ],
)
def test_unsupported_fields_are_refused_by_name(transport, fields, param):
    response = post(transport, **fields)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(param)


def test_harmless_defaults_are_accepted():
    check_supported(
        {
            "messages": MESSAGES,
            "tool_choice": "none",
            "logprobs": False,
            "response_format": {"type": "text"},
            "presence_penalty": 0,
            "frequency_penalty": 0.0,
            "stop": [],
            "modalities": ["text"],
        }
    )


@pytest.fixture(scope="module")
def embedded_gateway(transport):
    settings = Settings(max_samples=2, parallelism=2, device="cpu", keepalive_interval=0.2)
    upstream = httpx.AsyncClient(transport=transport, base_url="http://embedded/v1")
    reward = build_local_reward(settings, str(tiny_reward_model_path()))
    app = create_app(
        settings,
        upstream=upstream,
        reward=reward,
        policy_factory=lambda plan: StopAbove(1e9, max_samples=plan.max_samples),
    )
    with ServerThread(app) as server:
        yield server


def test_gateway_answers_400_naming_the_field(embedded_gateway):
    client = openai.OpenAI(base_url=embedded_gateway.url + "/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as sampled:
        client.chat.completions.create(model="tiny", messages=MESSAGES, tools=tools)
    assert "tools" in sampled.value.message
    with pytest.raises(openai.BadRequestError) as passed:
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, logprobs=True, extra_headers={"X-Pandora-Mode": "off"}
        )
    assert passed.value.body["param"] == "logprobs"


def test_gateway_candidates_honour_stop(embedded_gateway, transport):
    full = content(post(transport, seed=21, max_tokens=24))[0]
    stop, at = _stop_inside(full)
    client = openai.OpenAI(base_url=embedded_gateway.url + "/v1", api_key="x", max_retries=0)
    completion = client.chat.completions.create(
        model="tiny", messages=MESSAGES, seed=21, max_tokens=24, stop=stop, temperature=1.0
    )
    candidates = completion.model_extra["pandora"]["samples"]
    assert candidates == 2
    assert stop not in completion.choices[0].message.content
    off = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        seed=21,
        max_tokens=24,
        stop=stop,
        extra_headers={"X-Pandora-Mode": "off"},
    )
    assert off.choices[0].message.content == full[:at]
    assert off.choices[0].finish_reason == "stop"
