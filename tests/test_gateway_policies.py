"""The real stopping policies (``stoppers``) driven by the gateway, per mode."""

from __future__ import annotations

import random
import time

import httpx
import pytest

import stoppers
from tests.fakes.reward import FakeReward

URL = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 1000}


def post(server, headers=None, body=BODY) -> httpx.Response:
    response = httpx.post(server.url + URL, json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response


@pytest.fixture
def server(gateway_factory):
    return gateway_factory(max_samples=24, parallelism=1, default_cost=0.05)


@pytest.mark.parametrize("cost", [0.02, 0.2])
def test_adaptive_mode_stops_exactly_where_the_policy_does(server, cost):
    pandora = post(server, {"X-Pandora-Cost": str(cost)}).json()["pandora"]
    policy = stoppers.default_cost_policy(cost, max_samples=24)
    stops = [policy.observe(r) for r in pandora["rewards"]]
    assert stops[-1] and not any(stops[:-1])  # sequential (parallelism 1): same stream
    assert pandora["stop_reason"] == policy.stop_reason
    assert pandora["samples"] == policy.n and pandora["cancelled"] == 0
    if policy.threshold is not None:
        assert pandora["threshold"] == pytest.approx(policy.threshold)


def test_a_higher_cost_never_samples_more(server):
    cheap = post(server, {"X-Pandora-Cost": "0.001"}).json()["pandora"]["samples"]
    dear = post(server, {"X-Pandora-Cost": "0.5"}).json()["pandora"]["samples"]
    assert dear <= cheap


def test_target_mode_uses_the_target_policy(server):
    pandora = post(server, {"X-Pandora-Target-Acceptance": "0.6"}).json()["pandora"]
    policy = stoppers.default_target_policy(0.6, max_samples=24)
    for reward in pandora["rewards"]:
        stopped = policy.observe(reward)
    assert stopped and pandora["stop_reason"] == policy.stop_reason
    assert pandora["acceptance_estimate"] == pytest.approx(policy.acceptance_estimate)


def test_fixed_mode_is_best_of_max_samples(server):
    response = post(server, {"X-Pandora-Mode": "fixed", "X-Pandora-Max-Samples": "5"})
    assert response.headers["X-Pandora-Samples"] == "5"
    assert response.headers["X-Pandora-Stop-Reason"] == "budget"
    pandora = response.json()["pandora"]
    assert pandora["rewards"][pandora["chosen_index"]] == max(pandora["rewards"])


def test_min_samples_is_respected(server):
    pandora = post(server, {"X-Pandora-Cost": "0.9", "X-Pandora-Min-Samples": "7"}).json()[
        "pandora"
    ]
    assert pandora["samples"] >= 7


def test_parallel_sampling_saves_against_the_baseline(gateway_factory):
    server = gateway_factory(max_samples=16, parallelism=4, baseline_n=16)
    response = post(server, {"X-Pandora-Cost": "0.3"})
    pandora = response.json()["pandora"]
    used = pandora["samples"] + pandora["cancelled"]
    assert used <= 16
    assert server.metric("pandora_samples_saved_total") == 16 - used


@pytest.mark.parametrize(
    ("headers", "samples", "reason"),
    [
        ({}, 1, "greedy"),  # the server's default mode (adaptive)
        ({"X-Pandora-Target-Acceptance": "0.9"}, 1, "greedy"),
        ({"X-Pandora-Cost": "0.001", "X-Pandora-Max-Samples": "6"}, None, None),  # the client's
        ({"X-Pandora-Cost": "0.001", "X-Pandora-Min-Samples": "6"}, None, None),
        ({"X-Pandora-Mode": "fixed", "X-Pandora-Max-Samples": "5"}, 5, "budget"),  # A/B baseline
    ],
)
def test_greedy_decoding_draws_one_candidate(
    gateway_factory, fake_upstream, headers, samples, reason
):
    """temperature 0 makes every candidate the same reply: adaptive and target requests draw one
    (stop reason "greedy", nothing taught to the deployment prior), unless the client set the
    sample budget; fixed mode keeps its N."""
    server = gateway_factory(max_samples=24, parallelism=4, default_cost=0.001)
    body = {**BODY, "temperature": 0}
    response = post(server, headers, body)
    pandora = response.json()["pandora"]
    offered = sum(  # finished requests offered to the deployment prior
        server.metric("pandora_prior_updates_total", mode=mode, result=result)
        for mode in ("adaptive", "target")
        for result in ("learned", "skipped")
    )
    if samples is None:
        assert pandora["samples"] > 1 and pandora["stop_reason"] != "greedy"
        assert offered == 1
        return
    assert pandora["samples"] == samples and pandora["stop_reason"] == reason
    assert response.headers["X-Pandora-Stop-Reason"] == reason
    assert fake_upstream.request_count == samples
    assert fake_upstream.requests[0]["temperature"] == 0  # forwarded as the client sent it
    if reason == "greedy":
        assert server.metric("pandora_stop_reason_total", reason="greedy") == 1
        assert offered == 0
        # the copies a Best-of-N proxy would have drawn count as saved, as for any request
        assert server.metric("pandora_samples_saved_total") == 24 - 1


def test_greedy_is_temperature_zero_or_top_k_one(gateway_factory, fake_upstream):
    """top_k 1 (vLLM, TGI) is greedy too; a sampled temperature, none at all, n > 1, or a value
    that is not a number keep the usual budget."""
    server = gateway_factory(max_samples=8, parallelism=4, default_cost=0.001)
    response = httpx.post(server.url + URL, json={**BODY, "top_k": 1}, timeout=30)
    assert response.json()["pandora"]["stop_reason"] == "greedy"
    for extra in (
        {"temperature": 0.7},
        {},
        {"temperature": 0, "n": 2},
        {"temperature": "0"},
        {"top_k": 5},
        {"top_k": True},
    ):
        response = httpx.post(server.url + URL, json={**BODY, **extra}, timeout=30)
        if response.status_code != 200:  # a string temperature is the upstream's to reject
            continue
        assert response.json()["pandora"]["samples"] > 1, extra


def _one_reply_per_prompt(body, index):
    """Every candidate for a prompt is the same reply (a generator at a low temperature, or a
    short question), each prompt's reply at its own reward: no shared top or bottom."""
    prompt = body["messages"][-1]["content"]
    return f"answer {random.Random(prompt).uniform(-3.0, 3.0):.6f} to {prompt}"


def _learned(server, requests: int) -> None:
    """Wait until the deployment prior has been offered ``requests`` finished requests."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        offered = sum(
            server.metric("pandora_prior_updates_total", mode="target", result=result)
            for result in ("learned", "skipped")
        )
        if offered >= requests:
            return
        time.sleep(0.01)
    raise AssertionError(f"the prior was not offered {requests} requests")


def test_a_deployment_that_repeats_itself_learns_to_stop_its_copies(gateway_factory, fake_upstream):
    """Sampled (temperature 0.7), yet every prompt gets one reply again and again. The first
    requests wait out the per-request rule (16 identical rewards at target 0.9); once the
    deployment has learned that its repeated replies are its prompts' tops
    (stoppers.robust.pile), a request stops at min-samples, 8 candidates, and the reward model
    scores each prompt's reply once."""
    fake_upstream.content = _one_reply_per_prompt
    fake_reward = FakeReward()
    server = gateway_factory(max_samples=24, parallelism=1, reward=fake_reward)
    headers = {"X-Pandora-Target-Acceptance": "0.9"}
    runs = []
    for k in range(12):
        messages = [{"role": "user", "content": f"question {k}"}]
        body = {**BODY, "messages": messages, "temperature": 0.7}
        runs.append(post(server, headers, body).json()["pandora"])
        _learned(server, k + 1)
    assert (runs[0]["samples"], runs[0]["stop_reason"]) == (16, "tied")
    assert (runs[-1]["samples"], runs[-1]["stop_reason"]) == (8, "repeated")
    assert len(set(runs[-1]["rewards"])) == 1
    assert len(fake_reward.calls) == 12  # one reward call per request: copies reuse the score
