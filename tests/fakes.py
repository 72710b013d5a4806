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
from types import SimpleNamespace

from ray.serve import context as serve_context

from router.serving.predictor_client import PREFILL
from router.serving.replica_ledger import ReplicaLedger


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def chunks(tokens: int, finish: str = "stop", prompt_ids: list[int] | None = None) -> list[list[str]]:
    """vLLM's stream for `tokens` tokens: one delta per token, the finish, usage, [DONE]. With
    `prompt_ids` (a request with `return_token_ids`), each delta carries its token's id (7) and the
    first one the prompt's ids, as vLLM's chat stream does."""
    def delta(i: int, reason: str | None) -> list[str]:
        event = {"id": "x", "choices": [{"index": 0, "delta": {"content": "t"}, "finish_reason": reason}]}
        if prompt_ids is not None:
            event["choices"][0]["token_ids"] = [7]
            if i == 0:
                event["prompt_token_ids"] = prompt_ids
        return [sse(event)]

    items = [delta(i, None) for i in range(tokens - 1)]
    items.append(delta(tokens - 1, finish))
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
    per item, at most the body's `max_tokens` (then finish "length", as vLLM stops there). The
    replica is the ledger's least-loaded one (or the pinned one), as the replica router ranks them;
    completions are reported by the call's internal id, as Ray does. `active` is each replica's
    streams neither ended nor cancelled: what its engine holds (a cancelled stream is aborted
    there), as `engine_requests` (deployments.pool_server) answers it."""

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
        self.engine_requests = _EngineProbe(self)

    def options(self, **_):
        return self

    def route(self, request_id: str) -> str:
        request = self.ledger.get(request_id)
        loads = {load.replica: load.requests for load in self.ledger.loads()}
        replica = (request.pinned if request is not None and request.pinned else
                   min(self.replicas, key=lambda r: (loads.get(r, 0), random.random())))
        self.ledger.routed(request_id, replica)
        return replica

    def remote(self, body, _raw):
        internal = serve_context._get_serve_request_context()._internal_request_id or "no-context"
        replica = self.route(body.request_id)
        self.calls.append(Call(body.request_id, internal, replica, getattr(body, "priority", 0)))
        self.active[replica] = self.active.get(replica, 0) + 1
        self.peak[replica] = max(self.peak.get(replica, 0), self.active[replica])

        def end():
            self.active[replica] -= 1
            self.ledger.completed(internal)

        fail = self.failures > 0
        self.failures -= fail
        tokens = self.tokens(body) if callable(self.tokens) else self.tokens
        finish = self.finish
        if body.max_tokens is not None and tokens > body.max_tokens:
            tokens, finish = body.max_tokens, "length"
        prompt_ids = None
        if getattr(body, "return_token_ids", None):  # a token prompt comes back as it is; a chat's renders as [1, 2, 3]
            prompt = getattr(body, "prompt", None)
            prompt_ids = prompt if isinstance(prompt, list) else [1, 2, 3]
        items = chunks(tokens, finish, prompt_ids) if body.stream else [_Json(tokens, finish)]
        if self.rejection is not None:
            items = [self.rejection]
        stream = FakeStream(items, self.delay_s, end, fail_first=fail)
        self.streams.append(stream)
        return stream


class _EngineProbe:
    """A replica's `engine_requests` (deployments.pool_server): routed like any call (the probe's
    ledger entry pins its replica), answered with that replica's streams still held; `silent`: a
    replica that never answers (starting, or stuck)."""

    def __init__(self, pool: FakePool):
        self._pool = pool
        self.silent = False
        self.responses: list[_Probed] = []

    def remote(self, probe):
        replica = self._pool.route(probe.request_id)
        self.responses.append(_Probed(self, replica))
        return self.responses[-1]


class _Response:
    """A unary call's response: awaitable and cancellable, as Ray's DeploymentResponse."""

    cancelled = False

    def cancel(self):
        self.cancelled = True

    def __await__(self):
        return self._run().__await__()  # each kind's own answer


class _Probed(_Response):
    def __init__(self, probe: _EngineProbe, replica: str):
        self._probe, self._replica = probe, replica

    async def _run(self):
        while self._probe.silent:
            await asyncio.sleep(1)
        return {"replica": self._replica, "requests": self._probe._pool.active.get(self._replica, 0)}


@dataclass
class FakePredictor:
    """The predictor handle: every head's answer for a prompt, `expected(ids)` tokens expected,
    after `delay_s`; `fail` makes every call raise. With `prefill_s_per_token`, each answer says
    what its prefill took and `measured_prefill` answers the prefill timed at start (256 tokens);
    without, it answers as a predictor that is not up yet."""

    heads: dict
    expected: Callable = lambda ids: 100.0
    delay_s: float = 0.0
    fail: bool = False
    hold: asyncio.Event | None = None  # answers wait for it: a test decides when predictions land
    prefill_s_per_token: float | None = None
    calls: int = 0
    request_ids: list = field(default_factory=list)

    def remote(self, ids, request_id=None):
        self.calls += 1
        self.request_ids.append(request_id)
        return _Answer(self, ids)

    @property
    def measured_prefill(self):
        async def answer():
            if self.prefill_s_per_token is None:
                raise RuntimeError("the predictor is still starting")
            return {"seconds": 256 * self.prefill_s_per_token, "tokens": 256}

        return SimpleNamespace(remote=answer)


class _Answer(_Response):
    def __init__(self, predictor: FakePredictor, ids):
        self._predictor, self._ids = predictor, ids

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
        if p.prefill_s_per_token is not None:
            out[PREFILL] = {"seconds": len(self._ids) * p.prefill_s_per_token, "tokens": len(self._ids)}
        return out
