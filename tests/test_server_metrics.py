"""The Prometheus metrics: fixed names (issue 6), fixed label sets, values that add up."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from server.metrics import (
    CANDIDATE_OUTCOMES,
    REQUEST_MODES,
    STOP_REASONS,
    UPSTREAM_ERROR_KINDS,
    GatewayMetrics,
)
from tests.fakes.policies import StopAbove

ISSUE_6_NAMES = {
    "pandora_requests_total": "counter",
    "pandora_request_duration_seconds": "histogram",
    "pandora_samples_per_request": "histogram",
    "pandora_candidates_total": "counter",
    "pandora_samples_saved_total": "counter",
    "pandora_tokens_total": "counter",
    "pandora_stop_reason_total": "counter",
    "pandora_best_reward": "histogram",
    "pandora_upstream_request_duration_seconds": "histogram",
    "pandora_reward_request_duration_seconds": "histogram",
    "pandora_upstream_errors_total": "counter",
    "pandora_inflight_requests": "gauge",
    "pandora_inflight_candidates": "gauge",
}
# Per X-Pandora-Task (added with task keys): series only for the operator's --metric-tasks.
TASK_NAMES = {
    "pandora_task_requests_total": "counter",
    "pandora_task_generations_total": "counter",
    "pandora_task_samples_saved_total": "counter",
}
# Added with the per-request reuse of a repeated reply's score (server.sampling, 2026-12-01).
REPEAT_NAMES = {"pandora_repeated_candidates_total": "counter"}


def families(text: str) -> dict[str, object]:
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus-client's creation timestamps
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        found[name] = family
    return found


def test_every_issue_6_metric_exists_with_its_type():
    registry = CollectorRegistry()
    GatewayMetrics(registry, max_samples=8)
    from prometheus_client import generate_latest

    found = families(generate_latest(registry).decode())
    for name, kind in {**ISSUE_6_NAMES, **TASK_NAMES, **REPEAT_NAMES}.items():
        assert name in found, name
        assert found[name].type == kind, name
    assert set(found) == set(ISSUE_6_NAMES) | set(TASK_NAMES) | set(REPEAT_NAMES)


def test_known_label_values_exist_at_zero_and_samples_buckets_span_max():
    registry = CollectorRegistry()
    GatewayMetrics(registry, max_samples=5)
    for mode in REQUEST_MODES:
        assert (
            registry.get_sample_value("pandora_requests_total", {"mode": mode, "status": "200"})
            == 0
        )
    for outcome in CANDIDATE_OUTCOMES:
        assert registry.get_sample_value("pandora_candidates_total", {"outcome": outcome}) == 0
    for reason in STOP_REASONS:
        assert registry.get_sample_value("pandora_stop_reason_total", {"reason": reason}) == 0
    for kind in UPSTREAM_ERROR_KINDS:
        assert registry.get_sample_value("pandora_upstream_errors_total", {"kind": kind}) == 0
    buckets = [
        registry.get_sample_value(
            "pandora_samples_per_request_bucket", {"mode": "adaptive", "le": f"{le:.1f}"}
        )
        for le in range(1, 6)
    ]
    assert buckets == [0, 0, 0, 0, 0]


def test_labels_are_clamped_to_the_fixed_sets():
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, max_samples=4)
    metrics.request_finished("<script>", 418, 0.1)
    metrics.stop_reason("user-123-prompt-text")
    metrics.upstream_error("weird")
    metrics.candidate("exploded")
    get = registry.get_sample_value
    assert get("pandora_requests_total", {"mode": "other", "status": "other"}) == 1
    assert get("pandora_stop_reason_total", {"reason": "other"}) == 1
    assert get("pandora_upstream_errors_total", {"kind": "other"}) == 1
    assert get("pandora_candidates_total", {"outcome": "other"}) == 1


def test_task_series_exist_only_for_declared_tasks_and_the_two_folds():
    """A client cannot create series with X-Pandora-Task: undeclared tasks fold into 'other'."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, max_samples=4, tasks=("code", "chat"))
    get = registry.get_sample_value
    for task in ("code", "chat", "other", "none"):
        for mode in ("adaptive", "target", "fixed"):
            labels = {"task": task, "mode": mode}
            assert get("pandora_task_requests_total", labels) == 0
            assert get("pandora_task_samples_saved_total", labels) == 0
        assert get("pandora_task_requests_total", {"task": task, "mode": "off"}) is None
    metrics.task_outcome("code", "adaptive", generations=3, saved=5)
    metrics.task_outcome("user-42-secret", "target", generations=8, saved=0)
    metrics.task_outcome(None, "fixed", generations=2, saved=6)
    metrics.task_outcome("code", "<script>", generations=1, saved=0)
    assert get("pandora_task_requests_total", {"task": "code", "mode": "adaptive"}) == 1
    assert get("pandora_task_generations_total", {"task": "code", "mode": "adaptive"}) == 3
    assert get("pandora_task_samples_saved_total", {"task": "code", "mode": "adaptive"}) == 5
    assert get("pandora_task_generations_total", {"task": "other", "mode": "target"}) == 8
    assert get("pandora_task_samples_saved_total", {"task": "none", "mode": "fixed"}) == 6
    assert get("pandora_task_requests_total", {"task": "code", "mode": "other"}) == 1
    assert get("pandora_task_requests_total", {"task": "user-42-secret", "mode": "target"}) is None
    assert get("pandora_task_requests_total", {"task": "chat", "mode": "adaptive"}) == 0


@pytest.fixture
def server(gateway_factory):
    return gateway_factory(
        policy_factory=lambda plan: StopAbove(99.0, max_samples=plan.max_samples),
        max_samples=4,
        baseline_n=10,
    )


def test_values_after_traffic(server, fake_upstream):
    url = server.url + "/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "one two"}]}
    for _ in range(2):
        assert httpx.post(url, json=body, timeout=10).status_code == 200
    assert httpx.post(url, json=body, headers={"X-Pandora-Mode": "off"}).status_code == 200
    m = server.metric
    assert m("pandora_requests_total", mode="adaptive", status="200") == 2
    assert m("pandora_requests_total", mode="off", status="200") == 1
    assert m("pandora_samples_per_request_count", mode="adaptive") == 2
    assert m("pandora_samples_per_request_sum", mode="adaptive") == 8
    assert m("pandora_samples_saved_total") == 2 * (10 - 4)
    assert m("pandora_candidates_total", outcome="scored") == 8
    assert m("pandora_tokens_total", kind="completion") == 8 * 6
    assert m("pandora_tokens_total", kind="prompt") == 8 * 2
    assert m("pandora_stop_reason_total", reason="budget") == 2
    assert m("pandora_best_reward_count") == 2
    assert m("pandora_upstream_request_duration_seconds_count") == 8
    assert m("pandora_reward_request_duration_seconds_count") >= 2
    assert m("pandora_request_duration_seconds_count", mode="adaptive") == 2
    assert m("pandora_inflight_requests") == 0 and m("pandora_inflight_candidates") == 0


def test_hostile_header_values_never_become_labels(server):
    url = server.url + "/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    hostile = ["adaptive\tevil", "DROP TABLE", "ada" * 30, "user@example.com"]
    for value in hostile:
        response = httpx.post(url, json=body, headers={"X-Pandora-Mode": value}, timeout=10)
        assert response.status_code == 400
    text = httpx.get(server.url + "/metrics").text
    for value in ("evil", "DROP", "example.com", "adaada"):
        assert value not in text
    assert server.metric("pandora_requests_total", mode="unknown", status="400") == len(hostile)
    label_values = {
        sample.labels.get("mode")
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "mode" in sample.labels
    }
    assert label_values <= set(REQUEST_MODES)


def test_per_task_savings_after_traffic(gateway_factory, fake_upstream):
    """`--metric-tasks code`: Grafana can split saved generations by X-Pandora-Task."""
    server = gateway_factory(
        policy_factory=lambda plan: StopAbove(99.0, max_samples=plan.max_samples),
        max_samples=4,
        baseline_n=10,
        metric_tasks=["code"],
    )
    url = server.url + "/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "one two"}]}
    for task in ("code", "code", "chat"):
        headers = {"X-Pandora-Task": task}
        assert httpx.post(url, json=body, headers=headers, timeout=10).status_code == 200
    task_body = {**body, "pandora": {"task": "code"}}  # the body field counts the same
    assert httpx.post(url, json=task_body, timeout=10).status_code == 200
    streamed = httpx.post(url, json={**task_body, "stream": True}, timeout=10)  # and streaming
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert httpx.post(url, json=body, timeout=10).status_code == 200
    m = server.metric
    assert m("pandora_task_requests_total", task="code", mode="adaptive") == 4
    assert m("pandora_task_generations_total", task="code", mode="adaptive") == 4 * 4
    assert m("pandora_task_samples_saved_total", task="code", mode="adaptive") == 4 * (10 - 4)
    # "chat" was not declared
    assert m("pandora_task_requests_total", task="other", mode="adaptive") == 1
    assert m("pandora_task_requests_total", task="none", mode="adaptive") == 1
    assert "chat" not in httpx.get(server.url + "/metrics").text
    # the per-task series add up to the gateway-wide counter
    total = sum(
        m("pandora_task_samples_saved_total", task=t, mode="adaptive")
        for t in ("code", "other", "none")
    )
    assert total == m("pandora_samples_saved_total")
