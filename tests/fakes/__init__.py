"""Test doubles that speak the real protocols over real loopback HTTP.

- :class:`FakeUpstream` (``tests.fakes.upstream``): a vLLM-like OpenAI chat server with streamed
  chunks, usage, injectable latency and faults, and counters of open connections and streams.
- :class:`FakeReward` (``tests.fakes.reward``): an in-process :class:`reward.base.RewardBackend`
  whose scores are read from the candidate text (so the best candidate is known), with
  injectable failures.
- :class:`FakeRewardServer` (``tests.fakes.reward_server``): the same fake behind the reward
  worker's HTTP protocol (``POST /v1/rewards``, ``GET /health``).
- :class:`ServerThread` (``tests.fakes.servers``): runs any ASGI app (the gateway) on uvicorn on
  a free loopback port in a background thread.
"""

from tests.fakes.reward import FakeReward, quality_of
from tests.fakes.reward_server import FakeRewardServer
from tests.fakes.servers import ServerThread, free_port
from tests.fakes.upstream import FakeUpstream, Fault

__all__ = [
    "FakeReward",
    "FakeRewardServer",
    "FakeUpstream",
    "Fault",
    "ServerThread",
    "free_port",
    "quality_of",
]
