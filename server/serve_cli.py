"""`pandora serve`: run the gateway (imports nothing heavy until it runs).

Every flag maps onto a field of :class:`server.config.Settings` and falls back to the
environment variable ``PANDORA_<NAME>``, then to the default. Wrong configuration stops
start-up with one clear line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["FLAGS", "register", "run"]

# (setting name, kind, help). kind: "value" | "bool" | "append". Kept as data (not derived from
# Settings at import time) so `pandora --help` needs no pydantic; a test keeps the two in sync.
FLAGS: tuple[tuple[str, str, str], ...] = (
    (
        "upstream_url",
        "value",
        "OpenAI-compatible base URL, e.g. http://vllm:8000/v1 "
        "(unset: generate in-process with --generator-model)",
    ),
    ("upstream_api_key", "value", "API key sent to the upstream"),
    (
        "upstream_transport",
        "value",
        "auto|lean|httpx: upstream HTTP client (auto: lean for plain http:// without a proxy)",
    ),
    (
        "reward_backend",
        "value",
        "worker|vllm|local (default: worker with --reward-url, else local)",
    ),
    ("reward_url", "value", "reward worker / vLLM pooling server base URL"),
    ("reward_api_key", "value", "API key sent to the reward worker / vLLM pooling server"),
    ("reward_model", "value", "reward model (hub name or local path)"),
    ("generator_model", "value", "in-process generator (hub name or local path)"),
    ("device", "value", "device for in-process models: auto|cpu|cuda"),
    ("demo_tiny_models", "bool", "offline demo: tiny RANDOM-weight local models (random text)"),
    ("host", "value", "bind address (default 127.0.0.1; 0.0.0.0 in containers)"),
    ("port", "value", "port (default 8080)"),
    ("max_samples", "value", "server cap on samples per request (default 32)"),
    ("min_samples", "value", "default minimum samples per request"),
    ("parallelism", "value", "candidates in flight per request (default 4)"),
    ("default_mode", "value", "adaptive|target|fixed|off (default adaptive)"),
    ("default_cost", "value", "default cost per sample in (0, 1) for adaptive mode"),
    ("default_target", "value", "default target acceptance in (0, 1] for target mode"),
    ("baseline_n", "value", "fixed N that savings are counted against (default max-samples)"),
    ("api_key", "append", "client API key (repeatable); clients send 'Authorization: Bearer'"),
    ("protect_metrics", "bool", "require the API key on /metrics and /ready too"),
    (
        "docs",
        "bool",
        "serve /openapi.json, /docs and /redoc (default on, no key needed; --no-docs hides them)",
    ),
    ("request_timeout", "value", "seconds per upstream call and per request (default 300)"),
    ("upstream_retries", "value", "retries per candidate on 429/5xx/network errors (default 2)"),
    ("retry_backoff", "value", "first retry delay in seconds, doubled each retry (default 0.25)"),
    ("keepalive_interval", "value", "seconds between SSE keep-alive comments (default 5)"),
    ("reward_failure", "value", "reward backend down: error (503) or first (first candidate)"),
    ("reward_timeout", "value", "seconds per reward call (default 30)"),
    ("max_body_bytes", "value", "request body limit in bytes (default 10 MB)"),
    (
        "learn_prior",
        "bool",
        "learn each model's reward-tail prior across requests (default on)",
    ),
    (
        "max_priors",
        "value",
        "learned priors kept, one per (model, X-Pandora-Task, mode), LRU (default 64)",
    ),
    (
        "target_scale_shrink",
        "value",
        "target mode, 0-1: weight of the learned reward spreads against a request's own "
        "(default 1: saves most; 0.25: each prompt closer to its target, less saved)",
    ),
    (
        "metric_tasks",
        "append",
        "X-Pandora-Task labels with their own series on the per-task metrics "
        "(repeatable or comma-separated; others count as 'other', no task as 'none')",
    ),
    (
        "prior_state_file",
        "value",
        "JSON file for the learned priors: loaded at start-up, saved on shutdown and periodically",
    ),
    ("log_level", "value", "critical|error|warning|info|debug"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the OpenAI-compatible adaptive Best-of-N gateway",
        description="Run the gateway. Every flag can also be set as PANDORA_<NAME> "
        "(e.g. PANDORA_UPSTREAM_URL).",
    )
    for name, kind, help_text in FLAGS:
        flag = "--" + name.replace("_", "-")
        env = f" [env PANDORA_{name.upper()}]"
        if kind == "bool":
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text + env,
            )
        elif kind == "append":
            parser.add_argument(
                flag, action="append", default=argparse.SUPPRESS, help=help_text + env
            )
        else:
            parser.add_argument(flag, default=argparse.SUPPRESS, help=help_text + env)
    parser.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"pandora serve: {message}", file=sys.stderr)
    return 2


def load_settings(args: argparse.Namespace):
    """Settings from flags (given ones only) over environment over defaults."""
    from server.config import Settings

    given = {name: getattr(args, name) for name, _, _ in FLAGS if hasattr(args, name)}
    return Settings(**given)


def describe_validation_error(exc) -> str:
    first = exc.errors(include_url=False)[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["loc"]:
        flag = "--" + str(first["loc"][0]).replace("_", "-")
        return f"invalid configuration: {flag}: {message} (got {first.get('input')!r})"
    return f"invalid configuration: {message}"


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        settings = load_settings(args)
    except ValidationError as exc:
        return _fail(describe_validation_error(exc))

    import logging

    from server.app import create_app
    from server.uvicorn_server import serve

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    if settings.log_level != "debug":  # httpx logs every candidate request at INFO
        logging.getLogger("httpx").setLevel(logging.WARNING)
    upstream = reward = None
    if settings.embedded:
        from server.embedded import EmbeddedLoadError, build_embedded

        try:
            upstream, reward = build_embedded(settings)
        except EmbeddedLoadError as exc:
            return _fail(str(exc))
    elif settings.effective_reward_backend == "local":
        from server.embedded import EmbeddedLoadError, build_local_reward

        try:
            reward = build_local_reward(settings, settings.reward_model)
        except EmbeddedLoadError as exc:
            return _fail(str(exc))
    try:
        app = create_app(settings, upstream=upstream, reward=reward)
    except ValueError as exc:
        return _fail(f"invalid configuration: {exc}")
    serve(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=10,
    )
    return 0
