"""The reward worker over real HTTP (uvicorn on a free port) with a tiny random-weight model."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import httpx
import pytest
from prometheus_client import CollectorRegistry
from reward_fixtures import PROMPT, RESPONSES, load_tiny_scorer, serve

from reward import RewardError, create_backend
from reward.app import create_app
from reward.clients import WorkerRewardClient
from reward.scorer import RewardScorer
from reward.settings import WorkerSettings


@pytest.fixture(scope="module")
def scorer() -> RewardScorer:
    # pad == end-of-turn: the configuration where naive batching scores the wrong token.
    return load_tiny_scorer(pad_is_end_of_turn=True)


def _settings(**overrides: object) -> WorkerSettings:
    return WorkerSettings(model="tiny-rm", device="cpu", dtype="float32", **overrides)


def _alone(scorer: RewardScorer, responses: Sequence[str], prompt: list | None = None) -> list:
    return [scorer.forward([scorer.encode(prompt or PROMPT, r).ids])[0] for r in responses]


def _wait_healthy(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/health").status_code != 200:
        assert time.monotonic() < deadline, "worker never became healthy"
        time.sleep(0.02)


def _assert_error(response: httpx.Response, status: int, param: str | None, fragment: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert fragment in error["message"]


def test_health_is_503_while_loading_then_200(scorer: RewardScorer) -> None:
    release = threading.Event()

    def slow_load() -> RewardScorer:
        release.wait(20)
        return scorer

    with serve(create_app(_settings(), load_scorer=slow_load)) as url:
        try:
            loading = httpx.get(f"{url}/health")
            _assert_error(loading, 503, None, "loading")
            assert loading.json()["error"]["type"] == "service_unavailable"
            early = httpx.post(f"{url}/v1/rewards", json={"messages": PROMPT, "responses": ["a"]})
            assert early.status_code == 503
        finally:
            release.set()
        _wait_healthy(url)
        assert httpx.get(f"{url}/health").json() == {"status": "ok", "model": "tiny-rm"}


def test_scores_equal_one_at_a_time_scores_and_are_deterministic(scorer: RewardScorer) -> None:
    registry = CollectorRegistry()
    with serve(create_app(_settings(), registry=registry, load_scorer=lambda: scorer)) as url:
        _wait_healthy(url)
        body = {"messages": PROMPT, "responses": RESPONSES}
        first = httpx.post(f"{url}/v1/rewards", json=body).json()
        second = httpx.post(f"{url}/v1/rewards", json=body).json()
    assert first["model"] == "tiny-rm"
    assert first["scores"] == pytest.approx(_alone(scorer, RESPONSES), abs=1e-4)
    assert second["scores"] == first["scores"]
    assert first["truncated"] == [False] * len(RESPONSES)
    lengths = [len(scorer.encode(PROMPT, r).ids) for r in RESPONSES]
    assert first["usage"] == {"prompt_tokens": sum(lengths)}
    assert registry.get_sample_value("pandora_reward_items_scored_total") == 2 * len(RESPONSES)
    assert registry.get_sample_value("pandora_reward_model_loaded") == 1


def test_concurrent_requests_are_batched_and_answered_in_their_own_order(
    scorer: RewardScorer,
) -> None:
    registry = CollectorRegistry()
    app = create_app(
        _settings(max_wait_ms=50, max_batch_size=64), registry=registry, load_scorer=lambda: scorer
    )
    requests = [[f"answer {i}: " + "Paris " * (i * 7 % 40), f"short {i}"] for i in range(16)]

    async def fire(url: str) -> list[list[float]]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            replies = await asyncio.gather(
                *(
                    client.post("/v1/rewards", json={"messages": PROMPT, "responses": responses})
                    for responses in requests
                )
            )
        return [reply.json()["scores"] for reply in replies]

    with serve(app) as url:
        _wait_healthy(url)
        results = asyncio.run(fire(url))
        metrics_text = httpx.get(f"{url}/metrics").text
    for responses, scores in zip(requests, results, strict=True):
        assert scores == pytest.approx(_alone(scorer, responses), abs=1e-4)
    passes = registry.get_sample_value("pandora_reward_batch_size_count")
    items = registry.get_sample_value("pandora_reward_batch_size_sum")
    singles = registry.get_sample_value("pandora_reward_batch_size_bucket", {"le": "1.0"})
    assert items == 32
    assert passes < 16, f"{passes} forward passes for 32 items: requests were not batched"
    assert singles < passes or passes == 1
    assert registry.get_sample_value("pandora_reward_queue_wait_seconds_count") == 32
    for name in ("batch_size", "queue_wait_seconds", "forward_seconds", "items_scored_total"):
        assert f"pandora_reward_{name}" in metrics_text
    assert 'pandora_reward_errors_total{kind="forward"} 0.0' in metrics_text


def test_bad_inputs_are_answered_in_openai_error_shape(scorer: RewardScorer) -> None:
    registry = CollectorRegistry()
    app = create_app(_settings(max_responses=3), registry=registry, load_scorer=lambda: scorer)
    with serve(app) as url:
        _wait_healthy(url)
        post = lambda body: httpx.post(f"{url}/v1/rewards", json=body)  # noqa: E731
        _assert_error(post({"messages": PROMPT, "responses": []}), 400, "responses", "empty")
        _assert_error(post({"messages": [], "responses": ["a"]}), 400, "messages", "empty")
        too_many = post({"messages": PROMPT, "responses": ["a"] * 4})
        _assert_error(too_many, 400, "responses", "at most 3")
        malformed = httpx.post(
            f"{url}/v1/rewards",
            content=b'{"messages": [{"role": "user"',
            headers={"content-type": "application/json"},
        )
        _assert_error(malformed, 422, None, "not valid JSON")
        wrong_type = post({"messages": PROMPT, "responses": [1]})
        _assert_error(wrong_type, 422, "responses.0", "valid string")
        _assert_error(post({"messages": PROMPT}), 422, "responses", "required")
        image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
        _assert_error(post({"messages": image, "responses": ["a"]}), 400, "messages", "image_url")
        ok = post({"messages": PROMPT, "responses": ["Paris."]})
    assert ok.status_code == 200
    assert registry.get_sample_value("pandora_reward_errors_total", {"kind": "invalid"}) == 7


class FailingScorer(RewardScorer):
    """Fails any forward pass that contains the word BOOM, like a device error on one input."""

    def forward(self, batch: Sequence[Sequence[int]]) -> list[float]:
        if any("BOOM" in self.tokenizer.decode(ids) for ids in batch):
            raise RuntimeError("simulated device failure")
        return super().forward(batch)


def test_failing_forward_answers_500_and_the_worker_keeps_serving(scorer: RewardScorer) -> None:
    failing = FailingScorer(scorer.model, scorer.tokenizer, name="tiny-rm")
    registry = CollectorRegistry()
    app = create_app(_settings(max_wait_ms=50), registry=registry, load_scorer=lambda: failing)

    async def together(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return await asyncio.gather(
                client.post("/v1/rewards", json={"messages": PROMPT, "responses": ["BOOM"]}),
                client.post("/v1/rewards", json={"messages": PROMPT, "responses": ["Paris."]}),
            )

    with serve(app) as url:
        _wait_healthy(url)
        broken, fine = asyncio.run(together(url))
        after = httpx.post(f"{url}/v1/rewards", json={"messages": PROMPT, "responses": ["Lyon"]})
        health = httpx.get(f"{url}/health")
    _assert_error(broken, 500, None, "simulated device failure")
    assert broken.json()["error"]["type"] == "server_error"
    assert fine.status_code == 200  # batched with the failing request, yet answered
    assert fine.json()["scores"] == pytest.approx(_alone(scorer, ["Paris."]), abs=1e-4)
    assert after.status_code == 200 and health.status_code == 200
    assert registry.get_sample_value("pandora_reward_errors_total", {"kind": "request"}) == 1
    assert registry.get_sample_value("pandora_reward_errors_total", {"kind": "forward"}) >= 1


def test_overlong_pairs_are_truncated_and_flagged(scorer: RewardScorer) -> None:
    registry = CollectorRegistry()
    app = create_app(
        _settings(max_length=48),
        registry=registry,
        load_scorer=lambda: RewardScorer(
            scorer.model, scorer.tokenizer, name="tiny-rm", max_length=48
        ),
    )
    with serve(app) as url:
        _wait_healthy(url)
        reply = httpx.post(
            f"{url}/v1/rewards",
            json={"messages": PROMPT[1:], "responses": ["Paris.", "very long " * 50 + "end"]},
        ).json()
    assert reply["truncated"] == [False, True]
    assert reply["usage"]["prompt_tokens"] <= 2 * 48
    assert registry.get_sample_value("pandora_reward_truncated_total") == 1


def test_worker_client_scores_through_the_worker_and_maps_failures(
    scorer: RewardScorer,
) -> None:
    app = create_app(_settings(max_responses=2), load_scorer=lambda: scorer)

    async def use(url: str) -> None:
        client = create_backend("worker", url=url, timeout=10)
        assert isinstance(client, WorkerRewardClient)
        try:
            assert await client.ready()
            scores = await client.score(PROMPT, RESPONSES[:2])
            assert scores == pytest.approx(_alone(scorer, RESPONSES[:2]), abs=1e-4)
            assert await client.score(PROMPT, []) == []
            with pytest.raises(RewardError, match=r"400.*at most 2"):
                await client.score(PROMPT, ["a", "b", "c"])
        finally:
            await client.aclose()

    with serve(app) as url:
        _wait_healthy(url)
        asyncio.run(use(url))

    async def unreachable() -> None:  # the server above is gone: its port refuses connections
        client = WorkerRewardClient(url, timeout=2)
        try:
            assert not await client.ready()
            with pytest.raises(RewardError, match="unreachable"):
                await client.score(PROMPT, ["a"])
        finally:
            await client.aclose()

    asyncio.run(unreachable())


def test_on_loaded_runs_once_after_the_model_loads(scorer: RewardScorer) -> None:
    release = threading.Event()
    calls: list[float] = []

    def slow_load() -> RewardScorer:
        release.wait(20)
        return scorer

    app = create_app(_settings(), load_scorer=slow_load, on_loaded=lambda: calls.append(1))
    with serve(app) as url:
        time.sleep(0.1)
        assert calls == []  # still loading
        release.set()
        _wait_healthy(url)
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        httpx.post(f"{url}/v1/rewards", json={"messages": PROMPT, "responses": ["a"]})
    assert calls == [1]


def test_worker_cli_freezes_the_heap_once_loaded(monkeypatch) -> None:
    import argparse

    import reward.cli

    parser = argparse.ArgumentParser()
    reward.cli.register(parser.add_subparsers())
    args = parser.parse_args(["reward-worker", "--model", "m"])
    captured: dict[str, object] = {}

    def fake_create_app(settings, **kwargs):
        captured.update(kwargs)
        raise SystemExit(0)  # stop before uvicorn starts

    monkeypatch.setattr("reward.app.create_app", fake_create_app)
    with pytest.raises(SystemExit):
        reward.cli.run(args)
    assert captured["on_loaded"] is reward.cli.freeze_heap


def test_a_failing_on_loaded_hook_is_logged_and_the_worker_serves(scorer, caplog) -> None:
    def broken() -> None:
        raise RuntimeError("hook broke")

    registry = CollectorRegistry()
    app = create_app(_settings(), registry=registry, load_scorer=lambda: scorer, on_loaded=broken)
    with caplog.at_level("ERROR", logger="reward.app"), serve(app) as url:
        _wait_healthy(url)
        deadline = time.monotonic() + 10
        while "on-loaded hook failed" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
        response = httpx.post(f"{url}/v1/rewards", json={"messages": PROMPT, "responses": ["a"]})
    assert response.status_code == 200
    assert registry.get_sample_value("pandora_reward_model_loaded") == 1
    assert "on-loaded hook failed" in caplog.text and "hook broke" in caplog.text
