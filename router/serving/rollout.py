"""Rollouts: a batch of prompts x n samples, the way an RL framework asks for them, scheduled as a batch.

The schedule is a pure plan (router.scheduling.rollout_plans, which the simulator drives too); this
runs it on the stack: each prompt's history (router.serving.history) and, for a prompt without
one, its prediction up front (one per prompt, concurrently, so the predictor batches them), slots
taken through the pool's admission queue like any other request (a rollout never starves online
traffic of the queue's order), samples sent through the one pool client
(router.serving.pool_client), and a makespan plan's placement honoured by the pool's replica router
(router.serving.replica_router), which offers the pinned replica first and spills rather than wait.
- `fifo` (the default) and `makespan`: each freed slot goes to the plan's next sample;
- `padding`: each live replica runs one group of similar estimates at a time and takes the
  next when its whole group is done (the groups a batch-synchronous engine would decode).

The tail is not waited for when the request says so:
- first-k (`k`, or `done_share` of the batch): once enough samples are done, the plan's `FirstK`
  cuts the rest; a running one's stream is cancelled, which aborts it in its engine;
- a token budget (`budget_tokens`): a sample still running there stops as partial, with a
  `continuation_id` (router.serving.continuation) that a later rollout's `continuations` resume
  from where it stopped, by token ids, on the replica whose prefix cache holds them.

Every sample comes back with its status, length and timing (seconds from the rollout's start),
its replica and its group, or with the error that ended it: none is dropped. Each length that is
a label (`Request.natural_length`; cut and partial ones censored) goes to the history and, for the
sample whose prompt the predictor saw, to the online learner. A queue that fills while the
rollout waits for a slot ends it with 429 (OpenAI's format, Retry-After), after cancelling its
samples in flight: nothing is left running for nobody.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, model_validator
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

from router.scheduling.request import CUT, Request
from router.scheduling.rollout_plans import (FirstK, RolloutPlan, Schedule, call_tokens, estimate, outcome,
                                             padding_groups, signal)
from router.serving.continuation import Continuations, Partial
from router.serving.errors import APIError
from router.serving.gate import Gate, QueueFull
from router.serving.history import LengthHistory
from router.serving.pool_client import Output, PoolClient, once
from router.serving.predictor_client import PredictorClient

# The pipeline's render (router.serving.pipeline.Pipeline.render): the prompt's ids, and on the
# record its history key and its history when it has one.
Render = Callable[[Request, ChatCompletionRequest, str], Awaitable[tuple[list[int] | None, str]]]
Learn = Callable[[Request], None]  # a finished record's length to the learner and the history
SLOT_WAIT_S = 3600.0  # a rollout waits for slots as long as a training step would


class RolloutRequest(BaseModel):
    model: str
    prompts: list[str | list[dict]] = Field(default_factory=list, description="a user message, or a chat's messages")
    continuations: list[str] = Field(default_factory=list, description="partial samples of earlier rollouts to "
                                     "continue: their continuation_id")
    n: int = Field(1, ge=1, description="samples per prompt")
    max_tokens: int = Field(ge=1, description="per sample of `prompts`; a continued one keeps what remains of its own")
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    schedule: Schedule = "fifo"  # measured best on the embedded default (benchmarks/results/rollout.md)
    batch_size: int = Field(8, ge=1, description="padding: samples decoded together")
    siblings: bool = False
    head: str | None = Field(None, description="predictor head (default: the router's); none for fifo")
    k: int | None = Field(None, ge=1, description="first-k-of-n: answer once k samples of every prompt are done; "
                          "the others are cut")
    done_share: float | None = Field(None, gt=0, le=1, description="first-k of the batch: answer once this share of "
                                     "all samples are done; the others are cut")
    budget_tokens: int | None = Field(None, ge=1, description="a sample still running at this many tokens stops as "
                                      "partial, to be continued")
    # Benchmarks only (benchmark key): each sample's length told instead of predicted (oracle, ceiling).
    known_tokens: list[list[int | None]] | None = None

    @model_validator(mode="after")
    def _shapes(self) -> "RolloutRequest":
        if not self.prompts and not self.continuations:
            raise ValueError("a rollout needs prompts or continuations")
        if self.k is not None and self.k > self.n:
            raise ValueError(f"k ({self.k}) is more than the n ({self.n}) samples of a prompt")
        if self.k is not None and self.done_share is not None:
            raise ValueError("first-k is per prompt (k) or of the whole batch (done_share), not both")
        if self.known_tokens is not None and [len(k) for k in self.known_tokens] != [self.n] * len(self.prompts):
            raise ValueError("known_tokens needs n lengths for each prompt")
        return self


@dataclass
class _Sample:
    """One sample: its record, what it is sent as, where it comes from, and what it generated."""

    request: Request
    body: ChatCompletionRequest | CompletionRequest
    prompt_index: int | None = None
    sample_index: int | None = None
    continues: int | None = None  # its index in the request's `continuations`
    partial: Partial | None = None  # what it continues
    output: Output = field(default_factory=Output)

    @property
    def kind(self) -> str:
        return "chat" if isinstance(self.body, ChatCompletionRequest) else "completions"


class RolloutRunner:
    """One pool's rollouts."""

    def __init__(self, pool: PoolClient, gate: Gate, predictor: PredictorClient, render: Render, max_samples: int,
                 per_replica: int | None, continuations: Continuations | None = None,
                 history: LengthHistory | None = None, learn: Learn | None = None):
        self.pool, self.gate, self._predictor, self._render = pool, gate, predictor, render
        self._max_samples = max_samples
        self._per_replica = per_replica  # a replica's max_ongoing_requests: a full one is not asked for
        # Shared by the pools' runners (router.serving.pipeline): a sample continues on any pool.
        self._continuations, self._history = continuations or Continuations.from_env(), history
        self.learn = learn or (lambda request: None)

    async def run(self, req: RolloutRequest) -> dict:
        count = len(req.prompts) * req.n + len(req.continuations)
        if count > self._max_samples:
            raise APIError(400, f"{count} samples in one rollout; at most {self._max_samples}.", param="prompts")
        partials = [self._continuations.open(token, j, req.model) for j, token in enumerate(req.continuations)]
        samples = [*self._fresh(req), *(self._continued(req, j, p) for j, p in enumerate(partials))]
        await self._know(req, samples)
        enough = FirstK([s.request for s in samples], req.k, req.done_share)
        start = time.time()
        try:
            async with asyncio.TaskGroup() as tasks:  # a failure (a full queue) cancels every sample
                _Rollout(self, req, samples, enough, tasks).start()
        except* QueueFull as group:
            e = group.exceptions[0]
            raise APIError(429, f"The {e.pool} pool's queue is full; retry the rollout in {e.retry_after_s} s.",
                           code="queue_full", headers={"Retry-After": str(e.retry_after_s)}) from None
        results = [self._result(req, s, start) for s in samples]
        counts = Counter(r["status"] for r in results)
        return {"object": "rollout", "schedule": req.schedule, "pool": self.pool.name,
                **{status: counts[status] for status in ("done", "cut", "partial", "failed")}, "samples": results}

    def _fresh(self, req: RolloutRequest) -> list[_Sample]:
        samples = []
        for p, prompt in enumerate(req.prompts):
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            body = ChatCompletionRequest(model=req.model, messages=messages, max_tokens=req.max_tokens,
                                         temperature=req.temperature, top_p=req.top_p, stream=True,
                                         stream_options={"include_usage": True}, return_token_ids=True)
            samples += [_Sample(Request(id=f"rollout-{uuid.uuid4().hex}", policy=f"rollout_{req.schedule}", family=p,
                                        max_tokens=req.max_tokens, pool=self.pool.name,
                                        told_tokens=None if req.known_tokens is None else req.known_tokens[p][k]),
                                body, prompt_index=p, sample_index=k)
                        for k in range(req.n)]
        return samples

    def _continued(self, req: RolloutRequest, j: int, partial: Partial) -> _Sample:
        """Its prompt and output so far as one token prompt: the engine's prefix cache recognises
        them (on the replica that holds them, which it asks for first)."""
        body = CompletionRequest(model=req.model, prompt=partial.prompt_ids + partial.output_ids,
                                 max_tokens=partial.remaining_tokens, temperature=req.temperature, top_p=req.top_p,
                                 stream=True, stream_options={"include_usage": True}, return_token_ids=True)
        request = Request(id=f"rollout-{uuid.uuid4().hex}", policy=f"rollout_{req.schedule}", family=("continued", j),
                          max_tokens=partial.remaining_tokens, pool=self.pool.name, prompt_key=partial.prompt_key,
                          resumed_tokens=len(partial.output_ids), pinned=partial.replica)
        return _Sample(request, body, continues=j, partial=partial)

    async def _know(self, req: RolloutRequest, samples: list[_Sample]) -> None:
        """What each prompt's samples are estimated by: its history, else (if the schedule reads
        lengths and none were told) its prediction. One render and one prediction per prompt;
        a continued sample's prompt ids came with it."""
        families: dict = {}
        for sample in samples:
            families.setdefault(sample.request.family, []).append(sample)
        predicts = req.known_tokens is None and req.schedule != "fifo"

        async def one(family: list[_Sample]):
            first = family[0].request
            if self._history is None and not predicts:
                return
            if family[0].partial is not None:
                ids = family[0].partial.prompt_ids
                if self._history is not None and first.prompt_key is not None:
                    first.history = self._history.lookup(first.prompt_key)
            else:
                ids, _ = await self._render(first, family[0].body, "chat")
                if ids is None:
                    return
            for s in family:
                s.request.prompt_key, s.request.history = first.prompt_key, first.history
            if first.history is not None or not predicts:
                return
            first.sent_to_predictor = True  # a learning predictor's features: its length is their label
            cap = first.max_tokens + first.resumed_tokens  # the whole length's, a continued sample's too
            predicted = await self._predictor.predict(ids, cap, req.head, request_id=first.id)
            for s in family:
                s.request.prediction, s.request.prediction_failure = predicted.prediction, predicted.failure

        await asyncio.gather(*(one(family) for family in families.values()))

    async def claim(self) -> Request:
        """A slot of the pool, taken through its admission queue (in arrival order)."""
        claim = Request(id=f"rollout-slot-{uuid.uuid4().hex}", policy="rollout_slot", pool=self.pool.name,
                        arrival=time.time())
        self.gate.offer(claim)
        await self.gate.wait(claim, SLOT_WAIT_S)
        return claim

    def room(self):
        """The pool's replicas a sample may still ask for (below their ongoing limit)."""
        return [load for load in self.pool.ledger.loads()
                if self._per_replica is None or load.requests < self._per_replica]

    def _result(self, req: RolloutRequest, sample: _Sample, start: float) -> dict:
        def since(t: float | None) -> float | None:
            return None if t is None else t - start

        r, output = sample.request, sample.output
        status = outcome(r)
        found = signal(r)
        return {"prompt_index": sample.prompt_index, "sample_index": sample.sample_index, "continues": sample.continues,
                "status": status, "text": None if status == "failed" else output.text,
                "completion_tokens": None if status == "failed" else r.completion_tokens,
                "resumed_tokens": r.resumed_tokens, "finish_reason": r.finish_reason,
                "estimated_tokens": estimate(r), "estimate_source": None if found is None else found[1],
                "replica": r.replica, "group": r.group, "cached_prompt_tokens": output.cached_tokens,
                "dispatched_s": since(r.dispatched_at), "first_token_s": since(r.first_token_at),
                "finished_s": since(r.finished_at), "error": r.error,
                "continuation_id": self._continuation(req, sample) if status == "partial" else None}

    def _continuation(self, req: RolloutRequest, sample: _Sample) -> str | None:
        r, output, before = sample.request, sample.output, sample.partial
        prompt_ids = before.prompt_ids if before is not None else output.prompt_ids
        if prompt_ids is None:  # the engine did not say what it rendered: nothing exact to continue from
            return None
        return self._continuations.issue(Partial(
            model=req.model, prompt_ids=prompt_ids,
            output_ids=(before.output_ids if before is not None else []) + output.token_ids,
            remaining_tokens=r.max_tokens - r.completion_tokens, prompt_key=r.prompt_key, replica=r.replica))


class _Rollout:
    """One rollout on the stack: the plan's choices carried out as slots free, samples started,
    and cut when the plan's FirstK says the rollout has enough."""

    def __init__(self, runner: RolloutRunner, req: RolloutRequest, samples: list[_Sample], enough: FirstK,
                 tasks: asyncio.TaskGroup):
        self._runner, self._req, self._enough, self._tasks = runner, req, enough, tasks
        self._samples = {s.request.id: s for s in samples}
        self._running: dict[str, asyncio.Task] = {}
        self._feeders: list[asyncio.Task] = []  # what waits for slots to start samples

    def start(self) -> None:
        records = [s.request for s in self._samples.values()]
        if self._req.schedule == "padding":
            groups = padding_groups(records, self._req.batch_size)
            for replica in self._runner.pool.ledger.live_replicas() or [None]:
                self._feeders.append(self._tasks.create_task(self._lane(groups, replica)))
        else:
            plan = RolloutPlan(records, self._req.schedule, self._req.siblings, self._req.budget_tokens,
                               self._enough.tail)
            self._feeders.append(self._tasks.create_task(self._slot_by_slot(plan)))

    async def _slot_by_slot(self, plan: RolloutPlan) -> None:
        pool = self._runner.pool
        while len(plan):
            claim = await self._runner.claim()
            if not len(plan):  # the rest was cut while this waited for the slot
                self._runner.gate.leave(claim)
                return
            sample = plan.next()
            sample.pinned = plan.place(sample, self._runner.room())
            pool.ledger.track(sample)  # before the next choice, which must see its work
            self._start(sample, claim, plan)

    async def _lane(self, groups: list[list[Request]], replica: str | None) -> None:
        while groups:
            running = []
            for sample in groups.pop(0):
                if not self._enough.wanted(sample):
                    continue
                claim = await self._runner.claim()
                if not self._enough.wanted(sample):  # cut while this waited for the slot
                    self._runner.gate.leave(claim)
                    continue
                sample.pinned = replica
                running.append(self._start(sample, claim, None))
            if running:
                await asyncio.wait(running)

    def _start(self, sample: Request, claim: Request, plan: RolloutPlan | None) -> asyncio.Task:
        """Run a sample on the slot it holds; the slot is given back however the sample ends, also
        when its task is cancelled before it ever ran."""
        sample.arrival = sample.dispatched_at = claim.dispatched_at
        self._enough.started(sample)
        done = once(lambda s: self._finished(s, plan))
        task = self._tasks.create_task(self._send(self._samples[sample.id], done))
        task.add_done_callback(lambda _: done(sample))
        self._running[sample.id] = task
        return task

    async def _send(self, sample: _Sample, done) -> None:
        r = sample.request
        body = sample.body.model_copy(update={"max_tokens": call_tokens(r, self._req.budget_tokens)})
        try:
            answer = await self._runner.pool.open(r, sample.kind, body, done)
            await answer.collect(sample.output)
        except Exception as e:  # every sample ends with a result: a failed one says why
            r.error = f"{type(e).__name__}: {e}"

    def _finished(self, sample: Request, plan: RolloutPlan | None) -> None:
        sample.finished_at = sample.finished_at or time.time()
        self._runner.gate.leave(sample)
        if sample.finish_reason == CUT and sample.completion_tokens is None:  # cut before its first token
            sample.completion_tokens = 0
        self._runner.learn(sample)
        if plan is not None:
            plan.finished(sample)
        for victim in self._enough.ended(sample):
            self._running[victim.id].cancel()  # its stream's cancellation aborts it in the engine
        if not self._enough.unstarted:  # nothing left to start: a slot still awaited is not needed
            for feeder in self._feeders:
                feeder.cancel()
