"""API keys for the reward worker: ``Authorization: Bearer <key>``, compared in constant time.

Why: the worker scores whatever it is sent; on a shared network its GPU is an open service
unless it checks a key. ``/health`` and ``/metrics`` stay open (orchestrator probes and
Prometheus scrapes carry no key), every other route needs one of the configured keys. With no
key configured nothing is checked (and no route gets a dependency, so the ``/v1/rewards`` fast
path stays on).

Usage: ``FastAPI(..., **worker_auth(keys))`` - the dependency and the handler that answers 401
in OpenAI's error shape. ``reward`` stays independent of ``server``: this mirrors the gateway's
check without importing it.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from pydantic import SecretStr

__all__ = ["OPEN_PATHS", "WorkerAuthError", "key_matches", "worker_auth"]

OPEN_PATHS = frozenset({"/health", "/metrics"})


class WorkerAuthError(Exception):
    """A request without a valid key (answered 401, OpenAI's ``invalid_api_key``)."""


def key_matches(given: str, keys: Sequence[bytes]) -> bool:
    """``hmac.compare_digest`` against every key, with no early exit on a match."""
    given_bytes = given.encode()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given_bytes, key)
    return matched


def worker_auth(keys: Sequence[SecretStr]) -> dict[str, Any]:
    """Keyword arguments for ``FastAPI(...)``: empty without keys, else the check and its 401."""
    secrets = [key.get_secret_value().encode() for key in keys]
    if not secrets:
        return {}

    async def require_key(request: Request) -> None:
        if request.url.path in OPEN_PATHS:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise WorkerAuthError("missing API key: send 'Authorization: Bearer <key>'")
        if not key_matches(token.strip(), secrets):
            raise WorkerAuthError("invalid API key")

    async def unauthorized(request: Request, exc: Exception) -> JSONResponse:
        error = {
            "message": str(exc),
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
        return JSONResponse(
            {"error": error}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )

    return {
        "dependencies": [Depends(require_key)],
        "exception_handlers": {WorkerAuthError: unauthorized},
    }
