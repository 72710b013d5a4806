"""One pool client: how every request reaches a pool's vLLM replicas and how its answer comes back.

The online pipeline (router.serving.pipeline) and rollouts (router.serving.rollout) call a pool only through
`PoolClient.open`, so both get the same behaviour:
- each call runs under Ray's internal request id of its own (the request's id): Ray gives every
  handle call made while serving one HTTP request that request's internal id, and keys its own
  routing and completion bookkeeping by it, so a rollout's samples would share one
  (`ray/serve/_private/default_impl.py`, `get_request_metadata`); the replica ledger then tells them apart too;
- a replica that fails before its first item is retried with exponential backoff (nothing has
  reached the client yet; Ray drops the dead replica meanwhile);
- the first item is checked: `LLMServer.chat/completions` answer an `ErrorResponse` first when
  vLLM rejects the request (a prompt longer than the context), which becomes a proper 4xx;
- the answer is a JSON body, an SSE relay, or (rollouts) the generated text and token ids, and
  whichever it is, the request's record learns its first token, its progress, its length and why
  it stopped. Streams are always asked for usage (router.serving.pipeline sets it); the final
  usage chunk is dropped again when the client did not ask for it;
- a stream its caller stops (a client that left, a rollout sample cut by first-k) is cancelled:
  Ray Serve cancels the replica's task, whose cancellation reaches vLLM's `AsyncLLM.generate`,
  which aborts the request in the engine (`vllm/v1/engine/async_llm.py`), freeing its slot and
  KV blocks at once. `engine_requests` asks each replica's engine what it really holds.

`done` (the caller's completion step) runs exactly once: when a JSON answer is in, when a stream
ends, breaks or loses its client, or when the answer is abandoned before its relay ever started.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

from ray.serve import context as serve_context
from ray.serve.handle import DeploymentHandle
# vLLM's class, not ray.serve.llm's public subclass: Ray's engine returns its internal subclass,
# which is no instance of the public one.
from vllm.entrypoints.serve.engine.protocol import ErrorResponse

from router.scheduling.request import CUT, Request
from router.serving.errors import APIError
from router.serving.replica_ledger import ReplicaLedger

log = logging.getLogger("ray.serve")
Done = Callable[[Request], None]


def once(step: Done) -> Done:
    """`step`, run at most once per request however many paths reach it (the contract of `done`)."""
    ran: set[str] = set()

    def run(request: Request) -> None:
        if request.id not in ran:
            ran.add(request.id)
            step(request)

    return run


class ReplicaFailed(APIError):
    """The replica failed before any output: nothing was sent, so another replica may take it."""

    def __init__(self, cause: Exception):
        super().__init__(503, f"The model replica failed to answer: {type(cause).__name__}.",
                         headers={"Retry-After": "5"})


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


def _usage_tokens(event: str) -> int | None:
    """completion_tokens of vLLM's final usage chunk (no choices, a usage object), else None."""
    if '"choices":[]' not in event or '"usage"' not in event:
        return None
    usage = json.loads(event.removeprefix("data: ")).get("usage") or {}
    return usage.get("completion_tokens")


def _finish_reason(chunk: str) -> str | None:
    for reason in ("length", "stop", "abort"):
        if f'"finish_reason":"{reason}"' in chunk:
            return reason
    return None


def _call(method, request_id: str, *args):
    """`method.remote(*args)` with Ray's internal request id set to ours for this call only (the
    context is copied, so the HTTP request's own context is untouched)."""
    def call():
        serve_context._set_request_context(_internal_request_id=request_id)
        return method.remote(*args)

    return contextvars.copy_context().run(call)


@dataclass
class Output:
    """What a rollout sample generated, filled as it streams, so a sample cut mid-way keeps what
    it had. Token ids come with `return_token_ids` (vLLM's): the output's, and the prompt's as
    the engine rendered it, which is what a continuation sends back to hit the prefix cache."""

    parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_ids: list[int] | None = None
    cached_tokens: int | None = None  # prompt tokens the engine's prefix cache served (enable_prompt_tokens_details)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, payload: dict) -> None:
        """One chat or completions stream event."""
        self.prompt_ids = self.prompt_ids or payload.get("prompt_token_ids")
        choices = payload.get("choices") or []
        for c in choices:
            self.parts.append((c.get("delta") or {}).get("content") or c.get("text") or "")
            self.token_ids += c.get("token_ids") or []
            self.prompt_ids = self.prompt_ids or c.get("prompt_token_ids")
        if not choices and payload.get("usage"):
            self.cached_tokens = (payload["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")


class Answer:
    """A replica's answer to one request, first item already in hand."""

    def __init__(self, request: Request, first, stream, done: Callable[[], None]):
        self.request, self._first, self._stream, self._done = request, first, stream, done
        self.relayed = False  # the relay ran (to its end, or until its client left)

    def json(self) -> dict:
        """A non-streaming answer's body; the request is complete."""
        payload = self._first.model_dump(mode="json")
        r = self.request
        r.completion_tokens = (payload.get("usage") or {}).get("completion_tokens")
        reasons = [c.get("finish_reason") for c in payload.get("choices") or []]
        r.finish_reason = reasons[0] if len(reasons) == 1 else None
        r.first_token_at = r.finished_at = time.time()
        self._done()
        return payload

    async def sse(self, keep_usage: bool) -> AsyncIterator[str]:
        """The stream as SSE text, usage chunk dropped unless `keep_usage`. A failure mid-way
        becomes an error event rather than a silent cut; a stream that did not end (its client
        left, it broke) is cancelled, so the engine stops decoding for nobody."""
        r = self.request
        ended = False
        try:
            async for item in self._items():
                chunk = self._tap(_sse(item), keep_usage)
                ended |= "data: [DONE]" in chunk
                yield chunk
        except Exception as e:
            log.exception("pool stream failed mid-way")
            r.error = f"{type(e).__name__}: {e}"
            yield f"data: {json.dumps(APIError(503, f'The model replica failed mid-stream: {type(e).__name__}.').body())}\n\n"
        finally:  # also when the client goes away mid-stream, or its caller cuts it
            self.relayed = True
            if not ended:
                self._stream.cancel()
                if r.finish_reason != CUT:
                    r.error = r.error or "stream ended early"
            r.finished_at = time.time()
            self._done()
        if not ended:
            yield "data: [DONE]\n\n"

    async def collect(self, output: Output) -> None:
        """A one-sequence stream (rollouts) into `output` as it comes; raises on an error event.
        With token ids, the record counts them as they come: a sample cut mid-way has its length."""
        r = self.request
        async for chunk in self.sse(keep_usage=True):
            for event in chunk.split("\n\n"):
                if not event.startswith("data: ") or event == "data: [DONE]":
                    continue
                payload = json.loads(event[6:])
                if "error" in payload:
                    raise RuntimeError(payload["error"].get("message"))
                output.add(payload)
            if output.token_ids:
                r.completion_tokens = len(output.token_ids)
        if r.error is not None:
            raise RuntimeError(r.error)

    def abandon(self) -> None:
        """Nobody will read this answer (its response was dropped before the relay started)."""
        if not self.relayed:
            self._stream.cancel()
            self.request.error = "abandoned"
            self._done()

    async def _items(self):
        yield self._first
        async for item in self._stream:
            yield item

    def _tap(self, chunk: str, keep_usage: bool) -> str:
        r = self.request
        if '"choices":[{' in chunk:
            if r.first_token_at is None:
                r.first_token_at = time.time()
            r.streamed += 1
            r.finish_reason = _finish_reason(chunk) or r.finish_reason
        if '"usage"' not in chunk:
            return chunk
        events = []
        for event in chunk.split("\n\n"):
            tokens = _usage_tokens(event)
            if tokens is not None:
                r.completion_tokens = tokens
                if not keep_usage:
                    continue
            events.append(event)
        return "\n\n".join(events)


class PoolClient:
    """A pool's replicas behind one Ray Serve deployment handle."""

    def __init__(self, name: str, handle: DeploymentHandle, ledger: ReplicaLedger, attempts: int = 3,
                 backoff_s: float = 1.0):
        self.name, self.ledger = name, ledger
        # Configured once: each .options() call creates a new handle with its own state.
        self._handle = handle.options(stream=True)
        self._unary = handle
        self._attempts, self._backoff_s = attempts, backoff_s

    async def open(self, request: Request, kind: str, body, done: Done) -> Answer:
        """Send the request (its id becomes the body's `request_id`) and wait for its first item.

        Raises ReplicaFailed when every attempt failed before answering, APIError when the engine
        rejected the request; `done(request)` then never runs, the caller cleans up."""
        body.request_id = request.id
        self.ledger.track(request)
        method = getattr(self._handle, kind)
        try:
            for attempt in range(self._attempts):
                stream = _call(method, request.id, body, None)
                try:
                    first = await stream.__anext__()
                except StopAsyncIteration:
                    raise APIError(500, "The engine returned no response.") from None
                except Exception as e:  # a dead replica or an engine crash before any output
                    stream.cancel()
                    log.warning("pool %s call failed before the first response: %r", self.name, e)
                    if attempt == self._attempts - 1:
                        raise ReplicaFailed(e) from None
                    await asyncio.sleep(self._backoff_s * 2 ** attempt)
                    continue
                except BaseException:
                    stream.cancel()
                    raise
                if (err := _engine_error(first)) is not None:
                    stream.cancel()
                    raise err
                return Answer(request, first, stream, lambda: self._finish(request, done))
        except BaseException:
            self.ledger.drop(request.id)
            raise

    def _finish(self, request: Request, done: Done) -> None:
        self.ledger.drop(request.id)
        done(request)

    async def engine_requests(self, timeout_s: float = 2.0) -> dict[str, int | None]:
        """Per live replica, the requests its vLLM engine holds now (accepted, neither finished nor
        aborted: deployments.pool_server), or None where it did not answer in time.

        The engine's own count, not the router's ledger: a request the router let go but the engine
        still decodes shows here. Each probe asks for its replica as a rollout plan pins one; a
        replica at its ongoing limit passes the probe on, and the answer names the replica that
        really answered."""
        async def ask(replica: str) -> dict | None:
            probe = Request(id=f"engine-probe-{uuid.uuid4().hex}", policy="probe", pool=self.name, pinned=replica)
            self.ledger.track(probe)
            response = _call(self._unary.engine_requests, probe.id, SimpleNamespace(request_id=probe.id))
            try:
                async with asyncio.timeout(timeout_s):
                    return await response
            except BaseException as e:  # a replica starting, dying or too busy to answer: unknown
                response.cancel()
                if not isinstance(e, Exception):
                    raise
                log.warning("pool %s: no engine count from %s: %r", self.name, replica, e)
                return None
            finally:
                self.ledger.drop(probe.id)

        replicas = self.ledger.live_replicas()
        counts: dict[str, int | None] = dict.fromkeys(replicas)
        for answer in await asyncio.gather(*(ask(r) for r in replicas)):
            if answer is not None:
                counts[answer["replica"]] = answer["requests"]
        return counts
