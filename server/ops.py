"""The small endpoints: `/v1/models`, `/health`, `/ready`, `/metrics`."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.auth import require_api_key, require_api_key_for_ops
from server.errors import NoCandidateError, UpstreamTimeoutError
from server.state import GatewayState, get_state
from server.upstream import UpstreamFailure

__all__ = ["router"]

router = APIRouter()
State = Annotated[GatewayState, Depends(get_state)]


@router.get("/v1/models", dependencies=[Depends(require_api_key)], summary="The upstream's models")
async def list_models(state: State) -> Response:
    try:
        status, content, media_type = await state.upstream.models()
    except UpstreamFailure as failure:
        error_cls = UpstreamTimeoutError if failure.kind == "timeout" else NoCandidateError
        raise error_cls(f"upstream /models failed: {failure.message}") from None
    return Response(content, status_code=status, media_type=media_type)


@router.get("/health", summary="The process is up")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", dependencies=[Depends(require_api_key_for_ops)], summary="Deps answer")
async def ready(state: State) -> JSONResponse:
    upstream_ok, reward_ok = await asyncio.gather(state.upstream.ready(), _reward_ready(state))
    ok = upstream_ok and reward_ok
    return JSONResponse(
        {"status": "ready" if ok else "not ready", "upstream": upstream_ok, "reward": reward_ok},
        status_code=200 if ok else 503,
    )


async def _reward_ready(state: GatewayState) -> bool:
    try:
        async with asyncio.timeout(5.0):
            return bool(await state.reward.ready())
    except Exception:
        return False


@router.get("/metrics", dependencies=[Depends(require_api_key_for_ops)], summary="Prometheus")
async def metrics(state: State) -> Response:
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)
