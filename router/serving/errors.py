"""Errors in OpenAI's format, so any OpenAI client raises the right exception class with our message.

Raised anywhere on the serving path (a full queue, a replica that failed, a bad body); the API
layer turns them into responses (router.api.app). Kept free of HTTP framework code so the pipeline can
be tested without one.
"""

from __future__ import annotations

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "api_error"),
                "param": self.param,
                "code": self.code or self.status,
            }
        }
