"""Configuration: flags and PANDORA_* environment map onto one Settings; bad config stops
start-up with one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from server.cli import build_parser
from server.config import Settings
from server.serve_cli import FLAGS, load_settings

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_has_a_flag_and_every_flag_a_setting():
    assert {name for name, _, _ in FLAGS} == set(Settings.model_fields)


def test_flags_override_environment_which_overrides_defaults(monkeypatch):
    monkeypatch.setenv("PANDORA_MAX_SAMPLES", "12")
    monkeypatch.setenv("PANDORA_PARALLELISM", "3")
    monkeypatch.setenv("PANDORA_API_KEY", "a, b")
    args = build_parser().parse_args(
        ["serve", "--parallelism", "2", "--upstream-url", "http://vllm:8000/v1/", "--api-key", "k"]
    )
    settings = load_settings(args)
    assert settings.max_samples == 12 and settings.parallelism == 2
    assert settings.upstream_url == "http://vllm:8000/v1"
    assert [k.get_secret_value() for k in settings.api_key] == ["k"]
    monkeypatch.delenv("PANDORA_MAX_SAMPLES")
    settings = load_settings(build_parser().parse_args(["serve"]))
    assert [k.get_secret_value() for k in settings.api_key] == ["a", "b"]
    assert settings.max_samples == 32 and settings.effective_baseline_n == 32
    assert settings.embedded and settings.effective_reward_backend == "local"


def test_metric_tasks_from_flags_and_environment(monkeypatch):
    monkeypatch.setenv("PANDORA_METRIC_TASKS", "code, chat")
    assert load_settings(build_parser().parse_args(["serve"])).metric_tasks == ["code", "chat"]
    args = build_parser().parse_args(
        ["serve", "--metric-tasks", "maths", "--metric-tasks", "code,qa:v2"]
    )
    assert load_settings(args).metric_tasks == ["maths", "code", "qa:v2"]
    monkeypatch.delenv("PANDORA_METRIC_TASKS")
    assert load_settings(build_parser().parse_args(["serve"])).metric_tasks == []


def test_derived_defaults():
    settings = Settings(upstream_url="http://x/v1", reward_url="http://rm:9000", baseline_n=16)
    assert settings.effective_reward_backend == "worker"
    assert settings.effective_baseline_n == 16 and not settings.embedded


@pytest.mark.parametrize(
    "values",
    [
        {"upstream_url": "vllm:8000/v1"},
        {"upstream_url": "ftp://host/v1"},
        {"reward_backend": "magic"},
        {"reward_backend": "worker"},  # no reward_url
        {"min_samples": 5, "max_samples": 4},
        {"parallelism": 0},
        {"default_cost": 1.5},
        {"default_mode": "greedy"},
        {"port": 70000},
        {"metric_tasks": ["code review"]},  # not a task label
        {"metric_tasks": ["other"]},  # reserved: the fold of undeclared tasks
        {"metric_tasks": "code,chat,code"},
        {"metric_tasks": [f"t{i}" for i in range(33)]},  # one series each: bounded
    ],
)
def test_invalid_settings_are_refused(values):
    with pytest.raises(ValidationError):
        Settings(**values)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--upstream-url", "localhost:8000"], "--upstream-url"),
        (["--reward-backend", "magic"], "--reward-backend"),
        (["--min-samples", "9", "--max-samples", "4"], "min_samples (9) must not exceed"),
        (["--max-samples", "many"], "--max-samples"),
        (["--metric-tasks", "a b"], "--metric-tasks"),
    ],
)
def test_cli_refuses_bad_configuration_with_one_line(argv, expected):
    result = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pandora serve: invalid configuration")
    assert expected in lines[0]


def test_missing_models_without_hub_access_fail_with_one_clear_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.cli",
            "serve",
            "--generator-model",
            str(tmp_path / "no-such-model"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("pandora serve: cannot load the generator model")
    assert "--demo-tiny-models" in last and "--upstream-url" in last


def test_serve_help_lists_env_names():
    result = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0
    assert "PANDORA_UPSTREAM_URL" in result.stdout and "--baseline-n" in result.stdout


def test_cli_module_imports_nothing_heavy():
    code = (
        "import sys, server.serve_cli\n"
        "heavy = {'torch', 'transformers', 'fastapi', 'httpx', 'pydantic'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize(
    ("url", "transport", "proxy", "lean"),
    [
        ("http://vllm:8000/v1", "auto", None, True),
        ("https://api.example.com/v1", "auto", None, False),  # TLS: httpx
        ("http://vllm:8000/v1", "auto", "http://proxy:3128", False),  # proxied: httpx
        ("http://vllm:8000/v1", "httpx", None, False),
        ("http://vllm:8000/v1", "lean", "http://proxy:3128", True),  # explicit choice wins
        (None, "auto", None, False),  # embedded: no remote upstream
    ],
)
def test_lean_upstream_client_only_where_it_is_safe(monkeypatch, url, transport, proxy, lean):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    if proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy)
    settings = Settings(upstream_url=url, upstream_transport=transport)
    assert settings.use_lean_transport is lean
