"""Client API keys: ``Authorization: Bearer <key>``, compared in constant time."""

from __future__ import annotations

import hmac

from fastapi import Request

from server.errors import AuthenticationError

__all__ = ["check_api_key", "key_matches", "require_api_key", "require_api_key_for_ops"]


def key_matches(given: str, keys: list[bytes]) -> bool:
    """Compare against every key with ``hmac.compare_digest`` (no early exit on a match)."""
    given_bytes = given.encode()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given_bytes, key)
    return matched


def check_api_key(request: Request) -> None:
    """Raise AuthenticationError unless the request carries a configured key (if any)."""
    keys: list[bytes] = request.app.state.api_keys
    if not keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError(
            "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
        )
    if not key_matches(token.strip(), keys):
        raise AuthenticationError("invalid API key", code="invalid_api_key")


async def require_api_key(request: Request) -> None:
    check_api_key(request)


async def require_api_key_for_ops(request: Request) -> None:
    """``/metrics`` and ``/ready`` are open unless ``--protect-metrics``."""
    if request.app.state.protect_ops:
        check_api_key(request)
