"""The app factory: ``create_app(settings, ...)`` builds a fresh gateway with its own clients,
registry and metrics, so tests (and several apps in one process) never share state.

Seams: ``upstream`` (an ``httpx.AsyncClient`` whose ``base_url`` is the OpenAI-compatible ``/v1``
root; tests point it at a fake server, the embedded default at an in-process transport),
``reward`` (any :class:`reward.base.RewardBackend`), ``registry`` and ``policy_factory``.
Clients the app creates itself are opened and closed in its lifespan; injected ones belong to
the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from reward.base import RewardBackend
from reward.local import LocalRewardBackend
from server.body_limit import BodyLimitMiddleware
from server.chat.api_router import router as chat_router
from server.chat.fast_path import install_fast_path
from server.config import Settings
from server.errors import GatewayError, InvalidRequestError
from server.lean_http import LeanPool
from server.metrics import GatewayMetrics
from server.ops import router as ops_router
from server.policies import PolicyFactory, build_policy
from server.priors import PriorStore
from server.sampling import Sampler
from server.state import GatewayState
from server.upstream import UpstreamClient, UpstreamFailure

__all__ = ["create_app", "upstream_http_clients"]


POOL_SHARDS = 16  # see UpstreamClient: many small connection pools instead of one large one


def _reward_identity(settings: Settings, reward: RewardBackend | None) -> str:
    """The reward scores the learned priors describe. An injected in-process backend names the
    model it actually loaded (the embedded default may have fallen back to the demo models, and
    it scores in-process even when --reward-url is set); otherwise the settings say."""
    if isinstance(reward, LocalRewardBackend):
        return f"local:{reward.model}"
    return settings.reward_identity


def _auth_headers(settings: Settings) -> dict[str, str]:
    if settings.upstream_api_key is None:
        return {}
    return {"Authorization": f"Bearer {settings.upstream_api_key.get_secret_value()}"}


def upstream_http_clients(settings: Settings, shards: int = POOL_SHARDS) -> list[httpx.AsyncClient]:
    """The pooled clients for a remote upstream (``--upstream-url``)."""
    headers = _auth_headers(settings)
    # One TLS context for all shards: building one costs ~0.1-0.2 s of CPU, paid per client.
    tls = httpx.create_ssl_context()
    return [
        httpx.AsyncClient(
            base_url=settings.upstream_url or "",
            headers=headers,
            verify=tls,
            timeout=httpx.Timeout(settings.request_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        for _ in range(shards)
    ]


def _default_reward(settings: Settings) -> RewardBackend:
    import reward

    return reward.create_backend(
        settings.effective_reward_backend,
        url=settings.reward_url,
        model=settings.reward_model,
        timeout=settings.reward_timeout,
        api_key=settings.reward_api_key.get_secret_value() if settings.reward_api_key else None,
        device=settings.device,
    )


def create_app(
    settings: Settings,
    *,
    upstream: httpx.AsyncClient | None = None,
    reward: RewardBackend | None = None,
    registry: CollectorRegistry | None = None,
    policy_factory: PolicyFactory | None = None,
) -> FastAPI:
    if upstream is None and settings.upstream_url is None:
        raise ValueError(
            "no upstream: pass --upstream-url, or build the embedded generator "
            "(server.embedded) and inject it as upstream="
        )
    registry = registry if registry is not None else CollectorRegistry()
    metrics = GatewayMetrics(
        registry, max_samples=settings.max_samples, tasks=tuple(settings.metric_tasks)
    )
    priors = (
        PriorStore(
            max_models=settings.max_priors,
            path=settings.prior_state_file,
            registry=registry,
            target_scale_shrink=settings.target_scale_shrink,
            reward_identity=_reward_identity(settings, reward),
        )
        if settings.learn_prior
        else None
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            clients = [upstream] if upstream is not None else []
            lean = None
            if not clients:
                for client in upstream_http_clients(settings):
                    clients.append(await stack.enter_async_context(client))
                if settings.use_lean_transport:
                    lean = LeanPool(
                        settings.upstream_url or "",
                        timeout=settings.request_timeout,
                        headers=_auth_headers(settings),
                    )
                    stack.push_async_callback(lean.aclose)
            if priors is not None:
                priors.open()
                priors.load()
                stack.callback(priors.save)  # on shutdown (no-op without a state file)
                stack.push_async_callback(priors.aclose)  # the table-build thread, before save
            backend = reward
            if backend is None:
                backend = _default_reward(settings)
                stack.push_async_callback(backend.aclose)

            def on_attempt(seconds: float, failure: UpstreamFailure | None) -> None:
                metrics.upstream_duration.observe(seconds)
                if failure is not None:
                    metrics.upstream_error(failure.kind)

            upstream_client = UpstreamClient(
                clients,
                retries=settings.upstream_retries,
                backoff=settings.retry_backoff,
                on_attempt=on_attempt,
                lean=lean,
            )
            app.state.gateway = GatewayState(
                settings=settings,
                registry=registry,
                metrics=metrics,
                upstream=upstream_client,
                reward=backend,
                sampler=Sampler(
                    upstream_client,
                    backend,
                    metrics,
                    policy_factory or build_policy,
                    reward_fallback=settings.reward_failure == "first",
                    reward_timeout=settings.reward_timeout,
                    priors=priors,
                ),
            )
            yield

    app = FastAPI(
        title="pandora-gateway",
        description="OpenAI-compatible adaptive Best-of-N gateway",
        version="0.1.0",
        lifespan=lifespan,
        # The schema reveals no secret, and a browser cannot send a Bearer key to /docs; a
        # deployment that wants no public surface turns them off (--no-docs).
        **({} if settings.docs else {"openapi_url": None, "docs_url": None, "redoc_url": None}),
    )
    app.state.api_keys = [key.get_secret_value().encode() for key in settings.api_key]
    app.state.protect_ops = settings.protect_metrics
    app.state.priors = priors
    app.include_router(chat_router)
    app.include_router(ops_router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    install_fast_path(app)  # the chat endpoint bypasses the stack (enforcing the limit itself)

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        error = InvalidRequestError(f"{param}: {first.get('msg')}", param=param)
        return JSONResponse(error.to_dict(), status_code=400)

    return app
