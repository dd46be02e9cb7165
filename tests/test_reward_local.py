"""The in-process backend (the gateway's embedded default) and the `pandora reward-worker` CLI."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from reward_fixtures import PROMPT, RESPONSES, load_tiny_scorer
from tiny_models import tiny_reward_model_path

from reward import RewardError, create_backend
from reward.local import LocalRewardBackend
from reward.scorer import RewardScorer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scorer() -> RewardScorer:
    return load_tiny_scorer()


def _alone(scorer: RewardScorer, responses: list[str]) -> list[float]:
    return [scorer.forward([scorer.encode(PROMPT, r).ids])[0] for r in responses]


def test_local_backend_loads_through_from_pretrained_and_batches_concurrent_calls(
    scorer: RewardScorer,
) -> None:
    async def use() -> list[list[float]]:
        backend = create_backend(
            "local", model=str(tiny_reward_model_path()), device="cpu", dtype="float32"
        )
        assert isinstance(backend, LocalRewardBackend)
        try:
            first_ready = await backend.ready()  # starts loading in the background
            calls = [backend.score(PROMPT, RESPONSES[i:]) for i in range(len(RESPONSES))]
            results = await asyncio.gather(*calls)
            assert not first_ready and await backend.ready()
            return results
        finally:
            await backend.aclose()

    results = asyncio.run(use())
    expected = _alone(scorer, RESPONSES)
    for i, scores in enumerate(results):
        assert scores == pytest.approx(expected[i:], abs=1e-4)


def test_local_backend_reports_details_and_load_failures(scorer: RewardScorer) -> None:
    def broken() -> RewardScorer:
        raise OSError("no such model directory")

    async def use() -> None:
        backend = LocalRewardBackend("tiny", load_scorer=lambda: scorer)
        try:
            result = await backend.score_detailed(PROMPT, ["Paris.", "Lyon"])
            assert result.scores == pytest.approx(_alone(scorer, ["Paris.", "Lyon"]), abs=1e-4)
            assert result.truncated == [False, False]
            assert await backend.score(PROMPT, []) == []
        finally:
            await backend.aclose()
        with pytest.raises(RewardError, match="closed"):
            await backend.score(PROMPT, ["a"])
        failing = LocalRewardBackend("missing", load_scorer=broken)
        try:
            with pytest.raises(RewardError, match="failed to load: no such model directory"):
                await failing.score(PROMPT, ["a"])
            assert not await failing.ready()
        finally:
            await failing.aclose()

    asyncio.run(use())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pandora(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", "reward-worker", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_cli_serves_a_model_and_stops_cleanly_on_sigterm(scorer: RewardScorer) -> None:
    port = _free_port()
    path = str(tiny_reward_model_path())
    host = ("--host", "127.0.0.1", "--port", str(port))
    worker = _pandora("--model", path, "--device", "cpu", *host)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert worker.poll() is None, worker.communicate()[0]
            assert time.monotonic() < deadline, "worker did not become healthy"
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        reply = httpx.post(f"{url}/v1/rewards", json={"messages": PROMPT, "responses": ["Paris."]})
        assert reply.status_code == 200
        assert reply.json()["model"] == path
        assert reply.json()["scores"] == pytest.approx(_alone(scorer, ["Paris."]), abs=1e-4)
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=30)[0]
    # uvicorn shuts down gracefully, then re-raises the signal it caught (exit status -SIGTERM).
    assert worker.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output


def test_cli_exits_with_a_message_when_the_model_cannot_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.cli import main  # in-process: torch is already imported, a subprocess is slow

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = tmp_path / "no-model-here"
    args = ["reward-worker", "--model", str(missing), "--device", "cpu", "--host", "127.0.0.1"]
    assert main([*args, "--port", str(_free_port()), "--log-level", "warning"]) == 1
    assert "model failed to load" in capsys.readouterr().err
    assert main(["reward-worker", "--max-batch-size", "0"]) == 2
    usage = capsys.readouterr().err
    assert "--model" in usage and "--max-batch-size" in usage


def test_torch_threads_apply_in_the_thread_that_runs_forward(scorer: RewardScorer) -> None:
    import torch

    async def use() -> None:
        backend = LocalRewardBackend(
            str(tiny_reward_model_path()), device="cpu", dtype="float32", torch_threads=1
        )
        try:
            assert await backend.score(PROMPT, ["Paris."]) == pytest.approx(
                _alone(scorer, ["Paris."]), abs=1e-4
            )
            assert backend.scorer is not None

            def forward_then_count() -> int:  # a fresh thread, like the batcher's
                backend.scorer.forward([backend.scorer.encode(PROMPT, "x").ids])
                return torch.get_num_threads()

            assert await asyncio.to_thread(forward_then_count) == 1
        finally:
            await backend.aclose()

    asyncio.run(use())
