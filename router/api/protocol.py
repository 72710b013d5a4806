"""The bodies the API accepts: vLLM's own OpenAI protocol models, made to fail as 400s.

The rollout body is the rollout's own (router.serving.rollout.RolloutRequest): rollouts are also a
Python API on Ray, without HTTP.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

Kind = Literal["chat", "completions"]


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
    pass


class CompletionBody(_Guarded, CompletionRequest):
    pass


BODIES = {"chat": ChatBody, "completions": CompletionBody}
