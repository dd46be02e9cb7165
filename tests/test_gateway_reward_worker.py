"""The gateway scoring through the reward worker's HTTP protocol (``--reward-backend worker``)."""

from __future__ import annotations

import httpx
import pytest

from server.app import create_app
from server.config import Settings
from tests.fakes import FakeReward, FakeRewardServer, ServerThread
from tests.fakes.policies import StopAbove
from tests.fakes.upstream import quality_for_seed

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 50}


@pytest.fixture
def worker_gateway(fake_upstream):
    reward = FakeReward()
    with FakeRewardServer(reward) as reward_server:
        settings = Settings(
            upstream_url=fake_upstream.base_url,
            reward_url=reward_server.base_url,
            max_samples=4,
            retry_backoff=0.01,
        )
        assert settings.effective_reward_backend == "worker"
        app = create_app(
            settings, policy_factory=lambda plan: StopAbove(9.0, max_samples=plan.max_samples)
        )
        with ServerThread(app) as server:
            yield server, reward, reward_server


def test_scores_over_http(worker_gateway):
    server, _, reward_server = worker_gateway
    response = httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=20)
    assert response.status_code == 200, response.text
    rewards = response.json()["pandora"]["rewards"]
    assert sorted(rewards) == sorted(quality_for_seed(50 + i) for i in range(4))
    assert reward_server.requests >= 1
    assert httpx.get(server.url + "/ready").status_code == 200


@pytest.mark.parametrize("failure", ["down", "nan", "wrong_count"])
def test_worker_failures_are_503(worker_gateway, failure):
    server, reward, _ = worker_gateway
    setattr(reward, failure, True)
    response = httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=20)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "reward_unavailable"
