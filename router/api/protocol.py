"""The bodies the API accepts: vLLM's own OpenAI protocol models, made to fail as 400s, plus OpenAI's
`metadata`, which carries a client's hint of its answer's length.

The hint is `"metadata": {"expected_output_tokens": "300"}`. OpenAI's Chat Completions API takes
`metadata` (at most 16 pairs of strings: keys up to 64 characters, values up to 512) and the
official clients type it (`client.chat.completions.create(..., metadata={...})`, no `extra_body`),
so a client needs no header a proxy may strip and no field vLLM would ignore with a warning. Its
values are strings in OpenAI's API, so the hint is a string of digits or, as vLLM's clients send
numbers, a JSON integer; either way a whole number of tokens, at most the model's context
(router.api.validation). Every other key passes as OpenAI's rules allow and is not read.

The rollout body is the rollout's own (router.serving.rollout.RolloutRequest): rollouts are also a
Python API on Ray, without HTTP.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

Kind = Literal["chat", "completions"]
HINT = "expected_output_tokens"
MAX_PAIRS, MAX_KEY, MAX_VALUE = 16, 64, 512  # OpenAI's bounds on `metadata`


def _whole_number(value):
    """A JSON integer, or the digits of one as OpenAI's string-valued metadata carries it; no
    booleans, fractions, signs or spaces."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        return int(value)
    raise ValueError("must be a whole number of tokens: a JSON integer or a string of digits")


class ClientMetadata(BaseModel):
    """OpenAI's `metadata`, and the one key the router reads: the client's expected output length."""

    model_config = ConfigDict(extra="allow")
    expected_output_tokens: Annotated[int, BeforeValidator(_whole_number), Field(ge=1)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _openai_bounds(cls, data):
        if not isinstance(data, dict):
            raise ValueError("must be an object of string keys and string values")
        if len(data) > MAX_PAIRS:
            raise ValueError(f"at most {MAX_PAIRS} key-value pairs, got {len(data)}")
        for key, value in data.items():
            if len(key) > MAX_KEY:
                raise ValueError(f"keys are at most {MAX_KEY} characters: {key[:MAX_KEY]!r}...")
            if key != HINT and not (isinstance(value, str) and len(value) <= MAX_VALUE):
                raise ValueError(f"the value of {key!r} must be a string of at most {MAX_VALUE} characters")
        return data


class _Guarded:
    """vLLM's own `before` validators index into fields they never type-check (`"messages": null`
    raises TypeError, which pydantic passes through as a 500): as a validation error it is a 400."""

    @model_validator(mode="wrap")
    @classmethod
    def _malformed_is_invalid(cls, data, handler):
        try:
            return handler(data)
        except (TypeError, AttributeError, KeyError) as e:
            raise ValueError(f"malformed request body ({type(e).__name__}: {e})") from None


class ChatBody(_Guarded, ChatCompletionRequest):
    metadata: ClientMetadata | None = None


class CompletionBody(_Guarded, CompletionRequest):
    metadata: ClientMetadata | None = None


BODIES = {"chat": ChatBody, "completions": CompletionBody}
