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
  use offset") and the engine dies with every request it holds;
- a length hint (`metadata.expected_output_tokens`, router.api.protocol) within the context.
Checks that need the rendered prompt (longer than the context) stay with the engine, which
answers them as 400.

An error names the field as the client sent it (`messages.0.content`), never the validator's
inner names: pydantic's locations also hold the union member it tried
(`ChatCompletionDeveloperMessageParam`), wrappers (`function-after[...]`), the type of a branch
(`str`, `list[...]`): whatever is not a key or an index of the client's own body is left out.
"""

from __future__ import annotations

import json

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from vllm.exceptions import VLLMValidationError

from router.api.errors import error_response
from router.api.protocol import BODIES, HINT, Kind
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


def validation_error(err: RequestValidationError | ValidationError | VLLMValidationError, body=None) -> APIError:
    """The problem of a body, in OpenAI's format (400), whatever layer found it; `body`: the
    parsed JSON the client sent (None when it was no JSON), which the path is told in."""
    if isinstance(err, VLLMValidationError):  # vLLM's own validators bypass pydantic's error type
        return APIError(400, str(err), param=err.parameter)
    skip = 1 if isinstance(err, RequestValidationError) else 0  # FastAPI's locations start with "body"
    errors = [{**e, "loc": tuple(e.get("loc", ()))[skip:]} for e in err.errors()]
    first = errors[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"Request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}.")
    if not first["loc"] and kind in ("model_attributes_type", "dict_type", "model_type"):
        return APIError(400, "Request body must be a JSON object.")
    meant = _meant(errors, body)
    paths = [_sent_path(e, body) for e in meant]
    where = max(paths, key=len)  # the furthest into the client's body: the most specific
    if not where:
        return APIError(400, f"Invalid request body: {first.get('msg')}")
    same = [e for e, path in zip(meant, paths) if path == where]
    param = ".".join(where)
    if same[0]["type"] == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param=param)
    reasons = list(dict.fromkeys(e["msg"] for e in same))  # one per union member that could have fitted
    return APIError(400, f"Invalid value for '{param}': {'; or '.join(reasons[:3])}", param=param)


def _walk(loc: tuple, body) -> list[tuple[str, bool]]:
    """Each element of a location, and whether it is a key or an index of the client's body (the
    others are the validator's: union members, wrappers, a branch's type)."""
    out, node = [], body
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            out.append((part, True))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append((str(part), True))
            node = node[part]
        else:
            out.append((str(part), False))
    return out


def _sent_path(error: dict, body) -> list[str]:
    """The keys and indices of the client's body an error is at; a missing field's name too. None
    of them for an error that does not start at a key of the body (a validator that checked a part
    of it on its own loses where the part was)."""
    walked = _walk(error["loc"], body)
    missing = error["type"] == "missing"
    if not walked or not walked[0][1]:
        return [walked[0][0]] if missing and len(walked) == 1 else []
    path = [part for part, sent in walked if sent]
    if missing and not walked[-1][1]:
        path.append(walked[-1][0])  # the key the client left out
    return path


def _meant(errors: list[dict], body) -> list[dict]:
    """The errors of the union members the client meant: a member whose literal tag (a message's
    `role`, a part's `type`) refused the client's value is not one (all of them, if every member
    refused it)."""
    def members(e: dict) -> list[tuple]:
        walked = _walk(e["loc"], body)
        return [e["loc"][:i + 1] for i, (_, sent) in enumerate(walked) if not sent]

    refused = {m[-1] for e in errors if e["type"] == "literal_error" and (m := members(e))}
    meant = [e for e in errors if not refused.intersection(members(e))]
    return meant or errors


def request_kind(raw: bytes) -> Kind:
    """Chat or completions from the body's shape, for endpoints that take either (/v1/length).

    Unparseable bodies count as chat: parse_request then says what is wrong with them.
    """
    payload = _parsed(raw)
    return "completions" if isinstance(payload, dict) and "prompt" in payload and "messages" not in payload else "chat"


def _parsed(raw: bytes):
    """The JSON a body holds, or None when it holds none."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None


def parse_request(raw: bytes, kind: Kind):
    """The body of an endpoint that takes either kind (/v1/length): the same errors as FastAPI's."""
    try:
        return BODIES[kind].model_validate_json(raw)
    except ValidationError as e:
        raise validation_error(e, _parsed(raw)) from None
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
    _check_hint(body, max_model_len)
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


def _check_hint(body, max_model_len: int) -> None:
    """A length hint no answer can have is the client's mistake, said as one (the schema already
    refused one that is no whole number, or below 1)."""
    hint = body.metadata.expected_output_tokens if body.metadata is not None else None
    if hint is not None and hint > max_model_len:
        raise APIError(400, f"'metadata.{HINT}' = {hint} exceeds the model's context of {max_model_len} tokens.",
                       param=f"metadata.{HINT}")
