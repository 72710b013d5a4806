"""Turn raw HTTP bytes into a vLLM protocol request, or an APIError that says what is wrong.

The body is parsed by hand rather than by FastAPI so that every failure (size, encoding, JSON,
schema, values) gets an OpenAI-format error instead of FastAPI's own 422 shape. Checks that need
the tokenizer (prompt longer than the context) stay with the engine, which answers them as 400.
"""

from __future__ import annotations

import json
from typing import Literal

from fastapi import Request
from pydantic import ValidationError
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest
from vllm.exceptions import VLLMValidationError

from router.errors import APIError

Kind = Literal["chat", "completions"]
_MODELS = {"chat": ChatCompletionRequest, "completions": CompletionRequest}


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(413, f"Request body of {declared} bytes exceeds the limit of {max_bytes} bytes.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise APIError(413, f"Request body exceeds the limit of {max_bytes} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def request_kind(raw: bytes) -> Kind:
    """Chat or completions from the body's shape, for endpoints that take either (/v1/length).

    Unparseable bodies count as chat: parse_request then says what is wrong with them.
    """
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "chat"
    return "completions" if isinstance(payload, dict) and "prompt" in payload and "messages" not in payload else "chat"


def _first_error(err: ValidationError) -> APIError:
    first = err.errors()[0]
    param = ".".join(str(p) for p in first.get("loc", ())) or None
    return APIError(400, f"Invalid value for '{param}': {first.get('msg')}", param=param)


def parse_request(raw: bytes, kind: Kind, served_model: str, max_model_len: int):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"Request body is not valid UTF-8 (byte {e.start}).") from None
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(400, f"Request body is not valid JSON: {e.msg} at position {e.pos}.") from None
    if not isinstance(payload, dict):
        raise APIError(400, "Request body must be a JSON object.")
    for field in ("model", "messages" if kind == "chat" else "prompt"):
        if field not in payload:
            raise APIError(400, f"Missing required parameter: '{field}'.", param=field)
    if payload["model"] != served_model:
        raise APIError(
            404, f"The model '{payload['model']}' does not exist; this server serves '{served_model}'.",
            param="model", code="model_not_found",
        )
    try:
        body = _MODELS[kind].model_validate(payload)
    except ValidationError as e:
        raise _first_error(e) from None
    except VLLMValidationError as e:  # vLLM's own validators bypass pydantic's error type
        raise APIError(400, str(e), param=e.parameter) from None
    _check_values(body, kind, max_model_len)
    return body


def _check_values(body, kind: Kind, max_model_len: int) -> None:
    if kind == "chat" and not body.messages:
        raise APIError(400, "'messages' must contain at least one message.", param="messages")
    if kind == "completions" and body.prompt in ("", []):
        raise APIError(400, "'prompt' must not be empty.", param="prompt")
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(body, name, None)
        if value is None:
            continue
        if value < 1:
            raise APIError(400, f"'{name}' must be at least 1, got {value}.", param=name)
        if value > max_model_len:
            raise APIError(
                400, f"'{name}' = {value} exceeds the model's context of {max_model_len} tokens.",
                param=name,
            )
