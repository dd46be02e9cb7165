"""Static checks of the observability artefacts in deploy/: Prometheus config and alert rules
(promtool), the "Saved generations" Grafana dashboard and its provisioning.

The live counterpart, tests/test_deploy_prometheus.py, runs every PromQL expression found here
against a real Prometheus scraping a real gateway.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from reward.metrics import RewardMetrics
from server.metrics import GatewayMetrics
from server.priors import PriorStore
from tests.test_server_metrics import ISSUE_6_NAMES

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "saved-generations.json"
PROVISIONING = DEPLOY / "grafana" / "provisioning"

# The gateway metrics issue 6 fixes by name, with their Prometheus types (pinned once).
ISSUE_METRICS = ISSUE_6_NAMES
METRIC_NAME = re.compile(r"\b(pandora_[a-z_]+)\b")


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: install Debian's `prometheus` package (.ci/run does)"
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args],
        cwd=PROMETHEUS_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def dashboard_panels(panels: list[dict] | None = None) -> list[dict]:
    """Every panel of the dashboard, rows' nested panels included."""
    if panels is None:
        panels = json.loads(DASHBOARD.read_text())["panels"]
    found = []
    for panel in panels:
        found.append(panel)
        found.extend(dashboard_panels(panel.get("panels", [])))
    return found


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", []) if t.get("expr")]


def alert_rules() -> list[dict]:
    groups = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def gateway_sample_names() -> set[str]:
    """Sample names a freshly built gateway exposes (its label values are created up front),
    with the learned priors' metrics (on by default, `--no-learn-prior` turns them off)."""
    registry = CollectorRegistry()
    GatewayMetrics(registry, max_samples=8)
    PriorStore(registry=registry)
    return {sample.name for family in registry.collect() for sample in family.samples}


def worker_sample_names() -> set[str]:
    """Sample names the reward worker exposes."""
    registry = CollectorRegistry()
    RewardMetrics(registry)
    return {sample.name for family in registry.collect() for sample in family.samples}


def referenced_metric_names(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))


# --- Prometheus ------------------------------------------------------------------------------


def test_promtool_accepts_the_config_and_the_rules_it_loads() -> None:
    result = run_promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    # The config really loads the rule file (a glob matching nothing would also pass).
    assert "1 rule files found" in result.stdout, result.stdout


def test_promtool_accepts_the_alert_rules() -> None:
    result = run_promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rule_unit_tests_pass() -> None:
    result = run_promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fired == set(), f"alerts never shown to fire: {sorted(names - fired)}"


def test_alerts_cover_the_failures_the_issue_names() -> None:
    by_name = {rule["alert"]: rule for rule in alert_rules()}
    assert "pandora_requests_total" in by_name["PandoraHighErrorRatio"]["expr"]
    assert 'up{job="vllm"}' in by_name["PandoraUpstreamDown"]["expr"]
    assert "pandora_samples_saved_total" in by_name["PandoraSavingsCollapsing"]["expr"]
    assert "pandora_request_duration_seconds_bucket" in by_name["PandoraHighLatency"]["expr"]
    for rule in by_name.values():
        assert rule["labels"]["severity"] in {"page", "ticket"}
        assert rule["annotations"]["summary"]
        assert "for" in rule, f"{rule['alert']} would fire on a single bad evaluation"


def test_scrape_config_covers_gateway_reward_worker_and_vllm() -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    expected = {"pandora-gateway": 8080, "pandora-reward-worker": 8081, "vllm": 8000}
    for job, port in expected.items():
        assert job in jobs, f"no scrape job {job}"
        (sd,) = jobs[job]["dns_sd_configs"]
        assert sd["port"] == port
    # The alert rules select on these job names.
    exprs = " ".join(rule["expr"] for rule in alert_rules())
    for job in re.findall(r'job="([^"]+)"', exprs):
        assert job in jobs, f"alert selects job {job!r}, which nothing scrapes"


def test_prometheusrule_for_the_operator_matches_alerts_yml() -> None:
    sys.path.insert(0, str(DEPLOY))
    try:
        import sync_prometheusrule
    finally:
        sys.path.remove(str(DEPLOY))
    committed = (DEPLOY / "k8s" / "prometheusrule.yaml").read_text()
    assert committed == sync_prometheusrule.render(), "run `python deploy/sync_prometheusrule.py`"
    rule = yaml.safe_load(committed)
    assert rule["kind"] == "PrometheusRule"
    groups = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
    assert rule["spec"]["groups"] == groups


# --- metric names: deploy/, the gateway and the reward worker agree ----------------------


def test_gateway_exposes_every_metric_the_issue_fixes() -> None:
    names = gateway_sample_names()
    for name, kind in ISSUE_METRICS.items():
        expected = {"histogram": f"{name}_bucket", "counter": name, "gauge": name}[kind]
        assert expected in names, f"gateway does not expose {expected}"


def test_every_pandora_metric_used_in_deploy_exists() -> None:
    names = gateway_sample_names() | worker_sample_names()
    exprs = dashboard_exprs() + [rule["expr"] for rule in alert_rules()]
    used = set().union(*(referenced_metric_names(expr) for expr in exprs))
    assert used, "no pandora_* metric referenced at all"
    assert used - names == set(), f"unknown metrics: {sorted(used - names)}"


# --- Grafana ---------------------------------------------------------------------------------


def test_dashboard_is_provisioned_with_its_datasource() -> None:
    (datasource,) = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert datasource["isDefault"] is True
    (provider,) = yaml.safe_load((PROVISIONING / "dashboards" / "pandora.yml").read_text())[
        "providers"
    ]
    assert provider["type"] == "file"
    # docker-compose mounts deploy/grafana/dashboards at this path.
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"

    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "Saved generations"
    assert dashboard["uid"] == "pandora-saved-generations"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    # Panels reference the datasource through a variable whose default is the provisioned uid.
    assert variables["datasource"]["current"]["value"] == datasource["uid"]
    for panel in dashboard_panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel.get("description"), f"panel {panel['title']!r} explains nothing"


def test_dashboard_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard_panels():
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def _panels_using(pattern: str) -> list[dict]:
    return [
        p
        for p in dashboard_panels()
        if any(re.search(pattern, t.get("expr", "")) for t in p.get("targets", []))
    ]


@pytest.mark.parametrize(
    ("what", "pattern"),
    [
        ("requests/s by mode", r"sum by \(mode\) \(rate\(pandora_requests_total"),
        ("samples p50", r"histogram_quantile\(0\.5, .*pandora_samples_per_request_bucket"),
        ("samples p90", r"histogram_quantile\(0\.9, .*pandora_samples_per_request_bucket"),
        ("baseline N", r"\(sum\(rate\(pandora_samples_per_request_sum.*samples_saved_total"),
        ("saved per second", r"^sum\(rate\(pandora_samples_saved_total\[\$__rate_interval\]\)\)$"),
        ("saved in total", r"^sum\(increase\(pandora_samples_saved_total\[\$__range\]\)\)$"),
        ("saved share", r"pandora_samples_saved_total.*/ \(.*pandora_samples_saved_total"),
        ("tokens saved", r"pandora_samples_saved_total.*\*.*pandora_tokens_total"),
        ("stop reasons", r"sum by \(reason\) .*pandora_stop_reason_total"),
        ("best reward", r"pandora_best_reward_bucket"),
        ("request latency p50", r"histogram_quantile\(0\.5, .*pandora_request_duration_seconds"),
        ("request latency p99", r"histogram_quantile\(0\.99, .*pandora_request_duration_seconds"),
        ("upstream latency p99", r"histogram_quantile\(0\.99, .*pandora_upstream_request_dur"),
        ("reward latency p99", r"histogram_quantile\(0\.99, .*pandora_reward_request_dur"),
        ("errors", r"pandora_requests_total\{status!=\"200\""),
        ("upstream errors", r"pandora_upstream_errors_total"),
        ("in-flight requests", r"pandora_inflight_requests"),
        ("in-flight candidates", r"pandora_inflight_candidates"),
        ("reward worker throughput", r"pandora_reward_items_scored_total"),
        ("reward worker batch size", r"pandora_reward_batch_size_bucket"),
        ("saved share by task", r"sum by \(task\) .*pandora_task_samples_saved_total"),
        ("generations by task", r"sum by \(task\) .*pandora_task_generations_total"),
    ],
)
def test_dashboard_has_every_panel_the_issue_lists(what: str, pattern: str) -> None:
    assert _panels_using(pattern), f"no panel shows {what} (pattern {pattern!r})"


def test_best_reward_distribution_is_a_heatmap_of_buckets() -> None:
    (heatmap,) = [p for p in dashboard_panels() if p["type"] == "heatmap"]
    (target,) = heatmap["targets"]
    assert target["format"] == "heatmap"
    assert "by (le)" in target["expr"] and "pandora_best_reward_bucket" in target["expr"]


# --- README ------------------------------------------------------------------------------------


def test_readme_deploy_section_explains_every_metric_and_alert() -> None:
    readme = (REPO / "README.md").read_text()
    start = readme.index("<!-- section:deploy -->")
    end = readme.index("<!-- section:", start + 1)
    section = readme[start:end]
    for name in ISSUE_METRICS:
        assert f"| `{name}` |" in section, f"README: no row for {name}"
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in section, f"README: alert {rule['alert']} not explained"
    for path in ("docker-compose.yml", "deploy/k8s", "http://localhost:3000", "kubectl apply -k"):
        assert path in section
