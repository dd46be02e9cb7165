"""The Kustomize manifests in deploy/k8s, rendered (`kubectl kustomize` where kubectl exists,
else the resource files as listed) and checked: what runs, with which probes, GPUs and users;
that Services, the HPA and the ServiceMonitor point at what exists; and that the gateway's
configuration is one the gateway accepts.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from server.config import Settings

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
NAMESPACE = "pandora"
GPU = "nvidia.com/gpu"


def _load_resources() -> list[dict]:
    """Without kubectl: the listed resources plus the generated ConfigMap, namespaced."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = [
        doc
        for resource in kustomization["resources"]
        for doc in yaml.safe_load_all((K8S / resource).read_text())
        if doc
    ]
    for generator in kustomization.get("configMapGenerator", []):
        data = dict(literal.split("=", 1) for literal in generator["literals"])
        meta = {"name": generator["name"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for doc in docs:
        if doc["kind"] != "Namespace":
            doc["metadata"]["namespace"] = kustomization["namespace"]
    return docs


@pytest.fixture(scope="module")
def manifests() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return _load_resources()
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(manifests: list[dict], kind: str, name: str | None = None) -> dict:
    matches = [
        doc
        for doc in manifests
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def container(deployment: dict) -> dict:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def test_the_stack_has_every_piece(manifests: list[dict]) -> None:
    kinds = sorted((doc["kind"], doc["metadata"]["name"]) for doc in manifests)
    for expected in [
        ("Deployment", "pandora-gateway"),
        ("Service", "pandora-gateway"),
        ("HorizontalPodAutoscaler", "pandora-gateway"),
        ("PodDisruptionBudget", "pandora-gateway"),
        ("Deployment", "pandora-reward-worker"),
        ("Service", "pandora-reward-worker"),
        ("Deployment", "vllm"),
        ("Service", "vllm"),
        ("ServiceMonitor", "pandora"),
        ("PrometheusRule", "pandora"),
        ("Namespace", NAMESPACE),
    ]:
        assert expected in kinds, f"missing {expected}"
    for doc in manifests:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]


def test_services_select_their_deployments_and_ports(manifests: list[dict]) -> None:
    deployments = [doc for doc in manifests if doc["kind"] == "Deployment"]
    for service in (doc for doc in manifests if doc["kind"] == "Service"):
        selector = service["spec"]["selector"]
        selected = [
            d
            for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, service["metadata"]["name"]
        (deployment,) = selected
        # The Deployment's own selector matches its pods too.
        match_labels = deployment["spec"]["selector"]["matchLabels"]
        assert match_labels.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        port_names = {p["name"] for p in container(deployment)["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, service["metadata"]["name"]


def test_hpa_scales_the_gateway_on_cpu(manifests: list[dict]) -> None:
    hpa = find(manifests, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "pandora-gateway")
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    # Utilization targets need CPU requests on the pods.
    gateway = container(find(manifests, "Deployment", "pandora-gateway"))
    assert gateway["resources"]["requests"]["cpu"]


def test_gateway_pods_are_probed_hardened_and_gpu_free(manifests: list[dict]) -> None:
    deployment = find(manifests, "Deployment", "pandora-gateway")
    gateway = container(deployment)
    assert gateway["image"].startswith("pandora-gateway")
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert gateway["startupProbe"]["httpGet"]["path"] == "/health"
    assert {"name": "http", "containerPort": 8080} in gateway["ports"]
    assert GPU not in gateway["resources"].get("limits", {})
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == 10001  # the Dockerfile's USER
    security = gateway["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert deployment["spec"]["replicas"] >= 2


@pytest.mark.parametrize(
    ("name", "image", "port"),
    [("pandora-reward-worker", "pandora-reward-worker", 8081), ("vllm", "vllm/vllm-openai:", 8000)],
)
def test_model_servers_get_a_gpu_and_time_to_load(
    manifests: list[dict], name: str, image: str, port: int
) -> None:
    deployment = find(manifests, "Deployment", name)
    server = container(deployment)
    assert server["image"].startswith(image)
    assert server["resources"]["limits"][GPU] == 1
    assert server["resources"]["requests"][GPU] == 1
    tolerations = deployment["spec"]["template"]["spec"]["tolerations"]
    assert any(t["key"] == GPU for t in tolerations)
    startup = server["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert {"name": "http", "containerPort": port} in server["ports"]
    assert f"--port={port}" in server["args"]


def test_reward_worker_args_parse_with_the_pandora_cli(manifests: list[dict]) -> None:
    from tests.test_deploy_containers import worker_settings

    worker = container(find(manifests, "Deployment", "pandora-reward-worker"))
    settings = worker_settings(worker["args"])
    assert (settings.host, settings.port, settings.device) == ("0.0.0.0", 8081, "cuda")
    gateway = container(find(manifests, "Deployment", "pandora-gateway"))
    from server.cli import build_parser

    assert build_parser().parse_args(gateway["args"]).command == "serve"


def test_gateway_configuration_is_accepted_and_points_at_the_services(
    manifests: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = container(find(manifests, "Deployment", "pandora-gateway"))
    (source,) = gateway["envFrom"]
    config_map = find(manifests, "ConfigMap", source["configMapRef"]["name"])
    environment = dict(config_map["data"])
    environment.update({e["name"]: e["value"] for e in gateway["env"] if "value" in e})
    for key, value in environment.items():
        assert key.startswith("PANDORA_"), key
        assert key.removeprefix("PANDORA_").lower() in Settings.model_fields, key
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.effective_reward_backend == "worker"

    services = {
        doc["metadata"]["name"]: {p["port"] for p in doc["spec"]["ports"]}
        for doc in manifests
        if doc["kind"] == "Service"
    }
    for url in (settings.upstream_url, settings.reward_url):
        assert url is not None
        parts = urlsplit(url)
        assert parts.hostname in services, url
        assert parts.port in services[parts.hostname], url


def test_servicemonitor_scrapes_every_service(manifests: list[dict]) -> None:
    monitor = find(manifests, "ServiceMonitor")
    (expression,) = monitor["spec"]["selector"]["matchExpressions"]
    assert expression["key"] == "app.kubernetes.io/name" and expression["operator"] == "In"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    services = [doc for doc in manifests if doc["kind"] == "Service"]
    assert len(services) == 3
    for service in services:
        name = service["metadata"]["name"]
        assert service["metadata"]["labels"]["app.kubernetes.io/name"] in expression["values"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, name
    # The Operator names each job after its Service: the alert rules select those names.
    rules = find(manifests, "PrometheusRule")
    exprs = " ".join(r["expr"] for g in rules["spec"]["groups"] for r in g["rules"])
    for job in ("vllm", "pandora-reward-worker", "pandora-gateway"):
        assert f'job="{job}"' in exprs
        assert job in {s["metadata"]["name"] for s in services}
