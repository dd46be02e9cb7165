"""Helpers shared by the reward tests: a real uvicorn server on a free port, tiny model paths."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from tiny_models import tiny_reward_model_path

__all__ = ["PROMPT", "RESPONSES", "load_tiny_scorer", "serve", "tiny_reward_model_path"]

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
# Very different lengths (a few tokens to several hundred), so padding matters in a batch.
RESPONSES = [
    "Paris.",
    "The capital of France is Paris. " * 30,
    "Paris",
    "I think it is Paris, a city on the Seine; " * 8,
    "Lyon?",
]


def load_tiny_scorer(**model_options: Any) -> Any:
    """A :class:`reward.scorer.RewardScorer` over the cached tiny model, in fp32 on CPU."""
    from reward.scorer import RewardScorer

    path = tiny_reward_model_path(**model_options)
    return RewardScorer.from_pretrained(str(path), device="cpu", dtype="float32")


@contextlib.contextmanager
def serve(app: Any, *, timeout: float = 30.0) -> Iterator[str]:
    """Run ``app`` on a real uvicorn server at 127.0.0.1:<free port>; yield its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        assert not thread.is_alive(), "uvicorn did not stop"
