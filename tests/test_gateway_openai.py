"""The gateway through the official `openai` client (uvicorn on loopback, fake upstream)."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.fakes import FakeReward, FakeUpstream
from tests.fakes.policies import StopAbove
from tests.fakes.upstream import quality_for_seed
from tests.reliability_fakes import eventually

MESSAGES = [{"role": "user", "content": "Say something nice"}]


def never_stop(plan):
    return StopAbove(99.0, max_samples=plan.max_samples)


@pytest.fixture
def client(gateway_factory) -> openai.OpenAI:
    server = gateway_factory(policy_factory=never_stop, max_samples=6, parallelism=3)
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_non_stream_returns_the_best_of_all_candidates(client, fake_upstream: FakeUpstream):
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, seed=100, temperature=0.7
    )
    completion = raw.parse()
    assert isinstance(completion, ChatCompletion)
    ChatCompletion.model_validate(completion.model_dump())
    qualities = [quality_for_seed(100 + i) for i in range(6)]
    best = max(qualities)
    assert completion.choices[0].message.content.startswith(f"answer {best:.6f}")
    extra = completion.model_extra["pandora"]
    assert extra["samples"] == 6 and extra["stop_reason"] == "budget"
    assert sorted(extra["rewards"]) == sorted(qualities)
    assert extra["rewards"][extra["chosen_index"]] == best
    assert raw.headers["X-Pandora-Samples"] == "6"
    assert raw.headers["X-Pandora-Stop-Reason"] == "budget"
    assert raw.headers["X-Pandora-Mode"] == "adaptive"
    assert float(raw.headers["X-Pandora-Reward"]) == pytest.approx(best, abs=1e-5)
    assert raw.headers["X-Request-Id"]
    # usage covers every candidate: 6 completions of 6 tokens, 6 prompts of 3 words
    assert completion.usage.completion_tokens == 36
    assert completion.usage.prompt_tokens == 18
    assert completion.usage.total_tokens == 54


def test_each_candidate_is_its_own_n1_streamed_request_with_seed_plus_i(
    client, fake_upstream: FakeUpstream
):
    client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        seed=7,
        n=1,
        temperature=0.3,
        top_p=0.9,
        max_tokens=20,
        stop=["\n\n"],
        extra_body={"best_of": 4, "top_k": 5, "chat_template_kwargs": {"enable_thinking": False}},
    )
    bodies = fake_upstream.requests
    assert len(bodies) == 6
    assert sorted(b["seed"] for b in bodies) == [7, 8, 9, 10, 11, 12]
    for body in bodies:
        assert body["n"] == 1 and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert "best_of" not in body and "pandora" not in body
        assert body["temperature"] == 0.3 and body["top_p"] == 0.9 and body["max_tokens"] == 20
        assert body["stop"] == ["\n\n"] and body["top_k"] == 5
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["messages"] == MESSAGES and body["model"] == "m"
    assert fake_upstream.max_active_streams <= 3  # parallelism


def test_stream_replays_the_chosen_candidate_as_chunks(client):
    stream = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        seed=100,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    for chunk in chunks:
        assert isinstance(chunk, ChatCompletionChunk)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    best = max(quality_for_seed(100 + i) for i in range(6))
    assert text.startswith(f"answer {best:.6f}")
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop" and all(f is None for f in finish[:-1])
    assert chunks[-2].model_extra["pandora"]["samples"] == 6
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 36
    assert len({c.id for c in chunks}) == 1


def test_stream_without_include_usage_has_no_usage_chunk(client):
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert all(c.choices for c in chunks)
    assert chunks[-1].model_extra["pandora"]["stop_reason"] == "budget"
    assert chunks[-1].model_extra["pandora"]["task"] is None


def test_the_task_is_echoed_in_the_pandora_object_streamed_or_not(client):
    task = {"pandora": {"task": "code:python"}}
    chunks = list(
        client.chat.completions.create(model="m", messages=MESSAGES, stream=True, extra_body=task)
    )
    assert chunks[-1].model_extra["pandora"]["task"] == "code:python"
    completion = client.chat.completions.create(
        model="m", messages=MESSAGES, extra_headers={"X-Pandora-Task": "chat"}
    )
    assert completion.model_extra["pandora"]["task"] == "chat"


def test_extra_headers_and_extra_body_control_sampling(client, fake_upstream):
    raw = client.chat.completions.with_raw_response.create(
        model="m",
        messages=MESSAGES,
        extra_headers={"X-Pandora-Max-Samples": "2", "X-Request-Id": "my-request-1"},
        extra_body={"pandora": {"max_samples": 5, "parallelism": 1}},
    )
    assert raw.headers["X-Pandora-Samples"] == "2"  # the header wins over the body
    assert raw.headers["X-Request-Id"] == "my-request-1"
    assert fake_upstream.request_count == 2 and fake_upstream.max_active_streams == 1
    completion = client.chat.completions.create(
        model="m", messages=MESSAGES, extra_body={"pandora": {"max_samples": 3}}
    )
    assert completion.model_extra["pandora"]["samples"] == 3


def test_n_returns_the_n_best_distinct_candidates_best_first(client):
    completion = client.chat.completions.create(model="m", messages=MESSAGES, seed=5, n=3)
    qualities = sorted((quality_for_seed(5 + i) for i in range(6)), reverse=True)
    got = [float(c.message.content.split()[1]) for c in completion.choices]
    assert got == pytest.approx(qualities[:3], abs=1e-6)
    assert [c.index for c in completion.choices] == [0, 1, 2]


def test_distinct_replies_come_first_and_repeats_only_fill_up_to_n(gateway_factory, fake_upstream):
    """Two distinct replies among four candidates: n = 2 returns both, n = 3 adds the best
    repeat (an OpenAI client is owed n choices), never one that was not scored."""
    fake_upstream.content = lambda body, index: "answer 0.5 same" if index % 2 else "answer 0.1 x"
    server = gateway_factory(policy_factory=never_stop, max_samples=4)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    completion = client.chat.completions.create(model="m", messages=MESSAGES, n=2)
    assert [c.message.content for c in completion.choices] == ["answer 0.5 same", "answer 0.1 x"]
    completion = client.chat.completions.create(model="m", messages=MESSAGES, n=3)
    assert [c.message.content for c in completion.choices] == [
        "answer 0.5 same",
        "answer 0.1 x",
        "answer 0.5 same",
    ]
    assert [c.index for c in completion.choices] == [0, 1, 2]


def test_a_repeated_reply_takes_its_earlier_score_without_a_reward_call(
    gateway_factory, fake_upstream, fake_reward: FakeReward
):
    """A generator that repeats itself (three distinct replies in eight candidates, the copies
    arriving in the same batch as their first and in later ones): the reward model scores each
    distinct reply once, the policy still sees eight rewards in launch order, identical replies
    tie exactly, and the copies are counted."""
    replies = ["answer 0.2 a", "answer 0.7 b", "answer 0.2 a", "answer 0.4 c"]
    fake_upstream.content = lambda body, index: replies[body["seed"] % 4]
    seen: list[float] = []

    def recording(plan):
        policy = StopAbove(99.0, max_samples=plan.max_samples)
        observe = policy.observe
        policy.observe = lambda reward: seen.append(reward) or observe(reward)
        return policy

    server = gateway_factory(policy_factory=recording, max_samples=8, parallelism=4)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, seed=0)
    assert raw.parse().choices[0].message.content == "answer 0.7 b"
    assert raw.parse().model_extra["pandora"]["samples"] == 8
    assert sorted(text for batch in fake_reward.calls for text in batch) == sorted(set(replies))
    assert sorted(seen) == [0.2] * 4 + [0.4] * 2 + [0.7] * 2
    assert server.metric("pandora_repeated_candidates_total") == 5
    assert server.metric("pandora_candidates_total", outcome="scored") == 8


def test_policy_stop_cancels_the_rest_and_reports_it(gateway_factory, fake_upstream):
    # candidate 0 is fast and good enough; the others are slow and get cancelled.
    fake_upstream.token_delay_rule = lambda index, body: 0.0 if body["seed"] == 0 else 0.5
    server = gateway_factory(
        policy_factory=lambda plan: StopAbove(0.0, max_samples=plan.max_samples),
        max_samples=8,
        parallelism=4,
    )
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, seed=0)
    extra = raw.parse().model_extra["pandora"]
    assert extra["samples"] == 1 and extra["cancelled"] == 3
    assert extra["stop_reason"] == "threshold" and extra["threshold"] == 0.0
    assert raw.headers["X-Pandora-Stop-Reason"] == "threshold"
    assert fake_upstream.wait_idle(2.0), "cancelled candidates are still streaming upstream"
    # the slow candidates' streams may start upstream only after the stop (a loaded machine):
    # wait for their end to be counted; a leaked stream would run ~4 s and complete instead
    aborted = eventually(lambda: fake_upstream.aborted_streams == 3, 2.0)
    assert aborted, fake_upstream.aborted_streams
    assert fake_upstream.request_count == 4
    assert server.metric("pandora_candidates_total", outcome="cancelled") == 3
    assert server.metric("pandora_candidates_total", outcome="scored") == 1
    assert server.metric("pandora_inflight_candidates") == 0
    assert server.metric("pandora_inflight_requests") == 0


def test_models_and_health_and_ready(client, gateway_factory, fake_reward: FakeReward):
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    import httpx

    base = str(client.base_url).removesuffix("/v1/")
    assert httpx.get(base + "/health").json() == {"status": "ok"}
    assert httpx.get(base + "/ready").status_code == 200
    fake_reward.is_ready = False
    ready = httpx.get(base + "/ready")
    assert ready.status_code == 503 and ready.json()["reward"] is False
