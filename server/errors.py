"""The gateway's exception tree and its one translation to OpenAI's error shape.

Code raises these typed exceptions; the app's exception handlers (and the streaming path) turn
them into ``{"error": {"message", "type", "param", "code"}}`` with the status each one carries.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "AuthenticationError",
    "GatewayError",
    "InvalidRequestError",
    "NoCandidateError",
    "PayloadTooLargeError",
    "RewardUnavailableError",
    "UpstreamClientError",
    "UpstreamTimeoutError",
    "error_body",
    "error_bytes",
]


class GatewayError(Exception):
    """Base of every error the gateway answers with; carries its HTTP status and OpenAI type."""

    status_code = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def to_dict(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, param=self.param, code=self.code)


class InvalidRequestError(GatewayError):
    """The client's request is malformed or asks for something the server does not allow."""

    status_code = 400
    error_type = "invalid_request_error"


class AuthenticationError(GatewayError):
    status_code = 401
    error_type = "authentication_error"


class PayloadTooLargeError(GatewayError):
    status_code = 413
    error_type = "invalid_request_error"


class UpstreamClientError(GatewayError):
    """The upstream rejected the request itself (a 4xx other than 429): passed through as-is."""

    error_type = "invalid_request_error"

    def __init__(self, message: str, *, status_code: int, param: str | None = None):
        super().__init__(message, param=param, code="upstream_rejected")
        self.status_code = status_code


class NoCandidateError(GatewayError):
    """Every candidate failed (after retries): 502 with the last upstream message."""

    status_code = 502
    error_type = "upstream_error"


class UpstreamTimeoutError(NoCandidateError):
    """No candidate finished in time."""

    status_code = 504
    error_type = "timeout_error"


class RewardUnavailableError(GatewayError):
    """The reward backend is down or answered nonsense; the gateway cannot choose."""

    status_code = 503
    error_type = "reward_unavailable"


def error_body(
    message: str, error_type: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_bytes(error: GatewayError) -> bytes:
    return json.dumps(error.to_dict()).encode()
