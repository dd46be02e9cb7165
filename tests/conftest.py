"""Shared fixtures: the fake upstream, the fake reward backend, and a running gateway.

The helpers themselves live in ``tests/fakes`` (importable as ``tests.fakes``) so that other
suites (reliability, deploy) reuse them without going through fixtures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) does not add the repo root
    sys.path.insert(0, str(ROOT))

from tests.fakes import FakeReward, FakeUpstream, ServerThread  # noqa: E402

pytest_plugins = ["tests.interrupt"]  # SIGTERM tears fixtures down, as Ctrl-C does


@pytest.fixture
def fake_upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(tokens=6) as upstream:
        yield upstream


@pytest.fixture
def fake_reward() -> FakeReward:
    return FakeReward()


@pytest.fixture
def gateway_factory(fake_upstream: FakeUpstream, fake_reward: FakeReward) -> Iterator[Callable]:
    """``gateway_factory(**settings)`` -> a started ServerThread running the gateway against
    the fake upstream and fake reward (stopped at teardown)."""
    from tests.fakes.gateway import start_gateway

    started: list[ServerThread] = []

    def make(*, upstream: FakeUpstream | None = None, reward: FakeReward | None = None, **kw):
        server = start_gateway(upstream or fake_upstream, reward or fake_reward, **kw)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
