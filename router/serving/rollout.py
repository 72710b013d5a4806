"""Rollouts: a batch of prompts x n samples, the way an RL framework asks for them, scheduled as a batch.

The schedule is a pure plan (router.scheduling.rollout_plans, which the simulator drives too); this
runs it on the stack: predictions up front (one per prompt, concurrently, so the predictor
batches them), slots taken through the pool's admission queue like any other request (a rollout
never starves online traffic of the queue's order), samples sent through the one pool client
(router.serving.pool_client), and a makespan plan's placement honoured by the pool's replica router
(router.serving.replica_router), which offers the pinned replica first and spills rather than wait.
- `fifo` (the default) and `makespan`: each freed slot goes to the plan's next sample;
- `padding`: each live replica runs one group of similar estimates at a time and takes the
  next when its whole group is done (the groups a batch-synchronous engine would decode).

Every sample comes back with its length and timing (seconds from the rollout's start), its
replica and its group, or with the error that ended it: none is dropped. A queue that fills
while the rollout waits for a slot ends it with 429 (OpenAI's format, Retry-After), after
cancelling its samples in flight: nothing is left running for nobody.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, Field, model_validator
from ray.serve.llm.openai_api_models import ChatCompletionRequest

from router.scheduling.request import Request
from router.scheduling.rollout_plans import RolloutPlan, Schedule, estimate, padding_groups
from router.serving.errors import APIError
from router.serving.gate import Gate, QueueFull
from router.serving.pool_client import PoolClient, once
from router.serving.predictor_client import PredictorClient

Render = Callable[[Request, ChatCompletionRequest, str], Awaitable[tuple[list[int] | None, str]]]
SLOT_WAIT_S = 3600.0  # a rollout waits for slots as long as a training step would


class RolloutRequest(BaseModel):
    model: str
    prompts: list[str | list[dict]] = Field(min_length=1, description="a user message, or a chat's messages")
    n: int = Field(1, ge=1, description="samples per prompt")
    max_tokens: int = Field(ge=1)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    schedule: Schedule = "fifo"  # measured best on the embedded default (benchmarks/results/rollout.md)
    batch_size: int = Field(8, ge=1, description="padding: samples decoded together")
    siblings: bool = False
    head: str | None = Field(None, description="predictor head (default: the router's); none for fifo")
    # Benchmarks only (benchmark key): each sample's length told instead of predicted (oracle, ceiling).
    known_tokens: list[list[int | None]] | None = None

    @model_validator(mode="after")
    def _shapes(self) -> "RolloutRequest":
        if self.known_tokens is not None and [len(k) for k in self.known_tokens] != [self.n] * len(self.prompts):
            raise ValueError("known_tokens needs n lengths for each prompt")
        return self


class RolloutRunner:
    """One pool's rollouts."""

    def __init__(self, pool: PoolClient, gate: Gate, predictor: PredictorClient, render: Render, max_samples: int,
                 per_replica: int | None):
        self._pool, self._gate, self._predictor, self._render = pool, gate, predictor, render
        self._max_samples = max_samples
        self._per_replica = per_replica  # a replica's max_ongoing_requests: a full one is not asked for

    async def run(self, req: RolloutRequest) -> dict:
        if len(req.prompts) * req.n > self._max_samples:
            raise APIError(400, f"{len(req.prompts) * req.n} samples in one rollout; at most {self._max_samples}.",
                           param="prompts")
        bodies = [self._body(req, p) for p in req.prompts]
        samples = [Request(id=f"rollout-{uuid.uuid4().hex}", policy=f"rollout_{req.schedule}", family=p,
                           max_tokens=req.max_tokens, pool=self._pool.name,
                           told_tokens=None if req.known_tokens is None else req.known_tokens[p][k])
                   for p in range(len(req.prompts)) for k in range(req.n)]
        if req.known_tokens is None and req.schedule != "fifo":
            await self._predict(req, bodies, samples)
        texts: dict[str, str] = {}
        start = time.time()
        try:
            async with asyncio.TaskGroup() as tasks:  # a failure (a full queue) cancels every sample
                if req.schedule == "padding":
                    await self._padding(req, bodies, samples, texts, tasks)
                else:
                    await self._slot_by_slot(RolloutPlan(samples, req.schedule, req.siblings), bodies, texts, tasks)
        except* QueueFull as group:
            e = group.exceptions[0]
            raise APIError(429, f"The {e.pool} pool's queue is full; retry the rollout in {e.retry_after_s} s.",
                           code="queue_full", headers={"Retry-After": str(e.retry_after_s)}) from None
        return {"object": "rollout", "schedule": req.schedule, "pool": self._pool.name,
                "samples": [_result(s, i % req.n, texts.get(s.id), start) for i, s in enumerate(samples)]}

    @staticmethod
    def _body(req: RolloutRequest, prompt) -> ChatCompletionRequest:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return ChatCompletionRequest(model=req.model, messages=messages, max_tokens=req.max_tokens,
                                     temperature=req.temperature, top_p=req.top_p, stream=True,
                                     stream_options={"include_usage": True})

    async def _predict(self, req: RolloutRequest, bodies, samples: list[Request]) -> None:
        """One prediction per prompt (its samples share it); a prompt without one goes last."""
        async def one(p: int):
            ids, _ = await self._render(samples[p * req.n], bodies[p], "chat")
            if ids is None:
                return
            outcome = await self._predictor.predict(ids, req.max_tokens, req.head)
            for sample in samples[p * req.n:(p + 1) * req.n]:
                sample.prediction = outcome.prediction
                sample.prediction_failure = outcome.failure

        await asyncio.gather(*(one(p) for p in range(len(bodies))))

    async def _claim(self) -> Request:
        """A slot of the pool, taken through its admission queue (in arrival order)."""
        claim = Request(id=f"rollout-slot-{uuid.uuid4().hex}", policy="rollout_slot", pool=self._pool.name,
                        arrival=time.time())
        self._gate.offer(claim)
        await self._gate.wait(claim, SLOT_WAIT_S)
        return claim

    def _room(self):
        """The pool's replicas a sample may still ask for (below their ongoing limit)."""
        return [load for load in self._pool.ledger.loads()
                if self._per_replica is None or load.requests < self._per_replica]

    async def _slot_by_slot(self, plan: RolloutPlan, bodies, texts: dict, tasks: asyncio.TaskGroup) -> None:
        while len(plan):
            claim = await self._claim()
            sample = plan.next()
            sample.arrival = sample.dispatched_at = claim.dispatched_at
            sample.pinned = plan.place(sample, self._room())
            self._pool.ledger.track(sample)  # before the next choice, which must see its work
            self._start(tasks, bodies[sample.family], sample, texts, plan)

    async def _padding(self, req: RolloutRequest, bodies, samples: list[Request], texts: dict,
                       tasks: asyncio.TaskGroup) -> None:
        queue = padding_groups(samples, req.batch_size)

        async def lane(replica: str | None):
            while queue:
                group = queue.pop(0)
                running = []
                for sample in group:
                    claim = await self._claim()
                    sample.arrival = sample.dispatched_at = claim.dispatched_at
                    sample.pinned = replica
                    running.append(self._start(tasks, bodies[sample.family], sample, texts, None))
                await asyncio.wait(running)

        for replica in self._pool.ledger.live_replicas() or [None]:
            tasks.create_task(lane(replica))

    def _start(self, tasks: asyncio.TaskGroup, body, sample: Request, texts: dict, plan: RolloutPlan | None):
        """Run a sample on the slot it holds; the slot is given back however the sample ends, also
        when its task is cancelled before it ever ran."""
        def finished(s: Request) -> None:
            s.finished_at = s.finished_at or time.time()
            self._gate.leave(s)
            if plan is not None and s.completion_tokens is not None and s.error is None:
                plan.finished(s, s.completion_tokens)

        done = once(finished)
        task = tasks.create_task(self._sample(body, sample, texts, done))
        task.add_done_callback(lambda _: done(sample))
        return task

    async def _sample(self, body: ChatCompletionRequest, sample: Request, texts: dict, done) -> None:
        try:
            answer = await self._pool.open(sample, "chat", body.model_copy(), done)
            texts[sample.id] = await answer.text()
        except Exception as e:  # every sample ends with a result: a failed one says why
            sample.error = f"{type(e).__name__}: {e}"

def _result(sample: Request, index: int, text: str | None, start: float) -> dict:
    def since(t: float | None) -> float | None:
        return None if t is None else t - start

    return {"prompt_index": sample.family, "sample_index": index, "text": text,
            "completion_tokens": sample.completion_tokens, "finish_reason": sample.finish_reason,
            "estimated_tokens": estimate(sample), "replica": sample.replica, "group": sample.group,
            "dispatched_s": since(sample.dispatched_at), "first_token_s": since(sample.first_token_at),
            "finished_s": since(sample.finished_at), "error": sample.error}
