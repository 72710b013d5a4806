"""Relay one request to a pool's vLLM replicas and turn the engine's answer into HTTP.

`LLMServer.chat/completions` stream back either a complete response object (non-streaming), lists
of SSE strings (streaming), or an `ErrorResponse` as the first item when vLLM rejects the request
(for instance a prompt longer than the context): peeking at that first item is what lets an engine
rejection become a proper 4xx instead of a broken stream.

The router needs every request's real completion length (to score the prediction), so streams
are always asked for usage; the final usage chunk is dropped again when the client did not ask
for it. `done(completion_tokens or None)` tells the caller when the pool is finished with the
request: at once for a JSON answer, at the end of the stream for SSE.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable

from fastapi.responses import JSONResponse, StreamingResponse
from ray.exceptions import TaskCancelledError
from ray.serve.handle import DeploymentHandle
# vLLM's class, not ray.serve.llm's public subclass: Ray's engine returns its internal subclass,
# which is no instance of the public one.
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from router.errors import APIError

log = logging.getLogger("ray.serve")
Done = Callable[[int | None], None]
Progress = Callable[[], None]


class ReplicaFailed(APIError):
    """The replica failed before any output: nothing was sent, so another replica may take it."""

    def __init__(self, cause: Exception):
        super().__init__(503, f"The model replica failed to answer: {type(cause).__name__}.",
                         headers={"Retry-After": "5"})


async def _first(stream) -> object:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        raise APIError(500, "The engine returned no response.") from None
    except Exception as e:  # a dead replica or an engine crash before any output
        log.warning("pool call failed before the first response: %r", e)
        raise ReplicaFailed(e) from None


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


def _usage_event(event: str) -> int | None:
    """completion_tokens of vLLM's final usage chunk (no choices, a usage object), else None."""
    if '"choices":[]' not in event or '"usage"' not in event:
        return None
    usage = json.loads(event.removeprefix("data: ")).get("usage") or {}
    return usage.get("completion_tokens")


class _UsageTap:
    """Reads the usage chunk as it passes and, unless the client asked for it, removes it."""

    def __init__(self, keep: bool):
        self.keep = keep
        self.completion_tokens: int | None = None
        self.relayed = False  # the relay ran to its end (or its client left)

    def __call__(self, chunk: str) -> str:
        if '"usage"' not in chunk:
            return chunk
        events = []
        for event in chunk.split("\n\n"):
            tokens = _usage_event(event)
            if tokens is not None:
                self.completion_tokens = tokens
                if not self.keep:
                    continue
            events.append(event)
        return "\n\n".join(events)


async def _items(first, stream) -> AsyncIterator:
    yield first
    async for item in stream:
        yield item


async def _relay(first, stream, tap: _UsageTap, done: Done, progress: Progress) -> AsyncIterator[str]:
    ended = False
    try:
        async for item in _items(first, stream):
            chunk = tap(_sse(item))
            ended |= "data: [DONE]" in chunk
            progress()
            yield chunk
    except Exception as e:  # mid-stream failure: tell the client instead of cutting silently
        log.exception("pool stream failed mid-way")
        err = APIError(503, f"The model replica failed mid-stream: {type(e).__name__}.")
        yield f"data: {json.dumps(err.body())}\n\n"
    finally:  # also when the client goes away mid-stream
        if not ended:  # the client went away or the stream broke: vLLM aborts the request
            stream.cancel()
        tap.relayed = True
        done(tap.completion_tokens)
    if not ended:
        yield "data: [DONE]\n\n"


class _SSEResponse(StreamingResponse):
    """Ray Serve reports a client that hung up mid-stream by raising TaskCancelledError from
    `receive`, where Starlette waits for an `http.disconnect` message: take it as one."""

    async def listen_for_disconnect(self, receive) -> None:
        try:
            await super().listen_for_disconnect(receive)
        except TaskCancelledError:
            pass


async def forward(
    handle: DeploymentHandle, kind: str, body, headers: dict[str, str], extension: dict,
    client_wants_usage: bool, done: Done, progress: Progress,
):
    """The pool's answer as HTTP; `extension` fields are added to a JSON body, headers to both.

    `done(completion_tokens or None)` is called (it must be idempotent) when a JSON answer is in,
    when a stream ends or its client goes away, and when a stream response is dropped before its
    body ever started (a cancelled ASGI task never runs the generator's `finally`: a finalizer on
    the response covers it). Cancelled or timed out here, the pool call is cancelled too, so the
    engine stops decoding for nobody.
    """
    stream = getattr(handle, kind).remote(body, None)
    try:
        first = await _first(stream)
    except BaseException:
        stream.cancel()
        raise
    if (err := _engine_error(first)) is not None:
        stream.cancel()
        raise err
    if not getattr(body, "stream", False):
        payload = first.model_dump(mode="json")
        done((payload.get("usage") or {}).get("completion_tokens"))
        return JSONResponse({**payload, **extension}, headers=headers)
    tap = _UsageTap(keep=client_wants_usage)
    response = _SSEResponse(_relay(first, stream, tap, done, progress), media_type="text/event-stream",
                            headers=headers)
    weakref.finalize(response, _abandoned, stream, tap, done)
    return response


def _abandoned(stream, tap: _UsageTap, done: Done) -> None:
    """A stream response became garbage; if its relay never ran, nobody will read the engine."""
    if not tap.relayed:
        stream.cancel()
        done(None)
