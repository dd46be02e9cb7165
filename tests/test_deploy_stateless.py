"""The gateway is stateless, so replicas scale horizontally (deploy/k8s HPA, compose --scale).

Two gateway PROCESSES, each exactly what a container runs (`pandora serve`, one uvicorn worker,
configured by PANDORA_* environment variables, the real stopping policies), sit behind one
round-robin client, sharing only the upstream (the fake vLLM) and the reward worker (a fake
one speaking `POST /v1/rewards`), like two pods behind a Service. They share nothing else:
either answers any request the same, an interleaved sequence equals the same sequence on one
replica, each counts only its own requests, losing one loses nothing, and neither writes a file.
"""

from __future__ import annotations

import http.server
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes import FakeUpstream, free_port, quality_of

REPO = Path(__file__).resolve().parents[1]
# One candidate at a time: which candidates a request uses then depends only on its seed, not
# on which finished first, so answers are comparable across processes. The real adaptive
# policy, with a cost that makes it stop after between 2 and 8 samples on these seeds.
HEADERS = {
    "X-Pandora-Parallelism": "1",
    "X-Pandora-Cost": "0.01",
    "X-Pandora-Min-Samples": "2",
    "X-Pandora-Max-Samples": "8",
}


class _RewardHandler(http.server.BaseHTTPRequestHandler):
    """A stand-in for `pandora reward-worker`: the score is the quality the fake upstream wrote
    into the text, so it is deterministic and tells the candidates apart."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        responses = body["responses"]
        self._answer(
            200,
            {
                "model": "fake-reward",
                "scores": [quality_of(text) for text in responses],
                "truncated": [False] * len(responses),
                "usage": {"prompt_tokens": 0},
            },
        )

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def reward_worker() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RewardHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


_STARTED: list[GatewayProcess] = []  # every gateway process, for their logs on failures


class GatewayProcess:
    def __init__(self, upstream_url: str, reward_url: str, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "HOME": str(workdir),
            "PANDORA_HOST": "127.0.0.1",
            "PANDORA_PORT": str(self.port),
            "PANDORA_UPSTREAM_URL": upstream_url,
            "PANDORA_REWARD_BACKEND": "worker",
            "PANDORA_REWARD_URL": reward_url,
            "PANDORA_LOG_LEVEL": "warning",
            "PANDORA_MAX_SAMPLES": "8",
            "PANDORA_UPSTREAM_RETRIES": "0",
            "PANDORA_REQUEST_TIMEOUT": "20",
            # The learned deployment prior (on by default) is per-replica memory: each replica
            # learns from the requests it served. This test pins the stateless configuration.
            "PANDORA_LEARN_PRIOR": "false",
        }
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        env.pop("prometheus_multiproc_dir", None)
        # The log goes next to the working directory, which must stay empty.
        self.log = workdir.with_name(f"{workdir.name}-{self.port}.log")
        self._log_file = self.log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "serve"],  # = `pandora serve`
            cwd=workdir,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        _STARTED.append(self)

    def wait_ready(self, timeout: float = 60) -> GatewayProcess:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"gateway process exited:\n{self.log_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"gateway process did not start within {timeout} s")
            time.sleep(0.1)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        prefix = f"{name}{{{wanted}}} " if labels else f"{name} "
        for line in text.splitlines():
            if line.startswith(prefix):
                return float(line.split()[-1])
        raise AssertionError(f"{prefix!r} not in /metrics")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log_file.close()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class RoundRobin(httpx.BaseTransport):
    """A load balancer without session affinity: request i goes to backend i mod n."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self._next = itertools.cycle(range(len(backends)))
        self._transport = httpx.HTTPTransport()
        self.served: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        index = next(self._next)
        self.served.append(index)
        target = httpx.URL(self.backends[index])
        request.url = request.url.copy_with(host=target.host, port=target.port)
        return self._transport.handle_request(request)

    def close(self) -> None:
        self._transport.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(tokens=6) as fake:
        yield fake


@pytest.fixture(scope="module")
def replicas(
    upstream: FakeUpstream, reward_worker: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    try:
        # Start both at once (each takes a few seconds to import), then wait for both.
        for name in ("a", "b"):
            workdir = tmp_path_factory.mktemp(name)
            started.append(GatewayProcess(upstream.base_url, reward_worker, workdir))
        for replica in started:
            replica.wait_ready()
        yield started
    finally:
        for replica in started:
            replica.stop()


def ask(client: httpx.Client, seed: int) -> tuple[str, int, str, list[float]]:
    """The parts of an answer that must not depend on which replica served it."""
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": "fake-model",
            "messages": [{"role": "user", "content": f"question {seed}"}],
            "seed": seed,
        },
        headers=HEADERS,
    )
    if response.status_code != 200:
        logs = "\n".join(f"--- {g.url}:\n{g.log_text()[-4000:]}" for g in _STARTED)
        raise AssertionError(f"{response.status_code} {response.text}\n{logs}")
    body = response.json()
    meta = body["pandora"]
    return (
        body["choices"][0]["message"]["content"],
        meta["samples"],
        meta["stop_reason"],
        meta["rewards"],
    )


SEEDS = list(range(100, 500, 50))  # 8 requests


def test_either_replica_gives_the_same_answer(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    with (
        httpx.Client(base_url=a.url, timeout=30) as on_a,
        httpx.Client(base_url=b.url, timeout=30) as on_b,
    ):
        answers = [(ask(on_a, seed), ask(on_b, seed)) for seed in SEEDS]
    for from_a, from_b in answers:
        assert from_a == from_b
    # The requests really differ (different samples used), so equality is not vacuous.
    assert len({answer[0][1] for answer in answers}) > 1


def test_round_robin_sequence_equals_one_replica_sequence(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    balancer = RoundRobin([a.url, b.url])
    with httpx.Client(base_url="http://gateway", transport=balancer, timeout=30) as client:
        interleaved = [ask(client, seed) for seed in SEEDS]
    assert balancer.served == [0, 1] * (len(SEEDS) // 2)
    with httpx.Client(base_url=a.url, timeout=30) as only_a:
        sequential = [ask(only_a, seed) for seed in SEEDS]
    assert interleaved == sequential


def test_each_replica_counts_only_its_own_requests(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    series = [
        ("pandora_requests_total", {"mode": "adaptive", "status": "200"}),
        ("pandora_samples_per_request_count", {"mode": "adaptive"}),
    ]
    before = {(r.url, n): r.metric(n, **labels) for r in replicas for n, labels in series}
    balancer = RoundRobin([a.url, b.url, b.url])  # b gets two of every three
    with httpx.Client(base_url="http://gateway", transport=balancer, timeout=30) as client:
        for seed in SEEDS:
            ask(client, seed)
    served_a = balancer.served.count(0)
    served_b = balancer.served.count(1) + balancer.served.count(2)
    assert (served_a, served_b) == (3, 5)
    for replica, served in ((a, served_a), (b, served_b)):
        for name, labels in series:
            counted = replica.metric(name, **labels) - before[(replica.url, name)]
            assert counted == served, (replica.url, name)


def test_replicas_write_no_files(replicas: list[GatewayProcess]) -> None:
    balancer = RoundRobin([replica.url for replica in replicas])
    with httpx.Client(base_url="http://gateway", transport=balancer, timeout=30) as client:
        for seed in SEEDS[:4]:
            ask(client, seed)
    for replica in replicas:
        # Their working directory and HOME: nothing created (no cache, no session store, no
        # prometheus multiprocess files).
        assert list(replica.workdir.iterdir()) == []


# Last: it stops replica a.
def test_losing_a_replica_loses_nothing(
    replicas: list[GatewayProcess], upstream: FakeUpstream, reward_worker: str
) -> None:
    a, b = replicas
    with httpx.Client(base_url=a.url, timeout=30) as on_a:
        before = [ask(on_a, seed) for seed in SEEDS[:4]]
    a.stop()
    with httpx.Client(base_url=b.url, timeout=30) as on_b:
        assert [ask(on_b, seed) for seed in SEEDS[:4]] == before
    # A replacement replica starts cold and answers exactly the same.
    replacement = GatewayProcess(upstream.base_url, reward_worker, a.workdir).wait_ready()
    try:
        with httpx.Client(base_url=replacement.url, timeout=30) as fresh:
            assert [ask(fresh, seed) for seed in SEEDS[:4]] == before
    finally:
        replacement.stop()
