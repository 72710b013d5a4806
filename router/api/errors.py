"""Errors as HTTP responses: every failure a client sees is an OpenAI-format JSON error."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from router.serving.errors import APIError


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)
