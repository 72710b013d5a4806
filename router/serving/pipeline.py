"""One request's way through the router: render -> predict -> decide -> admit -> dispatch -> complete.

Free of HTTP: the API layer (router.api.app) parses and authenticates, hands the typed body here, and
turns the result into a response. Each stage fills the request's one record (router.scheduling.request):
1. render: the token ids the engine will see (router.serving.render), off the event loop, time-limited;
2. predict: a pool policy (estp, egtp, last) needs its prediction to pick a pool, so it waits for
   it here, unless a cheaper signal gives the length (router.scheduling.signals); a work policy
   (last_work, ...) never waits;
3. decide: the scheduling core (router.scheduling.scheduler) picks the pool, spills, and ranks; while
   live quality distrusts the policy's head (router.serving.live_quality), its fallback decides;
4. admit: a free slot dispatches at once, else the request waits in the pool's queue
   (router.serving.gate), or gets 429 with Retry-After when the queue is full. A work policy's
   prediction runs while its request waits and re-ranks it when it lands, unless a cheaper signal
   ranks it already or the predictor budget finds it cannot pay (router.scheduling.budget); with
   `predictor.predict: all` requests dispatched at once are predicted too, off their path;
5. dispatch: to the pool's replicas through the one pool client (router.serving.pool_client);
6. complete: the slot goes to the next waiting request, each signal (the head's prediction, the
   client's hint, the history) is scored against the real length (which may stop the router
   trusting that source), and the record is logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ray.serve.handle import DeploymentHandle
from vllm.entrypoints.generate.base.protocol import StreamOptions

from router.scheduling.budget import Mode
from router.scheduling.policies import POLICIES, head_of
from router.scheduling.request import Request
from router.scheduling.rollout_plans import outcome as ended_as
from router.scheduling.signals import SCORED
from router.serving.config import REPO_ROOT, RoutingPlan, StackConfig, build_scheduler
from router.serving.continuation import Continuations
from router.serving.errors import APIError
from router.serving.gate import Gate, QueueFull
from router.serving.history import LengthHistory
from router.serving.live_quality import LiveQuality
from router.serving.pool_client import Answer, PoolClient, once
from router.serving.predictor_client import Outcome, PredictorClient
from router.serving.render import UnsupportedPrompt, prompt_ids
from router.serving.replica_ledger import ledger
from router.serving.request_log import RequestLog
from router.serving.rollout import RolloutRequest, RolloutRunner
from router.serving.telemetry import BudgetMetrics, QualityMetrics, QueueMetrics, RoutingMetrics

log = logging.getLogger("ray.serve")
PREFILL_PROBE_S = 5.0  # how often the router asks a predictor that is not up yet for its measured prefill


@dataclass(frozen=True)
class Overrides:
    """What a benchmark asked of one request (router.benchmark_headers: true only)."""

    policy: str | None = None  # decide by this policy instead of the configured one
    told_tokens: int | None = None  # the real output length (oracle) or a prompt's median (ceiling)
    pool: str | None = None  # a pool planned beforehand (batch-synchronous replays)
    predict_all: bool | None = None  # predictor.predict for this request: all (True) or waiting
    # The engine answers exactly this many tokens, and the router is not told: a replay of known
    # lengths (what one of the model's samples for the prompt really had) whose requests are ranked,
    # scored and learned from as the client's own, as if the model had chosen that length. Two
    # policies then meet the same workload: unseeded answers of one trace differ by 20% in tokens.
    fixed_tokens: int | None = None
    budget: Mode | None = None  # predictor.budget for this request (X-Predictor-Budget)


@dataclass
class Served:
    """A request on its way back: its record, and the replica's answer."""

    request: Request
    answer: Answer


def _max_tokens(body) -> int | None:
    return getattr(body, "max_completion_tokens", None) or body.max_tokens


def _hint_tokens(body) -> int | None:
    """The client's own word on its length (`metadata.expected_output_tokens`, router.api.protocol)."""
    metadata = getattr(body, "metadata", None)
    return None if metadata is None else metadata.expected_output_tokens


def _fix_length(body, tokens: int) -> None:
    """The engine's side of X-Fixed-Output-Tokens (Overrides.fixed_tokens), as vLLM's min_tokens."""
    body.min_tokens = tokens
    body.max_tokens = tokens
    if getattr(body, "max_completion_tokens", None) is not None:
        body.max_completion_tokens = tokens


class Pipeline:
    def __init__(self, config: StackConfig, plan: RoutingPlan, pools: dict[str, DeploymentHandle],
                 predictor: DeploymentHandle | None, learner: DeploymentHandle | None = None):
        from transformers import AutoTokenizer

        self.config, self.plan = config, plan
        router = config.router
        self.policy = router.policy
        # Benchmark headers let any request pick any policy: all are built once, each with its own state.
        self.scheduler = build_scheduler(config, plan, POLICIES if router.benchmark_headers else [router.policy])
        self.gate = Gate(self.scheduler)
        self.pools = {name: PoolClient(name, handle, ledger(name)) for name, handle in pools.items()}
        self.tokenizer = AutoTokenizer.from_pretrained(plan.model_path)
        # Rendering a 1 MB prompt or a slow template must not stop the event loop that relays
        # every stream; a runaway render holds one of these threads, never the loop.
        self._render_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="render")
        spec = config.predictor
        self.predictor = PredictorClient(
            predictor, plan.predictor_name, spec.timeout_s if spec else 0, spec.max_prompt_tokens if spec else 0,
            plan.heads, plan.pools, spec.concurrency() if spec else 0,
        )
        self._predict_all = spec is not None and spec.predict == "all"
        # Each source is scored and trusted on its own: every head, the clients' hints, the history.
        # A cold start's learned head earns trust like a distrusted one: on shadow predictions.
        cold = spec is not None and spec.cold
        self.quality = {name: LiveQuality(**router.live_quality.model_dump(), trusted=not (cold and i == 0))
                        for i, name in enumerate([*plan.heads, *SCORED])}
        for name, quality in self.quality.items():
            self.scheduler.trust(name, quality.trusted)
        self.labels = LabelSender(learner) if learner is not None else None
        # Beside a request dispatched at once, a prediction only for its features and its live
        # score: every one while the head is distrusted and nothing learns, else a share.
        self._beside_share = spec.online.dispatched_share if spec is not None and spec.online else 1.0
        self._rng = random.Random()
        self.pending = 0  # requests held before they reach a pool
        self.metrics = RoutingMetrics(self.policy)
        self.queue_metrics = QueueMetrics()
        self.quality_metrics = QualityMetrics()
        self.budget_metrics = BudgetMetrics()
        self._prefill_probe: asyncio.Task | None = None
        self.request_log = RequestLog(router.request_log) if router.request_log else None
        history = router.history
        self.history = LengthHistory(REPO_ROOT / history.path, config.model.id, history.max_prompts,
                                     history.lengths_per_prompt, history.flush_interval_s) if history.path else None
        continuations = Continuations.from_env()  # one key: a partial sample continues on any pool
        self.rollouts = {
            pool.name: RolloutRunner(self.pools[pool.name], self.gate, self.predictor, self.render,
                                     router.limits.max_rollout_samples, pool.deployment.get("max_ongoing_requests"),
                                     continuations, self.history, self.learn)
            for pool in config.pools
        }

    # -- stages -------------------------------------------------------------------------------

    def new_request(self, body, overrides: Overrides, client_id: str | None = None) -> Request:
        cap = _max_tokens(body)
        if overrides.fixed_tokens is not None and cap is not None and overrides.fixed_tokens > cap:
            raise APIError(400, f"X-Fixed-Output-Tokens ({overrides.fixed_tokens}) is over the request's max_tokens "
                           f"({cap}).", param="max_tokens")
        return Request(
            id=f"lengthserve-{uuid.uuid4().hex}", policy=overrides.policy or self.policy, arrival=time.time(),
            client_id=client_id,
            max_tokens=cap, min_tokens=getattr(body, "min_tokens", 0) or 0,
            ignore_eos=bool(getattr(body, "ignore_eos", False)), told_tokens=overrides.told_tokens,
            target_pool=overrides.pool, hint_tokens=_hint_tokens(body),
        )

    async def render(self, request: Request, body, kind: str) -> tuple[list[int] | None, str]:
        """The ids of the request's longest prompt (what its work is ranked by), or None and why
        it cannot be read (the engine stays the judge of whether it is valid); 400 past the time
        limit."""
        limit = self.config.router.render_timeout_s
        loop = asyncio.get_running_loop()
        try:
            render = loop.run_in_executor(self._render_pool, prompt_ids, self.tokenizer, body, kind)
            ids = await asyncio.wait_for(render, limit)
        except UnsupportedPrompt as e:
            request.prediction_failure = "unsupported_prompt"
            return None, str(e)
        except TimeoutError:
            raise APIError(400, f"Rendering the prompt took longer than {limit} s.", param="messages") from None
        request.prompt_tokens = max(len(i) for i in ids)
        request.outputs = (getattr(body, "n", None) or 1) * len(ids)
        if self.history is not None and len(ids) == 1:  # a prompt seen before has its own past lengths
            request.prompt_key = self.history.key(ids[0])
            request.history = self.history.lookup(request.prompt_key)
        return max(ids, key=len), ""

    async def predict(self, request: Request, ids: list[int] | None, beside: bool = False) -> Outcome:
        """The prediction of the head the request's policy reads; it lands on the record (and
        re-ranks the request if it waits). `beside`: nobody waits on it, so it is not bounded by
        `predictor.timeout_s` (which bounds the wait of a pool policy's request) but by the
        request's own life: a waiting request's prediction is worth having whenever it lands
        before the request leaves the queue (it is cancelled then). Beside a request that is not
        waiting it is made only if a predictor slot is free now."""
        if ids is None:
            return Outcome(None, request.prediction_failure)
        request.sent_to_predictor = True
        outcome = await self.predictor.predict(
            ids, request.max_tokens, head_of(request.policy), wait=not beside or request.queued,
            timeout_s=self.config.router.request_timeout_s if beside else None, request_id=request.id)
        if outcome.prediction is None:
            request.prediction_failure = request.prediction_failure or outcome.failure
            return outcome
        self.metrics.predictor_latency(self.predictor.name, outcome.latency_s)
        self.scheduler.budget.prefill.observe(outcome.prefill_s, outcome.prefill_tokens)
        self.scheduler.landed(request, outcome.prediction, time.time())
        return outcome

    def probe_prefill(self) -> None:
        """Until the budget knows what a prefill costs, ask the predictor what it measured at its
        start (in the background), so that the first burst is priced before any prediction of it
        lands. Readiness probes and the first request call it."""
        if (self.config.predictor is not None and self.scheduler.budget.prefill.per_token is None
                and (self._prefill_probe is None or self._prefill_probe.done())):
            self._prefill_probe = asyncio.get_running_loop().create_task(self._measured_prefill())

    async def _measured_prefill(self) -> None:
        while (measured := await self.predictor.measured_prefill()) is None:
            await asyncio.sleep(PREFILL_PROBE_S)
        self.scheduler.budget.prefill.observe(*measured)

    def _worth_predicting(self, request: Request, mode: Mode | None) -> bool:
        """The predictor budget's verdict on a waiting request, kept on its record and counted."""
        quality = self.quality.get(head_of(request.policy))
        concordance = quality.concordance() if quality is not None and quality.settled else None
        request.budget = self.scheduler.worth_predicting(request, concordance, mode)
        self.budget_metrics.decided(request.budget.verdict)
        return request.budget.verdict == "predicted"

    def decide(self, request: Request, detail: str = "", spill: bool = True) -> None:
        self.scheduler.decide(request, spill)
        request.decided_at = time.time()
        if request.fallback is not None:
            self.metrics.fallback(request.fallback, detail or request.fallback)

    def admit(self, request: Request) -> None:
        try:
            self.gate.offer(request)
        except QueueFull as e:
            self.queue_metrics.rejected(e.pool)
            raise APIError(429, f"The {e.pool} pool's queue is full; retry in {e.retry_after_s} s.",
                           code="queue_full", headers={"Retry-After": str(e.retry_after_s)}) from None
        self.queue_metrics.waiting(request.pool, len(self.scheduler.queues[request.pool]))

    async def wait(self, request: Request) -> None:
        """Until the request holds a slot; a request that waits past the timeout gets 503."""
        pool = request.pool
        try:
            await self.gate.wait(request, self.config.router.request_timeout_s)
        except TimeoutError:
            raise APIError(503, "No replica became free in time; retry later.", code="queue_timeout",
                           headers={"Retry-After": str(self.gate.retry_after_s(pool))}) from None
        queue = self.scheduler.queues[pool]
        self.queue_metrics.waited(pool, request.dispatched_at - request.decided_at if request.queued else 0.0)
        self.queue_metrics.reordered(pool, queue.stats.reordered)
        self.queue_metrics.waiting(pool, len(queue))

    async def dispatch(self, request: Request, body, kind: str) -> Answer:
        """To the pool's replicas; whatever happens, the request completes exactly once."""
        request.priority = self.scheduler.priority(request, self.config.model.max_model_len)
        if self.config.router.shortest_first:
            body.priority = request.priority
        if body.stream:  # the router reads every stream's length from its usage chunk
            options = body.stream_options
            body.stream_options = StreamOptions(include_usage=True, continuous_usage_stats=bool(
                options and options.continuous_usage_stats))
        done = once(self._complete)
        self.metrics.routed(request.pool, spilled=request.spilled_from is not None)
        self.metrics.inflight(request.pool, self.scheduler.inflight(request.pool))
        try:
            async with asyncio.timeout(self.config.router.request_timeout_s):
                return await self.pools[request.pool].open(request, kind, body, done)
        except TimeoutError:
            request.error = "timeout"
            done(request)
            raise APIError(408, "The request timed out before the model answered.") from None
        except BaseException as e:
            request.error = request.error or type(e).__name__
            done(request)
            raise

    def _complete(self, request: Request) -> None:
        """The slot goes to the next waiting request, the prediction is scored, the record logged."""
        request.finished_at = request.finished_at or time.time()
        self.gate.leave(request)
        self.scheduler.budget.served(request)
        self.metrics.inflight(request.pool, self.scheduler.inflight(request.pool))
        self.queue_metrics.waiting(request.pool, len(self.scheduler.queues[request.pool]))
        self._score(request)
        self.learn(request)
        if self.request_log is not None:
            self.request_log.write(request)

    def learn(self, request: Request) -> None:
        """A finished request's length (`Request.natural_length`: censored where its cap, a budget or
        a first-k cut stopped it) to the learner and to its prompt's history. A partial rollout
        sample's goes to the history when its continuation ends, whole and once."""
        label = request.natural_length()
        if label is None:
            return
        # Only a request the predictor saw has features to join: other labels would wait for
        # features that never come.
        if self.labels is not None and request.sent_to_predictor:
            self.labels.add(request.id, *label)
        if self.history is not None and request.prompt_key is not None and ended_as(request) != "partial":
            self.history.record(request.prompt_key, *label)

    def _score(self, request: Request) -> None:
        """Every signal the request had against its real length, each in its source's live quality."""
        actual = request.completion_tokens
        if request.outputs != 1 or actual is None or request.error:
            return
        if request.prediction is not None:
            self.metrics.completed(request.pool, self.predictor.name, request.prediction.expected_tokens, actual)
        for name, signal in self.scheduler.signals.scored(request):
            quality = self.quality.get(name)
            if quality is None:
                continue
            if quality.observe(signal.expected_tokens, actual, signal.pool == self.plan.pools.pool_of(actual)):
                self.scheduler.trust(name, quality.trusted)
                state = "trusted again" if quality.trusted else "below its floor: no longer ranks or routes"
                log.warning("live quality of %s %s: %s", name, state, quality.report())
            self.quality_metrics.update(name, quality.report())

    # -- the whole way --------------------------------------------------------------------------

    async def serve(self, body, kind: str, overrides: Overrides, client_id: str | None = None) -> Served:
        if self.pending >= self.config.router.max_pending_requests:
            raise APIError(503, "The router is at its limit of requests waiting for a pool; retry later.",
                           code="router_overloaded", headers={"Retry-After": "2"})
        self.pending += 1
        self.probe_prefill()
        try:
            return await self._serve(self.new_request(body, overrides, client_id), body, kind, overrides)
        finally:
            self.pending -= 1

    async def _serve(self, request: Request, body, kind: str, overrides: Overrides) -> Served:
        ids, detail = await self.render(request, body, kind)
        policy, trusted = POLICIES[request.policy], self.scheduler.trusts(request.policy)
        if policy.predicts_pool and trusted and self.scheduler.estimate(request) is None:  # no cheaper signal
            detail = (await self.predict(request, ids)).detail or detail
        self.decide(request, detail)
        self.admit(request)
        # Beside the request: a work policy's rank while it waits; with `predict: all`, every
        # request; while live quality keeps the router length-blind, shadow predictions that can
        # win trust back. A request that is not waiting never queues for the predictor.
        predict_all = self._predict_all if overrides.predict_all is None else overrides.predict_all
        sampled = (not trusted or self.labels is not None) and self._rng.random() < self._beside_share
        beside = None
        if policy.head is not None and request.prediction is None and ids is not None:
            ranks = request.queued and policy.family == "work" and trusted and self._worth_predicting(
                request, overrides.budget)
            if ranks or predict_all or sampled:
                beside = asyncio.create_task(self.predict(request, ids, beside=True))
        try:
            await self.wait(request)
        except BaseException:
            if beside is not None:
                beside.cancel()
            raise
        if beside is not None and not (predict_all or sampled):
            beside.cancel()  # dispatched before its prediction landed: no longer needed
        if overrides.fixed_tokens is not None:
            _fix_length(body, overrides.fixed_tokens)
        return Served(request, await self.dispatch(request, body, kind))

    async def length(self, body, kind: str, overrides: Overrides) -> Request:
        """Only the length (for external schedulers), on `estimate`: the cheapest trusted signal, as
        a request would be ranked, predicted only where no cheaper one is there (and answered even
        from a distrusted head: the client asked for it). With a benchmark's policy, also the pool
        that policy picks now (no spillover: a plan made before anything is sent)."""
        request = self.new_request(body, overrides)
        ids, detail = await self.render(request, body, kind)
        if self.scheduler.estimate(request) is None:
            outcome = await self.predict(request, ids)
            if request.prediction is None:
                failure = outcome.failure or "no_prediction"
                raise APIError(503, f"No length prediction ({failure}): {outcome.detail or detail}", code=failure)
        if overrides.policy is not None:
            self.decide(request, spill=False)
        request.estimate = self.scheduler.estimate(request) or request.prediction
        return request

    async def rollout(self, req: RolloutRequest, pool: str | None = None) -> dict:
        """A rollout on `pool`, by default the pool with the most slots."""
        name = pool or max(self.pools, key=lambda p: self.scheduler.queues[p].slots or 0)
        return await self.rollouts[name].run(req)

    def status(self) -> dict:
        """This router replica's view of its pools, queues, replicas and predictions."""
        now = time.time()
        return {
            "pools": list(self.pools), "policy": self.policy, "predictor": self.predictor.name,
            "output_edges": list(self.plan.pools.edges),
            "inflight": {name: self.scheduler.inflight(name) for name in self.pools},
            "queues": {name: _queue_report(q, now) for name, q in self.scheduler.queues.items()},
            "replicas": {name: {load.replica: {"requests": load.requests,
                                               "predicted_remaining_tokens": round(load.remaining_tokens, 1)}
                                for load in client.ledger.loads()} for name, client in self.pools.items()},
            "predictor_waiting": self.predictor.waiting,
            "live_quality": {name: q.report() for name, q in self.quality.items()},
            "predictor_budget": {**self.scheduler.budget.report(), "decisions": self.budget_metrics.counts},
            "history": None if self.history is None else self.history.status(),
        }

    async def engine_requests(self) -> dict[str, dict[str, int | None]]:
        """Per pool and replica, the requests its vLLM engine holds now (not the router's view)."""
        counts = await asyncio.gather(*(client.engine_requests() for client in self.pools.values()))
        return dict(zip(self.pools, counts))

    def close(self) -> None:
        """The replica shuts down: the history's last lengths go to its file."""
        if self.history is not None:
            self.history.close()


class LabelSender:
    """Finished requests' lengths to the learner, a few at a time and never on a request's path."""

    BATCH, EVERY_S = 32, 2.0

    def __init__(self, learner: DeploymentHandle):
        self._learner = learner
        self._rows: list[tuple[str, int, bool]] = []
        self._flusher: asyncio.Task | None = None

    def add(self, request_id: str, tokens: int, censored: bool) -> None:
        self._rows.append((request_id, tokens, censored))
        if len(self._rows) >= self.BATCH:
            self.flush()
        elif self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.EVERY_S)
        self.flush()

    def flush(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            self._learner.labels.remote(rows)  # fire and forget: a slow learner never holds a request

    async def status(self, timeout_s: float = 2.0) -> dict | None:
        try:
            async with asyncio.timeout(timeout_s):
                return await self._learner.status.remote()
        except Exception:  # a learner that does not answer: /health says so rather than waiting
            return None


def _queue_report(queue, now: float) -> dict:
    return {"waiting": len(queue), "waiting_ranked": queue.ranked(), "slots": queue.slots,
            "max_waiting": queue.max_waiting, "oldest_wait_s": round(queue.oldest_wait_s(now), 3), **vars(queue.stats)}
