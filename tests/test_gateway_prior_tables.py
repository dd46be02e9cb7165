"""Target mode's stop tables are built off the gateway's event loop (real uvicorn, fake upstream,
instant reward): while a slow build runs, other requests are answered at once; afterwards the
policy uses the table; shutdown ends the build thread."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

from server.policies import build_policy
from server.priors import PriorStore
from server.table_builds import THREAD_NAME
from stoppers.robust import shape_prior
from stoppers.robust.pooled_target import PooledTargetAcceptance
from tests.fakes import FakeReward
from tests.fakes.gateway import start_gateway

URL = "/v1/chat/completions"
HOLD_SECONDS = 30.0  # safety net: a held build gives up after this
REQUEST_TIMEOUT = 10.0  # a request held by a build on the event loop fails by this
PROMPT = [{"role": "user", "content": "hi"}]


def target_body(target: float = 0.9, **pandora: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": PROMPT,
        "pandora": {"mode": "target", "target_acceptance": target, **pandora},
    }


def off_body() -> dict[str, Any]:
    return {"model": "m", "messages": PROMPT, "pandora": {"mode": "off"}}


def _saved_priors(tmp_path, mode: str, streams: list[Any]):
    """A saved state whose ``mode`` prior for model "m" has learned ``streams``."""
    from server.config import Settings

    path = tmp_path / "priors.json"
    # learned from the reward scores the test gateway uses (the default reward model's name)
    store = PriorStore(
        path=path, reward_identity=Settings(upstream_url="http://u:1/v1").reward_identity
    )
    prior = store.get("m", mode)
    for stream in streams:
        assert prior.update(stream)
    store.save()
    return path


@pytest.fixture
def warm_state(tmp_path):
    """A saved state whose target prior for model "m" is past its cold start (12 requests)."""
    rng = np.random.default_rng(0)
    streams = [
        rng.normal(0, 2) + math.exp(rng.normal(0, 0.3)) * rng.normal(size=60) for _ in range(12)
    ]
    return _saved_priors(tmp_path, "target", streams)


def _hold_builds(monkeypatch, seconds: float):
    """build_table waits until the returned ``release`` is set (at most ``seconds``); the thread
    each build ran on is recorded."""
    real = shape_prior.build_table
    started, release = threading.Event(), threading.Event()
    threads: list[str] = []

    def held(*args, **kwargs):
        threads.append(threading.current_thread().name)
        started.set()
        release.wait(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(shape_prior, "build_table", held)
    return started, release, threads


@pytest.fixture
def held_builds(monkeypatch):
    """Builds held until released (at most HOLD_SECONDS).

    Held rather than slowed by a fixed time: a build on the event loop would hold every request
    until the test releases it, so the requests below fail by timing out, whatever the load of
    the machine, and no latency threshold is needed.
    """
    started, release, threads = _hold_builds(monkeypatch, HOLD_SECONDS)
    yield started, release, threads
    release.set()


class Policies:
    """The real policy factory, remembering what it built."""

    def __init__(self) -> None:
        self.built: list[Any] = []

    def __call__(self, plan, *, prior=None):
        policy = build_policy(plan, prior=prior)
        self.built.append(policy)
        return policy


def test_a_held_table_build_does_not_stall_other_requests(fake_upstream, warm_state, held_builds):
    started, release, threads = held_builds
    policies = Policies()
    server = start_gateway(
        fake_upstream,
        FakeReward(),
        policy_factory=policies,
        prior_state_file=warm_state,
        max_samples=10,
    )
    try:
        with (
            httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client,
            ThreadPoolExecutor(1) as pool,
        ):
            client.get("/health")  # connection warm
            # the first target request for this key starts the build, which is held until the
            # end of this block: every answer below comes while it is still running
            first = pool.submit(client.post, URL, json=target_body())
            assert started.wait(REQUEST_TIMEOUT), "no table build was started"
            assert first.result(REQUEST_TIMEOUT).status_code == 200
            assert client.get("/health").status_code == 200
            assert client.post(URL, json=off_body()).status_code == 200
            # same key: answered with the cold start, no second build
            assert client.post(URL, json=target_body()).status_code == 200
            assert not release.is_set()
            assert server.metric("pandora_prior_table_builds_pending") == 1
            # both target requests ran the cold-start policy: no table yet
            assert [p.cold for p in policies.built] == [True, True]
            release.set()
            deadline = time.monotonic() + 10
            while (
                server.metric("pandora_prior_table_builds_total") < 1
                and time.monotonic() < deadline
            ):
                time.sleep(0.02)
            assert server.metric("pandora_prior_table_builds_total") == 1
            assert server.metric("pandora_prior_table_builds_pending") == 0
            # the next request for that key uses the table built on the worker thread
            assert client.post(URL, json=target_body()).status_code == 200
            last = policies.built[-1]
            assert isinstance(last, PooledTargetAcceptance) and not last.cold
    finally:
        release.set()
        server.stop()
    assert len(threads) == 1 and threads[0].startswith(THREAD_NAME)
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


@pytest.fixture
def gated_builds(monkeypatch):
    """Builds held until ``gate`` is set (at most GATE_SECONDS)."""
    return _hold_builds(monkeypatch, GATE_SECONDS)


GATE_SECONDS = 5.0


def test_many_client_keys_stay_bounded_and_shutdown_ends_the_build_thread(
    fake_upstream, warm_state, gated_builds
):
    started, gate, threads = gated_builds
    server = start_gateway(fake_upstream, FakeReward(), prior_state_file=warm_state, max_samples=16)
    try:
        # every build waits for the gate: each request below is answered while none can finish
        with httpx.Client(base_url=server.url, timeout=GATE_SECONDS / 2) as client:
            for i in range(40):  # 40 distinct (target, min, max samples): 40 table keys
                body = target_body(0.5 + i / 100, min_samples=2 + i % 3, max_samples=4 + i % 5)
                assert client.post(URL, json=body).status_code == 200
            assert started.is_set() and not gate.is_set()
            assert server.metric("pandora_prior_table_builds_pending") == 8  # the queue bound
            assert server.metric("pandora_prior_table_builds_dropped_total") == 40 - 8
            assert server.metric("pandora_prior_table_builds_total") == 0
            prior = server.server.config.app.state.priors._priors[("m", None, "target")]
            assert prior.schedule_build is not None and len(prior._tables) == 0
        # shut down with one build running and 7 queued: shutdown waits for the running one
        # (released 0.3 s later) and drops the queue
        threading.Timer(0.3, gate.set).start()
        began = time.perf_counter()
    finally:
        server.stop()
        gate.set()
    assert 0.2 < time.perf_counter() - began < GATE_SECONDS
    assert len(threads) == 1 and threads[0].startswith(THREAD_NAME)
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]
    assert len(prior._tables) <= 1


def _judge_stream(rng: np.random.Generator, size: int = 96) -> list[float]:
    """One kept stream of a judge's prompt: a share at the floor, a few lumps of answers."""
    centres = rng.normal(0.0, 3.0, rng.integers(3, 8))
    at_floor = rng.random(size) < rng.uniform(0.2, 0.7)
    lumps = rng.choice(centres, size) + rng.normal(0.0, 0.3, size)
    return np.where(at_floor, -9.0, np.maximum(lumps, -9.0)).tolist()


def test_cost_mode_reads_the_streams_best_of_n_built_on_the_build_thread(fake_upstream, tmp_path):
    """A cost prior whose kept streams read lumpy: the first adaptive request runs the cold
    start and asks for the streams' Best-of-N, which is built on the worker thread; the next
    request draws that N (capped at the budget) and stops with reason "fixed"."""
    from stoppers.robust.cost_prior import STREAMS_N_KEY
    from stoppers.robust.shape_cost import ShapePandora

    rng = np.random.default_rng(0)
    path = _saved_priors(tmp_path, "cost", [_judge_stream(rng) for _ in range(30)])
    policies = Policies()
    server = start_gateway(
        fake_upstream, FakeReward(), policy_factory=policies, prior_state_file=path, max_samples=12
    )
    body = {"model": "m", "messages": PROMPT, "pandora": {"mode": "adaptive", "cost": 0.001}}
    try:
        with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
            assert client.post(URL, json=body).status_code == 200
            first = policies.built[-1]
            assert isinstance(first, ShapePandora) and first.streams_n is None
            deadline = time.monotonic() + 10
            live = server.server.config.app.state.priors._priors[("m", None, "cost")]
            keys = lambda: [k for k in live._tables if k[0] == STREAMS_N_KEY]  # noqa: E731
            while not keys() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert keys(), "the streams' Best-of-N was not built"
            response = client.post(URL, json=body)
            assert response.status_code == 200
            last = policies.built[-1]
            assert isinstance(last, ShapePandora) and last.streams_n == 12  # the budget: N > 12
            assert (last.n, last.stop_reason) == (12, "fixed")
    finally:
        server.stop()
