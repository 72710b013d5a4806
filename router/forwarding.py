"""Relay one request to a pool's vLLM replicas and turn the engine's answer into HTTP.

`LLMServer.chat/completions` stream back either a complete response object (non-streaming), lists
of SSE strings (streaming), or an `ErrorResponse` as the first item when vLLM rejects the request
(for instance a prompt longer than the context): peeking at that first item is what lets an engine
rejection become a proper 4xx instead of a broken stream.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse, StreamingResponse
from ray.serve.handle import DeploymentHandle
# vLLM's class, not ray.serve.llm's public subclass: Ray's engine returns its internal subclass,
# which is no instance of the public one.
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from router.errors import APIError

log = logging.getLogger("ray.serve")


async def _first(stream) -> object:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        raise APIError(500, "The engine returned no response.") from None
    except Exception as e:  # a dead replica or an engine crash before any output
        log.exception("pool call failed before the first response")
        raise APIError(503, f"The model replica failed to answer: {type(e).__name__}.") from None


def _engine_error(item) -> APIError | None:
    first = item[0] if isinstance(item, list) and item else item
    if isinstance(first, ErrorResponse):
        return APIError(first.error.code, first.error.message, param=first.error.param)
    return None


def _sse(item) -> str:
    if isinstance(item, list):
        return "".join(_sse(x) for x in item)
    if isinstance(item, str):
        return item
    return f"data: {item.model_dump_json()}\n\n"


async def _relay(first, stream) -> AsyncIterator[str]:
    done = False
    try:
        for item in (first,):
            chunk = _sse(item)
            done |= "data: [DONE]" in chunk
            yield chunk
        async for item in stream:
            chunk = _sse(item)
            done |= "data: [DONE]" in chunk
            yield chunk
    except Exception as e:  # mid-stream failure: tell the client instead of cutting silently
        log.exception("pool stream failed mid-way")
        err = APIError(503, f"The model replica failed mid-stream: {type(e).__name__}.")
        yield f"data: {json.dumps(err.body())}\n\n"
    if not done:
        yield "data: [DONE]\n\n"


async def forward(handle: DeploymentHandle, kind: str, body, extra_headers: dict[str, str]):
    stream = getattr(handle, kind).remote(body, None)
    first = await _first(stream)
    if (err := _engine_error(first)) is not None:
        raise err
    if not getattr(body, "stream", False):
        return JSONResponse(first.model_dump(mode="json"), headers=extra_headers)
    return StreamingResponse(_relay(first, stream), media_type="text/event-stream", headers=extra_headers)
