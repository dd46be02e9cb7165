"""The reward worker's HTTP service: ``POST /v1/rewards``, ``GET /health``, ``GET /metrics``.

The model loads in the background after the server starts, so orchestrators see ``/health``
answer 503 while loading and 200 once scoring works. Errors use OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError
from pydantic_core import to_json

from reward.auth import worker_auth
from reward.base import RewardError, RewardInputError
from reward.fast_path import PATH as FAST_PATH
from reward.fast_path import RewardsFastPath
from reward.local import LocalRewardBackend
from reward.metrics import RewardMetrics
from reward.protocol import ErrorBody, ErrorResponse, RewardRequest, RewardResponse
from reward.settings import WorkerSettings

if TYPE_CHECKING:
    from reward.scorer import RewardScorer

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


_INVALID = "invalid_request_error"


# (HTTP status, JSON body) of an answer to POST /v1/rewards
Answer = tuple[int, bytes]


def _response(answer: Answer) -> Response:
    status, payload = answer
    return Response(payload, status_code=status, media_type="application/json")


def _error(status: int, message: str, type_: str, param: str | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(message=message, type=type_, param=param, code=None))
    return JSONResponse(body.model_dump(), status_code=status)


def create_app(
    settings: WorkerSettings,
    *,
    registry: CollectorRegistry | None = None,
    load_scorer: Callable[[], RewardScorer] | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
    on_loaded: Callable[[], None] | None = None,
) -> FastAPI:
    """Build the worker app. ``load_scorer`` replaces how the model loads (tests); ``registry``
    receives the metrics (a fresh one by default); ``on_load_failure`` lets the CLI exit when the
    model cannot load instead of answering 503 forever; ``on_loaded`` runs on the event loop once
    the model has loaded (the CLI freezes the heap there)."""
    registry = registry if registry is not None else CollectorRegistry()
    metrics = RewardMetrics(registry)
    backend = LocalRewardBackend(
        settings.model,
        device=settings.device,
        dtype=settings.dtype,
        label_index=settings.label_index,
        max_batch_size=settings.max_batch_size,
        max_batch_tokens=settings.max_batch_tokens,
        max_wait_ms=settings.max_wait_ms,
        max_length=settings.max_length,
        torch_threads=settings.torch_threads,
        prefix_sharing=settings.prefix_sharing,
        observer=metrics,
        load_scorer=load_scorer,
    )

    async def load() -> None:
        try:
            await backend.load()
        except Exception as exc:
            logger.error("reward model failed to load: %s", exc)
            if on_load_failure is not None:
                on_load_failure(exc)
            return
        metrics.model_loaded.set(1)
        scorer = backend.scorer
        if scorer is not None:
            metrics.prefix_sharing_source = lambda: (  # an injected scorer may lack them
                bool(getattr(scorer, "prefix_sharing", False)),
                int(getattr(scorer, "shared_prefix_tokens", 0)),
            )
        logger.info("reward model %s loaded; serving", settings.model)
        if on_loaded is not None:
            try:
                on_loaded()
            except Exception:  # a failing hook must not look like a model that never loaded
                logger.exception("the worker's on-loaded hook failed")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(load(), name="reward-worker-load")
        try:
            yield
        finally:
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)
            await backend.aclose()

    app = FastAPI(title="pandora reward worker", lifespan=lifespan, **worker_auth(settings.api_key))
    app.state.backend = backend
    app.state.metrics = metrics

    def error(status: int, message: str, type_: str, param: str | None = None) -> Answer:
        metrics.errors.labels(kind="invalid" if status < 500 else "request").inc()
        body = {"error": {"message": message, "type": type_, "param": param, "code": None}}
        return status, to_json(body)

    def invalid(errors: list[Any]) -> Answer:
        """422 naming the first thing wrong, for FastAPI's and pydantic's error lists alike."""
        first: dict[str, Any] = errors[0] if errors else {}
        location = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(location) or None
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            detail = first.get("ctx", {}).get("error", "")
            where = f" (at character {location[-1]})" if location else ""
            message = f"request body is not valid JSON: {detail}{where}"
            param = None
        elif param:
            message = f"{param}: {message}"
        return error(422, message, _INVALID, param)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return _response(invalid(list(exc.errors())))

    async def answer(body: RewardRequest) -> Answer:
        if not body.messages:
            return error(400, "messages must not be empty", _INVALID, "messages")
        if not body.responses:
            return error(400, "responses must not be empty", _INVALID, "responses")
        if len(body.responses) > settings.max_responses:
            message = (
                f"at most {settings.max_responses} responses per request, got {len(body.responses)}"
            )
            return error(400, message, _INVALID, "responses")
        if not backend.loaded:
            return error(503, "reward model is not loaded yet", "service_unavailable")
        messages = [message.model_dump(exclude_none=True) for message in body.messages]
        try:
            result = await backend.score_detailed(messages, body.responses)
        except RewardInputError as exc:
            return error(400, str(exc), _INVALID, "messages")
        except RewardError as exc:
            return error(500, str(exc), "server_error")
        metrics.truncated.inc(sum(result.truncated))
        # Serialised directly in RewardResponse's shape (which documents it in the schema):
        # skips FastAPI's validate-then-encode of the return value, per-request hot-path cost.
        scored = {
            "model": settings.model_name,
            "scores": result.scores,
            "truncated": result.truncated,
            "usage": {"prompt_tokens": result.prompt_tokens},
        }
        return 200, to_json(scored)

    async def answer_raw(raw: bytes) -> Answer:
        try:
            body = RewardRequest.model_validate_json(raw)
        except ValidationError as exc:
            return invalid(exc.errors())
        return await answer(body)

    @app.get("/health")
    async def health() -> Response:
        if backend.loaded:
            return JSONResponse({"status": "ok", "model": settings.model_name})
        if backend.load_error is not None:
            message = f"reward model failed to load: {backend.load_error}"
        else:
            message = f"reward model {settings.model_name} is loading"
        return _error(503, message, "service_unavailable")

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/v1/rewards",
        response_model=RewardResponse,
        responses={400: {"model": ErrorResponse}, 500: {"model": ErrorResponse}},
    )
    async def rewards(body: RewardRequest) -> Response:
        return _response(await answer(body))

    def route_is_plain() -> bool:
        # A route dependency (an auth check, say) must run: FastAPI serves such a route itself.
        return not any(
            route.dependant.dependencies
            for route in app.routes
            if isinstance(route, APIRoute) and route.path == FAST_PATH
        )

    # Outermost, in front of FastAPI's own middleware (see reward.fast_path).
    build_stack = app.build_middleware_stack
    app.build_middleware_stack = lambda: RewardsFastPath(  # type: ignore[method-assign]
        build_stack(), handle=answer_raw, enabled=route_is_plain
    )
    return app
