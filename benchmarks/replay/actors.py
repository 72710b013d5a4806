"""Replay a trace against the HTTP endpoint from Ray actors spread over the cluster.

Load comes from several client processes on several nodes, as real traffic does, so one client's
event loop or one node's network never becomes the bottleneck being measured. Each actor talks to
the router with the official `openai` client (async, streaming), exactly as users do, and turns
every request into one `RequestRecord`, failed or not. Open loop: each request is sent at its trace
arrival time, whether or not earlier ones finished (requests are sharded over the actors
round-robin; every actor waits for the same start time).

A policy named per request, a fixed answer length or a told length need the router's benchmark
headers (`router.benchmark_headers: true`); a request without them is served as any client's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass

import httpx
import ray
from tqdm import tqdm

from benchmarks.replay.records import RequestRecord
from benchmarks.replay.stack import BENCHMARK_KEY_ENV
from benchmarks.replay.trace import TraceRequest

log = logging.getLogger(__name__)
START_LEAD_S = 2.0  # actors on other nodes get the trace before its first arrival


class LostRequests(RuntimeError):
    """Some requests of the trace have no record: a crashed actor, never a slow request."""


@dataclass(frozen=True)
class Accounting:
    sent: int
    completed: int
    failed: int
    lost: int

    def __str__(self) -> str:
        return f"sent {self.sent} = completed {self.completed} + failed {self.failed}; lost {self.lost}"


def account(trace: list[TraceRequest], records: list[RequestRecord]) -> Accounting:
    """Every request of the trace has exactly one record; a missing one counts as lost."""
    recorded = {r.request_id for r in records}
    if len(recorded) != len(records):
        raise ValueError("a request was recorded twice")
    completed = sum(r.status == "ok" for r in records)
    return Accounting(
        sent=len(trace), completed=completed, failed=len(records) - completed,
        lost=len({t.request_id for t in trace} - recorded),
    )


def benchmark_headers(request: TraceRequest, policy: str | None) -> dict[str, str]:
    """What the router's benchmark option reads: the policy to decide by (known-length policies
    are told the true length, or the prompt's median for the ceiling), and a fixed-length
    request's length, said to the engines alone (X-Fixed-Output-Tokens), and the predictor budget
    it asks for (X-Predictor-Budget). The benchmark key
    (router.api.auth) comes from LENGTHSERVE_BENCHMARK_KEY in this process's environment: the
    replay actors inherit it from the cluster, RunningStack sets it for the stacks it starts."""
    headers = {}
    if policy is not None:
        headers["X-Routing-Policy"] = policy
        if (known := request.known_tokens(policy)) is not None:
            headers["X-True-Output-Tokens"] = str(known)
    if request.fixed_tokens is not None:
        headers["X-Fixed-Output-Tokens"] = str(request.fixed_tokens)
    if request.predictor_budget is not None:
        headers["X-Predictor-Budget"] = request.predictor_budget
    if headers and (key := os.environ.get(BENCHMARK_KEY_ENV)):
        headers["X-Benchmark-Key"] = key
    return headers


@ray.remote(num_cpus=0)  # clients wait on sockets; the CPUs Ray counts belong to the engines
class ReplayActor:
    def __init__(self, base_url: str, model: str, request_timeout_s: float):
        from openai import AsyncOpenAI

        self._model = model
        self._timeout_s = request_timeout_s
        self._client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                                   timeout=request_timeout_s)
        self.finished = 0  # requests ended since the actor started (a run's progress)

    def progress(self) -> int:
        return self.finished

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    async def open_loop(self, requests: list[dict], t0: float, deadline: float, policy: str | None,
                        label: str, load_rps: float | None) -> list[dict]:
        """Send each request at t0 + its arrival; t0 and deadline are wall-clock (time.time())."""
        async def one(req: TraceRequest) -> RequestRecord:
            while (wait := t0 + req.arrival_s - time.time()) > 0:  # the loop's timer may wake early
                await asyncio.sleep(wait)
            record = await self._send(req, t0, deadline, benchmark_headers(req, policy),
                                      dict(policy=label, mode="open", load_rps=load_rps, arrival_s=req.arrival_s))
            self.finished += 1
            return record

        reqs = [TraceRequest.model_validate(r) for r in requests]
        return [r.model_dump() for r in await asyncio.gather(*map(one, reqs))]

    async def _send(self, req: TraceRequest, t0: float, deadline: float, headers: dict, fields: dict) -> RequestRecord:
        sent = time.time()
        record = dict(request_id=req.request_id, scenario=req.scenario, prompt_tokens=req.prompt_tokens,
                      true_output_tokens=req.true_output_tokens, sent_s=sent - t0, **fields)
        extra = {"stream": True, "stream_options": {"include_usage": True},
                 "extra_headers": {**headers, "X-Request-Id": req.request_id}}  # the router logs it beside its own
        body = req.body(self._model)
        api = self._client.chat.completions if req.kind == "chat" else self._client.completions
        first = usage = None
        try:
            async with asyncio.timeout(max(0.0, min(self._timeout_s, deadline - sent))):
                async with await api.create(**body, **extra) as stream:
                    h = stream.response.headers
                    predicted, queued = h.get("x-predicted-tokens"), h.get("x-queue-ms")
                    record |= dict(pool=h.get("x-pool"), routed_policy=h.get("x-routing-policy"),
                                   predicted_tokens=None if predicted is None else int(predicted),
                                   length_source=h.get("x-length-source"),
                                   queued_s=None if queued is None else float(queued) / 1000,
                                   fallback=h.get("x-routing-fallback"))
                    async for chunk in stream:
                        if first is None and chunk.choices:
                            first = time.time()
                        usage = chunk.usage or usage
        except (TimeoutError, Exception) as e:  # every request ends as a record, never as a raise
            error = "timeout" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"[:500]
            return RequestRecord(**record, status="failed", error=error,
                                 first_token_s=None if first is None else first - t0)
        if usage is None:
            return RequestRecord(**record, status="failed", error="stream ended without usage")
        return RequestRecord(**record, status="ok", first_token_s=(first or time.time()) - t0,
                             finish_s=time.time() - t0, completion_tokens=usage.completion_tokens)


def connect(address: str | None = None) -> None:
    """Join the running cluster (the one `serve run` started), never start a new one."""
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)


def served_model(base_url: str) -> str:
    return httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"][0]["id"]


def spawn_actors(base_url: str, num_actors: int, request_timeout_s: float = 600, model: str | None = None) -> list:
    """num_actors replay actors, placed round-robin on the cluster's alive nodes.

    Placed, not left to Ray's SPREAD strategy: SPREAD is best effort and put three actors on one
    node of three in one of two fresh runs; a replay meant to come from several machines must.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    connect()
    model = model or served_model(base_url)
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    actors = [ReplayActor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=False))
              .remote(base_url, model, request_timeout_s) for i in range(num_actors)]
    ray.get([a.node_id.remote() for a in actors])  # started, or fail here rather than mid-replay
    return actors


def replay(
    base_url: str,
    trace: list[TraceRequest],
    num_actors: int = 2,
    policy: str | None = None,
    load_rps: float | None = None,
    timeout_s: float = 600,
    actors: list | None = None,
    t0: float | None = None,
    label: str | None = None,
    progress: bool = False,
) -> list[RequestRecord]:
    """Replay `trace` open loop against the router at `base_url`; one record per request.

    Joins the running Ray cluster (RAY_ADDRESS, else the local one `serve run` started) and uses
    `actors` from `spawn_actors`, or spawns `num_actors` of them. `policy` (needs the router's
    benchmark headers) picks the routing policy per request; None leaves the router's own.
    `timeout_s` bounds the whole replay: requests still running then end as failed records.
    `load_rps` only labels the records (the trace's arrivals already carry the rate).
    `t0`: the wall-clock time (time.time()) the trace starts at, if the caller must know it (to
    read the router's own records on the same clock); by default a moment from now.
    `label`: what the records call the policy (default: `policy`, else the router's own from
    /health; a server that is not lengthserve, such as Ray Serve LLM's app, needs one).
    `progress`: a bar of finished requests. Checks sent = completed + failed and raises
    LostRequests if any request has no record.
    """
    model = served_model(base_url)
    actors = actors or spawn_actors(base_url, num_actors, timeout_s, model)
    t0 = t0 or time.time() + START_LEAD_S
    label = label or policy or httpx.get(f"{base_url}/health", timeout=30).json()["policy"]
    shards = [trace[i::len(actors)] for i in range(len(actors))]
    busy = [a for a, shard in zip(actors, shards) if shard]
    start = sum(ray.get([a.progress.remote() for a in busy]))
    futures = [a.open_loop.remote([r.model_dump() for r in shard], t0, t0 + timeout_s, policy, label, load_rps)
               for a, shard in zip(busy, shards)]
    with tqdm(total=len(trace), desc=label, unit="req", disable=not progress, leave=False) as bar:
        waiting = futures
        while waiting:
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=2.0)
            bar.update(sum(ray.get([a.progress.remote() for a in busy])) - start - bar.n)
    raw = []
    for ref in futures:
        try:
            raw += ray.get(ref)
        except ray.exceptions.RayError as e:
            log.error("a replay actor failed: %s", e)
    records = [RequestRecord.model_validate(r) for r in raw]
    tally = account(trace, records)
    log.info("replay %s: %s", label, tally)
    if tally.lost:
        raise LostRequests(str(tally))
    return records
