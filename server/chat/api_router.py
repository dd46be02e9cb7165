"""Routing for `POST /v1/chat/completions` (thin: the logic is in ``serving``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.chat.protocol import ChatCompletionRequest
from server.chat.serving import create_chat_completion

__all__ = ["router"]

router = APIRouter()


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Pydantic puts nested models under a local ``$defs`` referenced as ``#/$defs/X``; inside
    the OpenAPI document such refs resolve against the document root, where there is no
    ``$defs``, so clients and fuzzers could not read the body schema. Inline them (the request
    models are not recursive)."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(value) for value in node]
        return node

    return resolve(schema)


# The body is read raw (so it is forwarded byte for byte in mode off and so malformed bodies
# get OpenAI-shaped 400s), but the OpenAPI schema still documents the request model.
_REQUEST_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _inline_refs(ChatCompletionRequest.model_json_schema())}
        },
    }
}


@router.post(
    "/v1/chat/completions",
    openapi_extra=_REQUEST_SCHEMA,
    summary="Chat completion: the best of adaptively many candidates",
)
async def chat_completions(request: Request) -> Response:
    # No FastAPI dependencies on the hot path: resolving them costs more than the checks.
    return await create_chat_completion(request, request.app.state.gateway)
