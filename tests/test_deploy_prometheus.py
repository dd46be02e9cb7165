"""A real Prometheus server scrapes a real gateway and a real reward worker during a burst of
traffic; then every PromQL expression of the "Saved generations" dashboard and of the alert
rules runs through Prometheus's HTTP API: each must be valid, and each dashboard query must
return a series.

This is the compose stack without GPUs: Prometheus is Debian's package binary (installed by
.ci/run) on a free loopback port with a temporary data directory, a 1 s scrape interval, the
repo's alert rules and the repo's job names. The gateway runs on uvicorn against the fake
upstream (vLLM's protocol over real HTTP) and scores through the real reward worker
(`pandora reward-worker`, a separate process serving a tiny random-weight model on the CPU).
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from stoppers.base import StoppingPolicy
from tests.fakes import FakeUpstream, Fault, free_port
from tests.fakes.gateway import GatewayServer, start_gateway
from tests.test_deploy_static import alert_rules, dashboard_exprs, dashboard_panels
from tests.tiny_models import build_tiny_reward_model

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
# The job names of deploy/prometheus/prometheus.yml (the alert rules select them).
JOB = "pandora-gateway"
WORKER_JOB = "pandora-reward-worker"
BURST_BATCHES, BATCH_SIZE = 4, 10

# Grafana's variables, replaced the way Grafana would for a dashboard opened on this test's
# few seconds of data: windows wide enough to cover the whole run.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__range": "5m",
    "$__interval": "1s",
    "$mode": ".*",
}


def grafana_to_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable left in {expr!r}"
    return expr


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(tokens=6, token_delay=0.001) as fake:
        yield fake


class BeatTheFirst(StoppingPolicy):
    """Stop at the first candidate that scores above the first one. The stopping rule is
    injected so that this test checks the metrics pipeline, independent of how the real
    stoppers are tuned; with the tiny model's arbitrary scores it still stops early often,
    so savings, stop reasons and samples per request all vary."""

    def __init__(self, *, max_samples: int | None = None) -> None:
        super().__init__(max_samples=max_samples)
        self._first: float | None = None

    def _decide(self, reward: float) -> str | None:
        if self._first is None:
            self._first = reward
            return None
        return "threshold" if reward > self._first else None


class WorkerProcess:
    """`pandora reward-worker` in its own process, serving a tiny model on the CPU. Started
    early and awaited late: its torch import overlaps the gateway's and Prometheus's start."""

    def __init__(self, model: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("wb") as log_file:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "server.cli",
                    "reward-worker",
                    f"--model={model}",
                    "--device=cpu",
                    "--dtype=float32",
                    "--host=127.0.0.1",
                    f"--port={self.port}",
                    "--max-wait-ms=2",
                    "--log-level=warning",
                ],
                cwd=REPO,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)},
            )

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"reward worker exited:\n{self.log.read_text()}"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"worker not ready:\n{self.log.read_text()}"
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def reward_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    workdir = tmp_path_factory.mktemp("reward-worker")
    worker = WorkerProcess(build_tiny_reward_model(workdir / "model"), workdir / "worker.log")
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, reward_worker: WorkerProcess) -> Iterator[GatewayServer]:
    server = start_gateway(
        upstream,
        None,  # the app builds its own client for the reward worker from the settings
        policy_factory=lambda plan: BeatTheFirst(max_samples=plan.max_samples),
        reward_backend="worker",
        reward_url=reward_worker.url,
        max_samples=8,
        parallelism=2,
        upstream_retries=0,
    )
    try:
        yield server
    finally:
        server.stop()


class Prometheus:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log
        self.http = httpx.Client(base_url=url, timeout=10)

    def query(self, promql: str) -> dict:
        response = self.http.post("/api/v1/query", data={"query": promql})
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (
            f"{promql!r} -> {response.status_code} {body.get('errorType')}: {body.get('error')}"
        )
        return body["data"]

    def value(self, promql: str) -> float | None:
        result = self.query(promql)["result"]
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, promql: str, predicate, timeout: float, what: str) -> float:
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"prometheus exited:\n{self.log.read_text()}"
            value = self.value(promql)
            if value is not None and predicate(value):
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}: {promql} = {value}")


@pytest.fixture(scope="module")
def prometheus(
    gateway: GatewayServer,
    reward_worker: WorkerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus not found: install Debian's `prometheus` package (.ci/run does)"
    workdir = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [{"targets": [f"127.0.0.1:{gateway.port}"]}],
            },
            {
                "job_name": WORKER_JOB,
                "static_configs": [{"targets": [f"127.0.0.1:{reward_worker.port}"]}],
            },
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"prometheus exited:\n{log.read_text()}"
            try:
                if server.http.get("/-/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"prometheus not ready:\n{log.read_text()}"
            time.sleep(0.1)
        yield server
    finally:
        server.http.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# The burst: every mode, a client error and upstream failures, so that each panel has data.
def _chat(client: httpx.Client, headers: dict[str, str], seed: int) -> int:
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": f"question {seed}"}],
        "max_tokens": 8,
        "seed": seed,
    }
    return client.post("/v1/chat/completions", json=body, headers=headers).status_code


@pytest.fixture(scope="module")
def traffic(
    prometheus: Prometheus,
    gateway: GatewayServer,
    upstream: FakeUpstream,
    reward_worker: WorkerProcess,
) -> dict[int, int]:
    reward_worker.wait_ready()
    for job in (JOB, WORKER_JOB):
        prometheus.wait_for(f'up{{job="{job}"}}', lambda v: v == 1, 30, f"the {job} target")
    statuses: dict[int, int] = {}
    modes = [
        {},  # the server default: adaptive
        {"X-Pandora-Mode": "adaptive", "X-Pandora-Cost": "0.2"},
        {"X-Pandora-Target-Acceptance": "0.5"},
        {"X-Pandora-Mode": "fixed", "X-Pandora-Max-Samples": "3"},
        {"X-Pandora-Mode": "off"},
    ]
    with (
        httpx.Client(base_url=gateway.url, timeout=30) as client,
        concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool,
    ):
        # BURST_BATCHES batches of BATCH_SIZE concurrent requests, at least a second apart so
        # that the burst spans several scrapes.
        for batch_index in range(BURST_BATCHES):
            started = time.monotonic()
            seeds = range(batch_index * BATCH_SIZE, (batch_index + 1) * BATCH_SIZE)
            batch = [pool.submit(_chat, client, modes[seed % len(modes)], seed) for seed in seeds]
            for future in batch:
                status = future.result(timeout=30)
                statuses[status] = statuses.get(status, 0) + 1
            time.sleep(max(0.0, started + 1.0 - time.monotonic()))
        # A client error, and a request whose only candidate fails upstream (502).
        status = _chat(client, {"X-Pandora-Cost": "7"}, 0)
        statuses[status] = statuses.get(status, 0) + 1
        upstream.inject(Fault("status", status=500), times=1)
        status = _chat(client, {"X-Pandora-Max-Samples": "1"}, 1)
        statuses[status] = statuses.get(status, 0) + 1
    assert upstream.wait_idle()
    # Wait until Prometheus has scraped the final counters.
    sent = sum(statuses.values())
    prometheus.wait_for(
        f'sum(pandora_requests_total{{job="{JOB}"}})', lambda v: v >= sent, 20, "the last scrape"
    )
    scored = gateway.metric("pandora_candidates_total", outcome="scored")
    prometheus.wait_for(
        f'pandora_reward_items_scored_total{{job="{WORKER_JOB}"}}',
        lambda v: v >= scored,
        20,
        "the worker's last scrape",
    )
    return statuses


# --- tests -------------------------------------------------------------------------------------


def test_the_burst_exercised_success_client_errors_and_upstream_failures(
    traffic: dict[int, int],
) -> None:
    assert traffic == {200: BURST_BATCHES * BATCH_SIZE, 400: 1, 502: 1}


def test_scraped_counters_equal_the_gateway_registry(
    traffic: dict[int, int], prometheus: Prometheus, gateway: GatewayServer
) -> None:
    for name, labels in [
        ("pandora_samples_saved_total", {}),
        ("pandora_requests_total", {"mode": "off", "status": "200"}),
        ("pandora_requests_total", {"mode": "adaptive", "status": "502"}),
        ("pandora_candidates_total", {"outcome": "scored"}),
        ("pandora_tokens_total", {"kind": "completion"}),
        ("pandora_upstream_errors_total", {"kind": "server_error"}),
    ]:
        selector = ",".join([f'job="{JOB}"', *(f'{k}="{v}"' for k, v in labels.items())])
        scraped = prometheus.value(f"{name}{{{selector}}}")
        assert scraped == gateway.metric(name, **labels), (name, labels)
    assert gateway.metric("pandora_samples_saved_total") > 0
    assert gateway.metric("pandora_upstream_errors_total", kind="server_error") >= 1


@pytest.mark.parametrize("expr", dashboard_exprs())
def test_every_dashboard_query_is_valid_and_returns_a_series(
    expr: str, traffic: dict[int, int], prometheus: Prometheus
) -> None:
    data = prometheus.query(grafana_to_promql(expr))
    assert data["resultType"] == "vector"
    assert data["result"], f"no series for {expr!r}"


def test_dashboard_figures_are_consistent_with_the_traffic(
    traffic: dict[int, int], prometheus: Prometheus
) -> None:
    """Not just some series: the savings panels show numbers that make sense."""
    by_title = {p["title"]: p for p in dashboard_panels()}

    def stat(title: str) -> float:
        (target,) = by_title[title]["targets"]
        value = prometheus.value(grafana_to_promql(target["expr"]))
        assert value is not None and math.isfinite(value), (title, value)
        return value

    share = stat("Saved share")
    assert 0 < share < 1
    assert stat("Generations saved") > 0
    # Baseline N: the gateway counts savings against max-samples = 8.
    assert stat("Baseline N") == pytest.approx(8, rel=1e-6)
    assert 1 <= stat("Samples per request") <= 8
    assert stat("Requests") >= sum(traffic.values()) * 0.9


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_every_alert_expression_is_valid(
    rule: dict, traffic: dict[int, int], prometheus: Prometheus
) -> None:
    data = prometheus.query(rule["expr"])
    assert data["resultType"] == "vector"


def test_prometheus_loaded_and_evaluates_every_alert_rule(
    traffic: dict[int, int], prometheus: Prometheus
) -> None:
    expected = {rule["alert"] for rule in alert_rules()}
    deadline = time.monotonic() + 10
    while True:
        groups = prometheus.http.get("/api/v1/rules").json()["data"]["groups"]
        rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
        evaluated = {
            name for name, rule in rules.items() if rule.get("lastEvaluation", "").startswith("2")
        }
        if expected <= evaluated or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert set(rules) == expected
    for name, rule in rules.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
        # A healthy burst pages nobody (the upstream failure was one request in many).
        assert rule["state"] == "inactive", (name, rule["state"], rule.get("alerts"))
