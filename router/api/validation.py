"""Request bodies: FastAPI parses them into vLLM's protocol models (router.api.protocol); this adds the
limits a shared server needs and turns every failure into an OpenAI-format error.

Parsing is FastAPI's typed body (as vLLM's own api_router does), so malformed JSON, a body that is
no object, deep nesting that would exhaust the parser's recursion, and schema errors all end in
one handler (`validation_error`). On top of the schema:
- the body size limit (`BodyLimit`, before anything is parsed: 413);
- the served model (404), roles OpenAI defines, non-empty messages and prompts, token ids inside
  the vocabulary, max_tokens within the context;
- bounds that stop one client from holding an engine: `n`, prompts per completions call, `stop`
  entries;
- no client-supplied chat template unless the deployment trusts them: a template is code the
  router runs (vLLM refuses them the same way unless trusted);
- no `seed` on CPU engines: vLLM's CPU sampler fails on a seeded request ("CPU Generator does not
  use offset") and the engine dies with every request it holds.
Checks that need the rendered prompt (longer than the context) stay with the engine, which
answers them as 400.
"""

from __future__ import annotations

import json

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from vllm.exceptions import VLLMValidationError

from router.api.errors import error_response
from router.api.protocol import BODIES, Kind
from router.serving.config import RequestLimits
from router.serving.errors import APIError

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class BodyLimit:
    """ASGI middleware: bodies over `max_bytes` get 413 before any parsing (declared or streamed)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(scope, receive, send, f"{int(declared)} bytes exceeds")
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._too_large(scope, receive, send, "exceeds")

    async def _too_large(self, scope, receive, send, what: str) -> None:
        response = error_response(APIError(413, f"Request body of {what} the limit of {self.max_bytes} bytes."))
        await response(scope, receive, send)


class _TooLarge(Exception):
    pass


def validation_error(err: RequestValidationError | ValidationError | VLLMValidationError) -> APIError:
    """The first problem of a body, in OpenAI's format (400), whatever layer found it."""
    if isinstance(err, VLLMValidationError):  # vLLM's own validators bypass pydantic's error type
        return APIError(400, str(err), param=err.parameter)
    first = err.errors()[0]
    kind, loc = first.get("type", ""), [str(p) for p in first.get("loc", ()) if p != "body"]
    if kind == "json_invalid":
        return APIError(400, f"Request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}.")
    if not loc and kind in ("model_attributes_type", "dict_type", "model_type"):
        return APIError(400, "Request body must be a JSON object.")
    where = ".".join(loc)
    param = loc[0] if loc else None  # OpenAI names the top-level parameter; the message has the path
    if not loc:
        return APIError(400, f"Invalid request body: {first.get('msg')}")
    if kind == "missing":
        return APIError(400, f"Missing required parameter: '{where}'.", param=param)
    return APIError(400, f"Invalid value for '{where}': {first.get('msg')}", param=param)


def request_kind(raw: bytes) -> Kind:
    """Chat or completions from the body's shape, for endpoints that take either (/v1/length).

    Unparseable bodies count as chat: parse_request then says what is wrong with them.
    """
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return "chat"
    return "completions" if isinstance(payload, dict) and "prompt" in payload and "messages" not in payload else "chat"


def parse_request(raw: bytes, kind: Kind):
    """The body of an endpoint that takes either kind (/v1/length): the same errors as FastAPI's."""
    try:
        return BODIES[kind].model_validate_json(raw)
    except ValidationError as e:
        raise validation_error(e) from None
    except VLLMValidationError as e:
        raise validation_error(e) from None
    except RecursionError:
        raise APIError(400, "Request body is nested too deeply.") from None


def check_request(body, kind: Kind, served_model: str, max_model_len: int, limits: RequestLimits,
                  vocab_size: int, seeded_sampling: bool) -> None:
    """What the schema cannot say; raises APIError. `seeded_sampling`: whether the engines honour
    `seed` (vLLM's CPU sampler does not: a seeded request kills the engine and every request on it)."""
    if not body.model:
        raise APIError(400, "Missing required parameter: 'model'.", param="model")
    if body.model != served_model:
        raise APIError(404, f"The model '{body.model}' does not exist; this server serves '{served_model}'.",
                       param="model", code="model_not_found")
    if kind == "chat":
        _check_messages(body, limits)
    else:
        _check_prompt(body.prompt, limits, vocab_size)
    _check_bounds(body, limits, max_model_len)
    if body.seed is not None and not seeded_sampling:
        raise APIError(400, "'seed' is not supported by this server's CPU engines (vLLM's CPU sampler "
                       "cannot seed a request); send the request without it.", param="seed")


def _check_messages(body, limits: RequestLimits) -> None:
    if not body.messages:
        raise APIError(400, "'messages' must contain at least one message.", param="messages")
    for i, message in enumerate(body.messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise APIError(400, f"Invalid role {role!r} in messages[{i}]; one of {sorted(ROLES)}.",
                           param=f"messages.{i}.role")
    template = body.chat_template or (body.chat_template_kwargs or {}).get("chat_template")
    if template and not limits.trust_request_chat_template:
        raise APIError(400, "Client-supplied chat templates are not accepted by this server "
                       "(router.trust_request_chat_template: false).", param="chat_template")


def _check_prompt(prompt, limits: RequestLimits, vocab_size: int) -> None:
    if prompt in ("", []) or prompt is None:
        raise APIError(400, "'prompt' must not be empty.", param="prompt")
    prompts = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else list(prompt)
    if len(prompts) > limits.max_prompts:
        raise APIError(400, f"{len(prompts)} prompts in one request; at most {limits.max_prompts}.",
                       param="prompt")
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            continue
        if not p:
            raise APIError(400, f"prompt[{i}] is an empty list of token ids.", param="prompt")
        bad = next((t for t in p if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(400, f"Token id {bad} in prompt[{i}] is outside the vocabulary (0..{vocab_size - 1}).",
                           param="prompt")


def _check_bounds(body, limits: RequestLimits, max_model_len: int) -> None:
    n = body.n or 1
    if n > limits.max_n:
        raise APIError(400, f"'n' = {n} exceeds this server's limit of {limits.max_n}.", param="n")
    best_of = (body.model_extra or {}).get("best_of")
    if best_of not in (None, 1):  # this vLLM dropped best_of: accepting it would silently ignore it
        raise APIError(400, "'best_of' is not supported by this server; ask for 'n' samples instead.",
                       param="best_of")
    stop = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
    if len(stop) > limits.max_stop:
        raise APIError(400, f"{len(stop)} stop sequences; at most {limits.max_stop}.", param="stop")
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(body, name, None)
        if value is None:
            continue
        if value < 1:
            raise APIError(400, f"'{name}' must be at least 1, got {value}.", param=name)
        if value > max_model_len:
            raise APIError(400, f"'{name}' = {value} exceeds the model's context of {max_model_len} tokens.",
                           param=name)
