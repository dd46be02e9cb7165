"""Routing for `POST /v1/chat/completions` (thin: the logic is in ``serving``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from server.auth import require_api_key
from server.chat.protocol import ChatCompletionRequest
from server.chat.serving import create_chat_completion
from server.state import GatewayState, get_state

__all__ = ["router"]

router = APIRouter()

# The body is read raw (so it is forwarded byte for byte in mode off and so malformed bodies
# get OpenAI-shaped 400s), but the OpenAPI schema still documents the request model.
_REQUEST_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ChatCompletionRequest.model_json_schema()}},
    }
}


@router.post(
    "/v1/chat/completions",
    openapi_extra=_REQUEST_SCHEMA,
    dependencies=[Depends(require_api_key)],
    summary="Chat completion: the best of adaptively many candidates",
)
async def chat_completions(
    request: Request, state: Annotated[GatewayState, Depends(get_state)]
) -> Response:
    return await create_chat_completion(request, state)
