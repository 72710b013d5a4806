"""Rollouts: a batch of prompts x n samples, the way an RL framework asks for them, scheduled as a batch.

A training step waits for its slowest sample, so a batch is judged by its makespan, not its mean
latency, and the classic answer is the opposite of shortest-first: longest-predicted-first onto
the replica with the least predicted work (LPT). All predictions are made up front, concurrently
(the predictor batches them). Schedules:
- `makespan`: a free slot goes to the longest predicted job still waiting, on the replica with the
  least predicted remaining work (the pool's ledger, router.replica_ledger; Ray's replica router
  honours the choice, router.replica_router);
- `padding`: jobs sorted by predicted length, cut into groups of `batch_size`; each replica runs
  one group at a time and takes the next when its whole group is done: the groups a
  batch-synchronous engine would decode together, as similar in length as the predictions allow;
- `fifo` (the default): prompt order, Ray's replica choice (the length-blind baseline). On the
  embedded default it measured best: `makespan` lost to it on the real stack even on the
  prompt-only ceiling's lengths (benchmarks/results/rollout.md), and gains 2-3% in the simulator.
With `siblings`, a finished sample updates the estimates of its prompt's waiting samples
(router.siblings). Rollout jobs take the pool's slots through its admission queue like any other
request, so a rollout never starves online traffic of the queue's order.

Every sample comes back with its length and timing (seconds from the rollout's start), its replica
and its group, or with the error that ended it: none is dropped.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from ray.serve.llm.openai_api_models import ChatCompletionRequest

from router.errors import APIError
from router.forwarding import ReplicaFailed, _engine_error, _first
from router.siblings import SiblingEstimates
from router.waiting import PoolGate, Ticket

Schedule = Literal["makespan", "padding", "fifo"]


class RolloutRequest(BaseModel):
    model: str
    prompts: list[str | list[dict]] = Field(min_length=1, description="a user message, or a chat's messages")
    n: int = Field(1, ge=1, description="samples per prompt")
    max_tokens: int = Field(ge=1)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    schedule: Schedule = "fifo"  # measured best on the embedded default (benchmarks/results/rollout.md)
    batch_size: int = Field(8, ge=1, description="padding: jobs decoded together")
    siblings: bool = False
    head: str | None = Field(None, description="predictor head (default: the router's); none for fifo")
    # Benchmarks only (benchmark key): each sample's length told instead of predicted (oracle, ceiling).
    known_tokens: list[list[int | None]] | None = None

    @model_validator(mode="after")
    def _shapes(self) -> "RolloutRequest":
        if self.known_tokens is not None and [len(k) for k in self.known_tokens] != [self.n] * len(self.prompts):
            raise ValueError("known_tokens needs n lengths for each prompt")
        return self


@dataclass
class _Job:
    index: int
    prompt: int
    sample: int
    estimate: float | None
    request_id: str
    group: int | None = None
    result: dict | None = None


class RolloutRunner:
    """One pool's rollouts; the router hands it the pool's parts."""

    def __init__(self, pool: str, handle, gate: PoolGate, ledger, predictor, render, max_jobs: int,
                 per_replica: int | None):
        self.pool, self._handle, self._gate, self._ledger = pool, handle, gate, ledger
        self._predictor, self._render, self._max_jobs = predictor, render, max_jobs
        self._per_replica = per_replica  # a replica's max_ongoing_requests: a full one is not chosen

    async def run(self, req: RolloutRequest) -> dict:
        if len(req.prompts) * req.n > self._max_jobs:
            raise APIError(400, f"{len(req.prompts) * req.n} samples in one rollout; at most {self._max_jobs}.",
                           param="prompts")
        bodies = [self._body(req, p) for p in req.prompts]
        estimates = await self._estimates(req, bodies)
        pairs = [(p, k) for p in range(len(req.prompts)) for k in range(req.n)]
        jobs = [_Job(i, p, k, estimates[p][k], f"rollout-{uuid.uuid4().hex}") for i, (p, k) in enumerate(pairs)]
        siblings = SiblingEstimates() if req.siblings and req.schedule != "fifo" else None
        if siblings is not None:
            for job in jobs:
                if job.estimate is not None:
                    siblings.add(job.index, job.prompt, job.estimate)
        start = time.monotonic()
        if req.schedule == "padding":
            await self._padding(req, bodies, jobs, start)
        else:
            await self._one_at_a_time(req, bodies, jobs, start, siblings)
        return {"object": "rollout", "schedule": req.schedule, "pool": self.pool,
                "samples": [job.result for job in jobs]}

    def _body(self, req: RolloutRequest, prompt) -> ChatCompletionRequest:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return ChatCompletionRequest(model=req.model, messages=messages, max_tokens=req.max_tokens,
                                     temperature=req.temperature, top_p=req.top_p, stream=True,
                                     stream_options={"include_usage": True})

    async def _estimates(self, req: RolloutRequest, bodies) -> list[list[float | None]]:
        """Per prompt and sample: the known length, the prediction (one per prompt), or None."""
        if req.known_tokens is not None:
            return req.known_tokens
        if req.schedule == "fifo":
            return [[None] * req.n for _ in bodies]

        async def one(body):
            ids, _ = await self._render(body, "chat")
            if ids is None:
                return None
            outcome = await self._predictor.predict(ids[0], req.max_tokens, req.head)
            return None if outcome.prediction is None else outcome.prediction["expected_tokens"]

        predicted = await asyncio.gather(*map(one, bodies))
        return [[p] * req.n for p in predicted]

    def _least_loaded(self) -> str | None:
        """The live replica with room and the least predicted remaining work (requests without a
        prediction count as one token); None: let Ray's router choose."""
        loads = self._ledger.snapshot()
        room = [r for r in self._ledger.live_replicas()
                if self._per_replica is None or loads.get(r, {}).get("requests", 0) < self._per_replica]
        if not room:
            return None
        return min(room, key=lambda r: loads.get(r, {}).get("predicted_remaining_tokens", 0.0)
                   + loads.get(r, {}).get("requests", 0) - loads.get(r, {}).get("predicted", 0))

    async def _one_at_a_time(self, req, bodies, jobs, start, siblings) -> None:
        """makespan and fifo: each freed slot takes the best job waiting now."""
        waiting = list(jobs)
        running: list[asyncio.Task] = []
        while waiting:
            ticket = Ticket(f"rollout-slot-{uuid.uuid4().hex}")
            self._gate.offer(ticket, None)
            await self._gate.wait(ticket, 3600)
            if req.schedule == "makespan":  # longest first, with whatever the finished siblings taught
                def estimate(j):
                    return siblings.estimate(j.index) if siblings and j.estimate is not None else (j.estimate or 0.0)
                job = max(waiting, key=estimate)
            else:
                job = waiting[0]
            waiting.remove(job)
            if siblings is not None and job.estimate is not None:
                siblings.started(job.index)
            replica = self._least_loaded() if req.schedule == "makespan" and job.estimate is not None else None
            self._place(job, replica)  # before the next choice, which must see this job's work
            running.append(asyncio.create_task(self._sample(req, bodies, job, start, siblings)))
        await asyncio.gather(*running)

    async def _padding(self, req, bodies, jobs, start) -> None:
        """Groups of similar predicted length, one group per replica at a time."""
        ordered = sorted(jobs, key=lambda j: (j.estimate is None, j.estimate or 0.0))
        groups = [ordered[i:i + req.batch_size] for i in range(0, len(ordered), req.batch_size)]
        for g, group in enumerate(groups):
            for job in group:
                job.group = g
        replicas = self._ledger.live_replicas() or [None]
        queue = list(groups)

        async def lane(replica):
            while queue:
                group = queue.pop(0)
                tickets = [Ticket(f"rollout-slot-{uuid.uuid4().hex}") for _ in group]
                for t in tickets:
                    self._gate.offer(t, None)
                await asyncio.gather(*(self._gate.wait(t, 3600) for t in tickets))
                for job in group:
                    self._place(job, replica)
                await asyncio.gather(*(self._sample(req, bodies, job, start, None) for job in group))

        await asyncio.gather(*map(lane, replicas))

    def _place(self, job: _Job, replica: str | None) -> None:
        """The job's estimate and replica (None: Ray's choice) go to the pool's ledger."""
        if job.estimate is not None:
            self._ledger.estimated(job.request_id, job.estimate)
        if replica is not None:
            self._ledger.pin(job.request_id, replica)

    async def _sample(self, req, bodies, job: _Job, start: float, siblings) -> None:
        """One sample on a slot it already holds; gives the slot back when done."""
        body = bodies[job.prompt].model_copy(update={"request_id": job.request_id})
        dispatched = time.monotonic() - start
        try:
            text, usage, first, finish_reason = await self._complete(body, start)
            job.result = {"prompt_index": job.prompt, "sample_index": job.sample, "text": text,
                          "completion_tokens": usage.get("completion_tokens"), "finish_reason": finish_reason,
                          "estimated_tokens": job.estimate, "replica": self._ledger.replica_of(job.request_id),
                          "group": job.group, "dispatched_s": dispatched, "first_token_s": first,
                          "finished_s": time.monotonic() - start, "error": None}
        except Exception as e:  # every sample ends with a result: failed ones say why
            job.result = {"prompt_index": job.prompt, "sample_index": job.sample, "text": None,
                          "completion_tokens": None, "finish_reason": None, "estimated_tokens": job.estimate,
                          "replica": None, "group": job.group, "dispatched_s": dispatched, "first_token_s": None,
                          "finished_s": time.monotonic() - start, "error": f"{type(e).__name__}: {e}"}
        finally:
            self._ledger.drop(job.request_id)
            self._gate.leave()
        if siblings is not None and job.estimate is not None and job.result["completion_tokens"] is not None:
            siblings.finished(job.index, job.result["completion_tokens"])

    async def _complete(self, body, start: float) -> tuple[str, dict, float | None, str | None]:
        """Text, usage, first-token time and finish reason of one streamed sample; a replica that
        fails before answering is retried once."""
        for attempt in range(2):
            stream = self._handle.chat.remote(body, None)
            try:
                first = await _first(stream)
            except ReplicaFailed:
                if attempt == 1:
                    raise
                await asyncio.sleep(1.0)
                continue
            if (err := _engine_error(first)) is not None:
                raise err
            break
        text, usage, first_token, finish = [], {}, None, None
        async for item in _chain(first, stream):
            for event in "".join(item if isinstance(item, list) else [item]).split("\n\n"):
                if not event.startswith("data: ") or event == "data: [DONE]":
                    continue
                chunk = json.loads(event[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"].get("message"))
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    if first_token is None:
                        first_token = time.monotonic() - start
                    self._ledger.streamed(body.request_id)
                    text.append((choice.get("delta") or {}).get("content") or "")
                    finish = choice.get("finish_reason") or finish
        return "".join(text), usage, first_token, finish


async def _chain(first, stream):
    yield first
    async for item in stream:
        yield item
