"""Gateway configuration: one settings object, built once at start-up.

Every field reads ``PANDORA_<NAME>`` from the environment (pydantic-settings) and every
``pandora serve --flag`` maps onto the same field, so the CLI, containers and tests configure
the gateway the same way. Validators refuse to start on configuration that cannot work.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = [
    "DEFAULT_GENERATOR_MODEL",
    "DEFAULT_REWARD_MODEL",
    "MODES",
    "TASK_PATTERN",
    "TASK_RULE",
    "Mode",
    "Settings",
]

Mode = Literal["adaptive", "target", "fixed", "off"]
MODES: tuple[str, ...] = ("adaptive", "target", "fixed", "off")

# Small real models for the embedded default (no --upstream-url): both run on a laptop CPU.
DEFAULT_GENERATOR_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
DEFAULT_REWARD_MODEL = "Skywork/Skywork-Reward-V2-Qwen3-0.6B"
# A task (X-Pandora-Task) names a kind of prompt (its reward shape): X-Request-Id's characters,
# 1-64 of them.
TASK_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
TASK_RULE = "1-64 of the characters A-Z a-z 0-9 . _ : -"  # TASK_PATTERN, for error messages
# Per-task metric series: the declared labels plus these two, so a Prometheus series count
# stays bounded whatever clients send.
METRIC_TASKS_MAX = 32
METRIC_TASK_FOLDS = ("other", "none")  # an undeclared task / no task


class Settings(BaseSettings):
    """Everything `pandora serve` can be told. Field docs double as ``--help`` text."""

    model_config = SettingsConfigDict(env_prefix="PANDORA_", extra="ignore", frozen=True)

    upstream_url: str | None = Field(
        None,
        description="OpenAI-compatible base URL (e.g. http://vllm:8000/v1); "
        "unset = generate in-process with --generator-model",
    )
    upstream_api_key: SecretStr | None = Field(None, description="Bearer key sent upstream")
    upstream_transport: Literal["auto", "lean", "httpx"] = Field(
        "auto",
        description="client for --upstream-url: lean (pooled HTTP/1.1, ~3x less CPU), httpx "
        "(proxies, HTTPS), or auto (lean for plain http:// with no proxy set, else httpx)",
    )
    reward_backend: Literal["worker", "vllm", "local"] | None = Field(
        None, description="worker|vllm|local (default: worker if --reward-url else local)"
    )
    reward_url: str | None = Field(None, description="reward worker or vLLM pooling base URL")
    reward_api_key: SecretStr | None = Field(
        None, description="Bearer key sent to the reward worker / vLLM pooling server"
    )
    reward_model: str = Field(DEFAULT_REWARD_MODEL, description="reward model name or path")
    generator_model: str = Field(
        DEFAULT_GENERATOR_MODEL, description="in-process generator (only without --upstream-url)"
    )
    device: str = Field("auto", description="device for in-process models (auto|cpu|cuda)")
    demo_tiny_models: bool = Field(
        False,
        description="offline demo: build tiny RANDOM-weight local models (random text) "
        "instead of downloading --generator-model/--reward-model",
    )
    host: str = Field("127.0.0.1", description="bind address (0.0.0.0 in containers)")
    port: int = Field(8080, ge=0, le=65535)
    max_samples: int = Field(32, ge=1, le=1024, description="server cap on samples per request")
    min_samples: int | None = Field(None, ge=1, description="default minimum samples")
    parallelism: int = Field(4, ge=1, le=256, description="candidates in flight per request")
    default_mode: Mode = "adaptive"
    default_cost: float = Field(0.05, gt=0, lt=1, description="cost per sample (adaptive mode)")
    default_target: float = Field(0.9, gt=0, le=1, description="target acceptance (target mode)")
    baseline_n: int | None = Field(
        None, ge=1, description="fixed N that savings are counted against (default max-samples)"
    )
    api_key: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="client keys (repeatable; env: comma-separated)"
    )
    protect_metrics: bool = Field(False, description="require the API key on /metrics and /ready")
    docs: bool = Field(
        True, description="serve the OpenAPI schema and docs pages (/openapi.json, /docs, /redoc)"
    )
    request_timeout: float = Field(300.0, gt=0, description="seconds per upstream call and request")
    upstream_retries: int = Field(2, ge=0, le=10, description="retries per candidate")
    retry_backoff: float = Field(0.25, ge=0, description="first retry delay in seconds (doubles)")
    keepalive_interval: float = Field(5.0, gt=0, description="SSE keep-alive comment period")
    reward_failure: Literal["error", "first"] = Field(
        "error", description="reward backend down: 503 (error) or return the first candidate"
    )
    reward_timeout: float = Field(30.0, gt=0, description="seconds per reward call")
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024, description="request body limit")
    learn_prior: bool = Field(
        True,
        description="learn each model's reward-tail prior from finished requests and give it to "
        "new adaptive/target requests",
    )
    max_priors: int = Field(
        64,
        ge=1,
        le=100_000,
        description="learned priors kept, one per (model, task, mode); least recently used "
        "dropped first",
    )
    target_scale_shrink: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="target mode: weight of the model's learned reward spreads against a "
        "request's own (1: saves the most; lower: each prompt closer to its target, less saved)",
    )
    metric_tasks: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="X-Pandora-Task labels with their own series on the per-task metrics "
        "(repeatable or comma-separated; other tasks count as 'other', none as 'none')",
    )
    prior_state_file: Path | None = Field(
        None,
        description="JSON file of the learned priors: loaded at start-up if present, saved "
        "atomically on shutdown and every 50 finished requests",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    @field_validator("upstream_url", "reward_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http(s) URL with a host, got {value!r}")
        return value.rstrip("/")

    @field_validator("prior_state_file", mode="before")
    @classmethod
    def _state_file(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None  # PANDORA_PRIOR_STATE_FILE="" means: no file
        path = Path(str(value)).expanduser()
        if path.is_dir():
            raise ValueError(f"must be a file path, {str(path)!r} is a directory")
        return path

    @field_validator("api_key", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    @field_validator("metric_tasks", mode="before")
    @classmethod
    def _split_tasks(cls, value: object) -> object:
        items = [value] if isinstance(value, str) else value
        if isinstance(items, list | tuple):
            return [t.strip() for item in items for t in str(item).split(",") if t.strip()]
        return value

    @field_validator("metric_tasks")
    @classmethod
    def _task_labels(cls, tasks: list[str]) -> list[str]:
        for task in tasks:
            if TASK_PATTERN.fullmatch(task) is None:
                raise ValueError(f"a task is {TASK_RULE}, got {task!r}")
            if task in METRIC_TASK_FOLDS:
                raise ValueError(f"{task!r} is reserved (requests with another task / none)")
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"a task is listed twice: {tasks}")
        if len(tasks) > METRIC_TASKS_MAX:
            raise ValueError(f"at most {METRIC_TASKS_MAX} tasks (a series each), got {len(tasks)}")
        return tasks

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.min_samples is not None and self.min_samples > self.max_samples:
            raise ValueError(
                f"min_samples ({self.min_samples}) must not exceed max_samples ({self.max_samples})"
            )
        if self.reward_backend in ("worker", "vllm") and not self.reward_url:
            raise ValueError(f"reward_backend {self.reward_backend!r} needs reward_url")
        return self

    # -- derived values ------------------------------------------------------------------
    @property
    def effective_reward_backend(self) -> str:
        return self.reward_backend or ("worker" if self.reward_url else "local")

    @property
    def reward_identity(self) -> str:
        """Which reward scores the learned priors describe (saved with them, see
        :class:`server.priors.PriorStore`): the backend and what names the model behind it.

        A prior learns the shape and the scale of one reward model's scores; restored under
        another (a new worker URL, another local or vLLM reward model), it would mislead every
        request until it had relearned - and it never forgets. A worker is known by its URL only
        (the model behind it is the worker's own setting). Credentials in a URL are left out.
        """
        backend = self.effective_reward_backend
        if backend == "worker":
            return f"worker:{_without_credentials(self.reward_url)}"
        if backend == "vllm":
            return f"vllm:{_without_credentials(self.reward_url)}:{self.reward_model}"
        return f"local:{self.reward_model}"

    @property
    def effective_baseline_n(self) -> int:
        return self.baseline_n or self.max_samples

    @property
    def use_lean_transport(self) -> bool:
        """The lean client speaks plain HTTP/1.1 only and reads no proxy settings, so ``auto``
        keeps httpx for HTTPS upstreams and wherever a proxy applies."""
        if self.upstream_url is None or self.upstream_transport == "httpx":
            return False
        if self.upstream_transport == "lean":
            return True
        parts = urlsplit(self.upstream_url)
        if parts.scheme != "http":
            return False
        proxies = urllib.request.getproxies()
        if not (proxies.get("http") or proxies.get("all")):
            return True
        return bool(urllib.request.proxy_bypass(parts.hostname or ""))

    @property
    def embedded(self) -> bool:
        """True when the gateway generates in-process (no upstream URL)."""
        return self.upstream_url is None


def _without_credentials(url: str | None) -> str:
    """``url`` without a ``user:password@`` part (it is saved to disk and logged)."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
