"""Stand-ins for the pool and predictor handles, for unit tests of the serving path's logic.

They behave as Ray Serve's handles do where the router depends on it: a call's internal request
id is whatever Ray's request context holds when `.remote()` is called (the parent HTTP request's,
shared by every call made while serving it, unless the caller sets its own), the replica router's
hooks are called with it, and a stream is an async iterator with `cancel()`. A fake that handed
each call a unique id would hide the bug a shared one causes.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from ray.serve import context as serve_context

from router.serving.replica_ledger import ReplicaLedger


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def chunks(tokens: int, finish: str = "stop") -> list[list[str]]:
    """vLLM's stream for `tokens` tokens: one delta per token, the finish, usage, [DONE]."""
    items = [[sse({"id": "x", "choices": [{"index": 0, "delta": {"content": "t"}, "finish_reason": None}]})]
             for _ in range(tokens - 1)]
    items.append([sse({"id": "x", "choices": [{"index": 0, "delta": {"content": "t"}, "finish_reason": finish}]})])
    items.append([sse({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens,
                                                            "total_tokens": 5 + tokens}}) + "data: [DONE]\n\n"])
    return items


class _Json:
    def __init__(self, tokens: int, finish: str):
        self._payload = {"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "t" * tokens}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}}

    def model_dump(self, mode="json"):
        return self._payload


class FakeStream:
    def __init__(self, items: list, delay_s: float, on_end, fail_first: bool = False):
        self.items, self.delay_s, self.on_end, self.fail_first = list(items), delay_s, on_end, fail_first
        self.cancelled = False
        self._ended = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.fail_first:
            raise RuntimeError("replica died")
        if self.cancelled or not self.items:
            self._end()
            raise StopAsyncIteration
        await asyncio.sleep(self.delay_s)
        item = self.items.pop(0)
        if not self.items:
            self._end()
        return item

    def _end(self):
        if not self._ended:
            self._ended = True
            self.on_end()

    def cancel(self):
        self.cancelled = True
        self._end()


@dataclass
class Call:
    request_id: str  # the body's (the router's own id)
    internal_id: str  # Ray's internal request id of the call
    replica: str
    priority: int


@dataclass
class FakePool:
    """A pool handle over `replicas`; each call's answer has `lengths(body)` tokens after `delay_s`
    per item. The replica is the ledger's least-loaded one (or the pinned one), as the replica
    router ranks them; completions are reported by the call's internal id, as Ray does."""

    ledger: ReplicaLedger
    replicas: list[str] = field(default_factory=lambda: ["r1", "r2"])
    tokens: int | Callable = 5  # or a function of the request's body
    delay_s: float = 0.0
    failures: int = 0  # calls that fail before their first item
    finish: str = "stop"
    rejection: object = None  # vLLM's ErrorResponse, answered first instead of any output
    calls: list[Call] = field(default_factory=list)
    active: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    streams: list[FakeStream] = field(default_factory=list)

    def __post_init__(self):
        self.ledger.set_replicas(self.replicas)
        self.chat = self.completions = self

    def options(self, **_):
        return self

    def remote(self, body, _raw):
        internal = serve_context._get_serve_request_context()._internal_request_id or "no-context"
        request = self.ledger.get(body.request_id)
        loads = {load.replica: load.requests for load in self.ledger.loads()}
        replica = (request.pinned if request is not None and request.pinned else
                   min(self.replicas, key=lambda r: (loads.get(r, 0), random.random())))
        self.ledger.routed(body.request_id, replica)
        self.calls.append(Call(body.request_id, internal, replica, getattr(body, "priority", 0)))
        self.active[replica] = self.active.get(replica, 0) + 1
        self.peak[replica] = max(self.peak.get(replica, 0), self.active[replica])

        def end():
            self.active[replica] -= 1
            self.ledger.completed(internal)

        fail = self.failures > 0
        self.failures -= fail
        tokens = self.tokens(body) if callable(self.tokens) else self.tokens
        items = chunks(tokens, self.finish) if body.stream else [_Json(tokens, self.finish)]
        if self.rejection is not None:
            items = [self.rejection]
        stream = FakeStream(items, self.delay_s, end, fail_first=fail)
        self.streams.append(stream)
        return stream


@dataclass
class FakePredictor:
    """The predictor handle: every head's answer for a prompt, `expected(ids)` tokens expected,
    after `delay_s`; `fail` makes every call raise."""

    heads: dict
    expected: Callable = lambda ids: 100.0
    delay_s: float = 0.0
    fail: bool = False
    hold: asyncio.Event | None = None  # answers wait for it: a test decides when predictions land
    calls: int = 0
    request_ids: list = field(default_factory=list)

    def remote(self, ids, request_id=None):
        self.calls += 1
        self.request_ids.append(request_id)
        return _Answer(self, ids)


class _Answer:
    def __init__(self, predictor: FakePredictor, ids):
        self._predictor, self._ids, self.cancelled = predictor, ids, False

    def cancel(self):
        self.cancelled = True

    def __await__(self):
        return self._run().__await__()

    async def _run(self):
        p = self._predictor
        await asyncio.sleep(p.delay_s)
        if p.hold is not None:
            await p.hold.wait()
        if p.fail:
            raise RuntimeError("predictor replica died")
        out = {}
        for name, bins in p.heads.items():
            e = float(p.expected(self._ids))
            k = min(range(bins.k), key=lambda i: abs(bins.centres[i] - e))
            probs = [1.0 if i == k else 0.0 for i in range(bins.k)]
            out[name] = {"expected_tokens": bins.centres[k], "quantiles": {q: bins.centres[k] for q in ("p10", "p50", "p90")},
                         "bin": k, "probabilities": probs}
        return out
