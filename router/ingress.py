"""The HTTP front door: an OpenAI-compatible API that validates, decides, admits, and relays.

It is the application's ingress deployment; the predictor and the vLLM pools sit behind
DeploymentHandles. Per request, in this order:
0. the API key (router.auth), and a cap on requests the router holds before they reach a pool
   (beyond it 503 with Retry-After, so a flood never queues without bound in front of the router);
1. parse and validate the body (FastAPI's typed body, router.validation) and render the token ids
   the engine will see (router.prompt_ids), off the event loop and with a time limit;
2. decide (router.decision): the pool, spillover, and what the request ranks by while it waits.
   Pool policies (estp, egtp) need the prediction to pick a pool, so they wait for it here;
   work policies (estp_work, ...) never do;
3. admit (router.waiting): dispatch at once while the pool has a free slot, else wait in its
   shortest-first queue with aging, or get 429 with Retry-After when that queue is full. A work
   policy's prediction runs while its request waits and re-ranks it when it lands; with
   `predictor.predict: all` requests dispatched at once are predicted too, off their path;
4. relay to the pool's vLLM replicas (router.forwarding), JSON or SSE;
5. when the pool is done: the slot goes to the next waiting request, the prediction is scored
   against the real length (router.live_quality), which may switch the router length-blind.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException
from vllm.entrypoints.generate.base.protocol import StreamOptions
from vllm.exceptions import VLLMValidationError

from predictor.head import LengthBins
from router.admission import QueueOrder
from router.auth import Keys
from router.decision import Decider, Decision
from router.errors import APIError
from router.forwarding import ReplicaFailed, forward
from router.length_bins import PoolBins
from router.live_quality import LiveQuality
from router.policies import POLICIES, PREDICTED, WORK, Job, PolicyContext, head_of
from router.pool_load import PoolLoad
from router.predictor_client import Outcome, PredictorClient
from router.prompt_ids import UnsupportedPrompt, prompt_ids
from router.replica_ledger import ledger
from router.rollout import RolloutRequest, RolloutRunner
from router.routing import BenchmarkOverrides, Route, benchmark_overrides
from router.telemetry import QualityMetrics, QueueMetrics, RoutingMetrics
from router.validation import (BodyLimit, ChatBody, CompletionBody, check_request, parse_request, request_kind,
                               validation_error)
from router.waiting import PoolGate, QueueFull, Ticket

log = logging.getLogger("ray.serve")
# A replica that dies before answering: the request is retried on the pool this many times in all.
REPLICA_ATTEMPTS, REPLICA_RETRY_S = 3, 1.0
api = FastAPI(title="lengthserve", description="Length-aware OpenAI-compatible LLM serving")


@api.exception_handler(APIError)
async def _api_error(_: Request, exc: APIError):
    return exc.response()


@api.exception_handler(RequestValidationError)
@api.exception_handler(VLLMValidationError)
async def _invalid_body(_: Request, exc):
    return validation_error(exc).response()


_UNPARSEABLE = {UnicodeDecodeError: "Request body is not valid UTF-8.", RecursionError: "Request body is nested too deeply."}


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException):
    cause = type(exc.__cause__)  # FastAPI's 400 "error parsing the body" hides why
    return APIError(exc.status_code, _UNPARSEABLE.get(cause, str(exc.detail))).response()


@api.exception_handler(Exception)
async def _unexpected(_: Request, exc: Exception):
    log.exception("unhandled error in the router")
    return APIError(500, f"Internal error: {type(exc).__name__}.").response()


def _max_tokens(body) -> int | None:
    return getattr(body, "max_completion_tokens", None) or body.max_tokens


@dataclass
class _InFlight:
    """One request on its way through the router: what is known of it, as it becomes known."""

    ticket: Ticket
    job: Job
    decision: Decision
    head: str | None  # the head the asked-for policy reads (also while live quality overrules it)
    predicted_ids: list[int] | None  # the prompt the predictor reads (the longest of a batch)
    outcome: Outcome | None = None  # the prediction, once asked
    late: asyncio.Task | None = None  # a work policy's prediction running beside the request
    queued_s: float = 0.0
    routing_ms: float = 0.0
    finished: bool = False  # answered or failed: a late prediction must not re-enter the ledger


@serve.deployment
@serve.ingress(api)
class Router:
    def __init__(
        self, pools: dict[str, DeploymentHandle], predictor: DeploymentHandle | None, config: dict, routing: dict
    ):
        from transformers import AutoTokenizer

        self._model = config["model"]
        self._limits = config["router"]
        self._keys = Keys.from_env()
        if self._limits["benchmark_headers"] and not self._keys.benchmark:
            raise RuntimeError("router.benchmark_headers: true needs a benchmark key: set LENGTHSERVE_BENCHMARK_KEYS "
                               "(or LENGTHSERVE_BENCHMARK_KEY_FILE) in the environment `serve run` starts from")
        api.add_middleware(BodyLimit, max_bytes=self._limits["max_body_bytes"])
        # Rendering a 1 MB prompt or a slow template must not stop the event loop that relays
        # every stream; a runaway render holds one of these threads, never the loop.
        self._render_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="render")
        self._pending = 0  # requests this router holds before they reach a pool
        # Handles configured once: each .options() call creates a new handle with its own state.
        self._pools = {name: h.options(stream=True) for name, h in pools.items()}
        self._tokenizer = AutoTokenizer.from_pretrained(routing["model_path"])
        self._vocab_size = len(self._tokenizer)
        self._bins = PoolBins(**routing["output_bins"])
        order = QueueOrder(**routing["queue_order"])
        self._load = PoolLoad(list(self._pools), routing["capacities"], self._limits["queue"]["max_waiting_per_slot"],
                              order)
        self._gates = {name: PoolGate(queue) for name, queue in self._load.queues.items()}
        self._ledgers = {name: ledger(name) for name in self._pools}
        ctx = PolicyContext(
            pools=list(self._pools), output_bins=self._bins, input_edges=self._limits["input_edges"] or [],
            replicas=routing["replicas"], load=self._load,
        )
        self._policy_name, self._fallback_name = self._limits["policy"], self._limits["fallback_policy"]
        # Benchmark headers let any request pick any policy: all are built once, each with its own state.
        self._benchmark = self._limits["benchmark_headers"]
        self._decider = Decider(
            ctx, POLICIES if self._benchmark else [self._policy_name], self._fallback_name,
            self._limits["spillover"], self._limits["shortest_first"], self._limits["rank_by"], order.prior_tokens,
        )
        spec = config["predictor"] or {}
        heads = {name: LengthBins(**bins) for name, bins in routing["head_bins"].items()}
        self._predictor = PredictorClient(
            predictor, routing["predictor_name"], spec.get("timeout_s", 0), spec.get("max_prompt_tokens", 0),
            heads, self._bins, routing["predictor_concurrency"],
        )
        self._predict_all = spec.get("predict") == "all"
        self._quality = {head: LiveQuality(**self._limits["live_quality"]) for head in heads}
        self._rollouts = {
            name: RolloutRunner(name, self._pools[name], self._gates[name], self._ledgers[name], self._predictor,
                                self._render, self._limits["limits"]["max_rollout_samples"],
                                routing["per_replica"].get(name))
            for name in self._pools
        }
        self._metrics = RoutingMetrics(self._policy_name)
        self._queue_metrics = QueueMetrics()
        self._quality_metrics = QualityMetrics()
        self._created = int(time.time())
        self._metrics_port: int | None = None

    @api.get("/health")
    async def health(self, request: Request) -> dict:
        if self._limits["auth"]["protect_health"]:
            self._keys.check(request.headers)
        return {
            "status": "ok", "model": self._model["id"], "pools": list(self._pools),
            "policy": self._policy_name, "predictor": self._predictor.name, "output_edges": list(self._bins.edges),
            # this router replica's view
            "inflight": {pool: self._load.inflight(pool) for pool in self._pools},
            "queues": {pool: self._queue_report(pool) for pool in self._pools},
            "replicas": {pool: self._ledgers[pool].snapshot() for pool in self._pools},
            "predictor_waiting": self._predictor.waiting,
            "live_quality": {head: q.report() for head, q in self._quality.items()},
            "metrics_port": self._node_metrics_port(),
        }

    def _queue_report(self, pool: str) -> dict:
        q = self._load.queues[pool]
        return {"waiting": len(q), "waiting_ranked": q.ranked(), "slots": q.slots, "max_waiting": q.max_waiting,
                "oldest_wait_s": round(q.oldest_wait_s(time.monotonic()), 3), **vars(q.stats)}

    def _node_metrics_port(self) -> int | None:
        """The Prometheus port of this node's Ray metrics agent, where the router's metrics are."""
        if self._metrics_port is None:
            import ray

            node = ray.get_runtime_context().get_node_id()
            self._metrics_port = next((n.get("MetricsExportPort") for n in ray.nodes() if n["NodeID"] == node), None)
        return self._metrics_port

    def _card(self) -> dict:
        return {"id": self._model["id"], "object": "model", "created": self._created, "owned_by": "lengthserve",
                "max_model_len": self._model["max_model_len"]}

    @api.get("/v1/models")
    async def models(self, request: Request) -> dict:
        self._keys.check(request.headers)
        return {"object": "list", "data": [self._card()]}

    @api.get("/v1/models/{model_id:path}")
    async def model(self, model_id: str, request: Request) -> dict:
        self._keys.check(request.headers)
        if model_id != self._model["id"]:
            raise APIError(404, f"The model '{model_id}' does not exist; this server serves '{self._model['id']}'.",
                           param="model", code="model_not_found")
        return self._card()

    @api.post("/v1/chat/completions")
    async def chat(self, body: ChatBody, request: Request):
        return await self._serve(request, body, "chat")

    @api.post("/v1/completions")
    async def completions(self, body: CompletionBody, request: Request):
        return await self._serve(request, body, "completions")

    @api.post("/v1/rollout")
    async def rollout_http(self, body: RolloutRequest, request: Request) -> dict:
        """The rollout endpoint (router.rollout): every sample of a batch, with its length and timing."""
        self._keys.check(request.headers)
        if body.known_tokens is not None:  # told lengths steer the schedule, as the oracle header does
            if not self._benchmark:
                raise APIError(400, "known_tokens: benchmark headers are off (router.benchmark_headers: false).",
                               param="known_tokens")
            self._keys.check_benchmark(request.headers)
        return await self.rollout(body)

    async def rollout(self, request: RolloutRequest | dict, pool: str | None = None) -> dict:
        """The Python API on Ray: `serve.get_app_handle("lengthserve").rollout.remote({...}).result()`."""
        req = request if isinstance(request, RolloutRequest) else RolloutRequest.model_validate(request)
        if req.model != self._model["id"]:
            raise APIError(404, f"The model '{req.model}' does not exist; this server serves '{self._model['id']}'.",
                           param="model", code="model_not_found")
        if req.max_tokens > self._model["max_model_len"]:
            raise APIError(400, f"'max_tokens' = {req.max_tokens} exceeds the model's context.", param="max_tokens")
        runner = self._rollouts[pool or max(self._pools, key=lambda p: self._load.queues[p].slots or 0)]
        return await runner.run(req)

    def _checked(self, request: Request, body, kind: str) -> None:
        self._keys.check(request.headers)
        check_request(body, kind, self._model["id"], self._model["max_model_len"], self._limits["limits"],
                      self._vocab_size)

    @api.post("/v1/length")
    async def length(self, request: Request):
        """Only the prediction, for external schedulers: a chat or a completions body."""
        self._keys.check(request.headers)
        raw = await request.body()
        kind = request_kind(raw)
        body = parse_request(raw, kind)
        self._checked(request, body, kind)
        bench = self._overrides(request)
        policy = bench.policy or self._policy_name
        ids, failure = await self._render(body, kind)
        job = self._job(body, ids, bench)
        outcome = await self._predict(ids, failure, body, head_of(policy))
        if outcome.prediction is None:
            raise APIError(503, f"No length prediction ({outcome.failure}): {outcome.detail}", code=outcome.failure)
        answer = {
            "object": "length_prediction", "model": self._model["id"], "predictor": self._predictor.name,
            "prompt_tokens": job.prompt_tokens, **outcome.prediction,
        }
        if bench.policy is not None:  # a benchmark planning its groups: the pool this policy picks now
            decision = self._decide(replace(job, prediction=outcome.prediction), outcome, policy, spill=False)
            answer["routing"] = {"pool": decision.pool, "policy": decision.policy, "fallback": decision.fallback,
                                 "rank_tokens": decision.rank_tokens}
        return answer

    def _overrides(self, request: Request) -> BenchmarkOverrides:
        return benchmark_overrides(request.headers, self._benchmark, self._decider.chain.policies, self._pools,
                                   self._keys)

    async def _render(self, body, kind: str) -> tuple[list[list[int]] | None, str]:
        """The token ids of every prompt, or None and why they cannot be read; 400 past the time limit."""
        loop = asyncio.get_running_loop()
        limit = self._limits["render_timeout_s"]
        try:
            render = loop.run_in_executor(self._render_pool, prompt_ids, self._tokenizer, body, kind)
            return await asyncio.wait_for(render, limit), ""
        except UnsupportedPrompt as e:
            return None, str(e)
        except TimeoutError:
            raise APIError(400, f"Rendering the prompt took longer than {limit} s.", param="messages") from None

    @staticmethod
    def _job(body, ids: list[list[int]] | None, bench: BenchmarkOverrides) -> Job:
        return Job(
            prompt_tokens=None if ids is None else max(len(i) for i in ids), true_tokens=bench.true_tokens,
            max_tokens=_max_tokens(body), min_tokens=getattr(body, "min_tokens", 0) or 0,
            ignore_eos=bool(getattr(body, "ignore_eos", False)), outputs=(body.n or 1) * (len(ids) if ids else 1),
        )

    async def _predict(self, ids: list[list[int]] | None, failure: str, body, head: str | None) -> Outcome:
        """The prediction for the request's longest prompt (the one its work is ranked by)."""
        if ids is None:
            return Outcome(None, "unsupported_prompt", failure)
        outcome = await self._predictor.predict(max(ids, key=len), _max_tokens(body), head)
        if outcome.prediction is not None:
            self._metrics.predictor_latency(self._predictor.name, outcome.latency_s)
        return outcome

    def _trusted(self, policy: str) -> bool:
        head = head_of(policy)
        return head is None or head not in self._quality or self._quality[head].trusted

    def _decide(self, job: Job, outcome: Outcome | None, policy: str, spill: bool = True) -> Decision:
        """The decision; a fallback (the predictor failed, or live quality is below its floor) is
        counted and logged."""
        if not self._trusted(policy):
            decision = self._decider.decide(job, self._fallback_name, spill)
            decision = replace(decision, fallback="low_live_quality")
        else:
            decision = self._decider.decide(job, policy, spill)
        if decision.fallback is not None:
            detail = outcome.detail if outcome is not None and outcome.detail else decision.fallback
            self._metrics.fallback(decision.fallback, detail)
        return decision

    async def _serve(self, request: Request, body, kind: str):
        self._checked(request, body, kind)
        if self._pending >= self._limits["max_pending_requests"]:
            raise APIError(503, "The router is at its limit of requests waiting for a pool; retry later.",
                           code="router_overloaded", headers={"Retry-After": "2"})
        self._pending += 1
        try:
            return await self._admit_and_relay(request, body, kind)
        finally:
            self._pending -= 1

    async def _admit_and_relay(self, request: Request, body, kind: str):
        start = time.perf_counter()
        bench = self._overrides(request)
        policy = bench.policy or self._policy_name
        ids, failure = await self._render(body, kind)
        job = self._job(body, ids, bench)
        outcome, trusted = None, self._trusted(policy)
        if policy in PREDICTED - WORK and trusted:  # a pool policy needs its prediction first
            outcome = await self._predict(ids, failure, body, head_of(policy))
            job = replace(job, prediction=outcome.prediction, prediction_failure=outcome.failure)
        if bench.pool is not None:  # planned by the benchmark (batch mode): no decision, no spillover
            decision = Decision(bench.pool, bench.pool, policy, None, *self._decider.ranking(job, policy))
        else:
            decision = self._decide(job, outcome, policy)
        ticket = Ticket(f"lengthserve-{uuid.uuid4().hex}")
        body.request_id = ticket.request_id  # what the replica router's ledger knows it by
        flight = _InFlight(ticket, job, decision, head_of(policy), None if ids is None else max(ids, key=len),
                           outcome, routing_ms=(time.perf_counter() - start) * 1000)
        if outcome is not None and outcome.distribution is not None:
            self._ledgers[decision.pool].predicted(ticket.request_id, outcome.distribution, job.max_tokens)
        gate = self._gates[decision.pool]
        try:
            gate.offer(ticket, decision.rank_tokens, on_prior=decision.on_prior)
        except QueueFull as e:
            self._queue_metrics.rejected(decision.pool)
            raise APIError(429, f"The {decision.pool} pool's queue is full; retry in {e.retry_after_s} s.",
                           code="queue_full", headers={"Retry-After": str(e.retry_after_s)}) from None
        self._queue_metrics.waiting(decision.pool, len(gate.queue))
        # Beside the request: a work policy's rank while it waits; with `predict: all`, every request;
        # while live quality keeps the router length-blind, shadow predictions that can win trust back.
        predict_all = self._predict_all if bench.predict_all is None else bench.predict_all
        if flight.head is not None and outcome is None and flight.predicted_ids is not None:
            if (ticket.queued and decision.policy in WORK) or predict_all or not trusted:
                flight.late = asyncio.create_task(self._predict_beside(flight, gate, body))
        try:
            await self._admitted(flight, gate)
        except BaseException:
            if flight.late is not None:
                flight.late.cancel()
            self._ledgers[decision.pool].drop(ticket.request_id)
            raise
        if flight.late is not None and not (predict_all or not trusted):
            flight.late.cancel()  # dispatched before its prediction landed: no longer needed
        return await self._relay(flight, gate, body, kind)

    async def _admitted(self, flight: _InFlight, gate: PoolGate) -> None:
        """Until the request holds a slot; a request that waits past the timeout gets 503."""
        if not flight.ticket.queued:
            self._queue_metrics.waited(flight.decision.pool, 0.0)
            return
        waited = time.monotonic()
        try:
            await gate.wait(flight.ticket, self._limits["request_timeout_s"])
        except TimeoutError:
            raise APIError(503, "No replica became free in time; retry later.", code="queue_timeout",
                           headers={"Retry-After": str(gate.retry_after_s())}) from None
        flight.queued_s = time.monotonic() - waited
        pool = flight.decision.pool
        self._queue_metrics.waited(pool, flight.queued_s)
        self._queue_metrics.reordered(pool, gate.queue.stats.reordered)
        self._queue_metrics.waiting(pool, len(gate.queue))

    async def _predict_beside(self, flight: _InFlight, gate: PoolGate, body) -> None:
        """A prediction beside the request: re-ranks it if it still waits, updates the replica's work
        estimate if it was dispatched meanwhile, is scored when it completes; never delays it. A
        request that is not waiting does not queue for the predictor: no free slot, no prediction."""
        outcome = await self._predictor.predict(flight.predicted_ids, _max_tokens(body), flight.head,
                                                wait=flight.ticket.queued)
        flight.outcome = outcome
        if outcome.prediction is None:
            return
        self._metrics.predictor_latency(self._predictor.name, outcome.latency_s)
        flight.job = replace(flight.job, prediction=outcome.prediction)
        gate.rerank(flight.ticket, self._decider.rank(flight.job, flight.decision.policy))
        if not flight.finished:
            self._ledgers[flight.decision.pool].predicted(flight.ticket.request_id, outcome.distribution,
                                                          flight.job.max_tokens)

    async def _relay(self, flight: _InFlight, gate: PoolGate, body, kind: str):
        decision = flight.decision
        prediction = flight.outcome.prediction if flight.outcome is not None else None
        route = Route(
            pool=decision.pool, policy=decision.policy, prompt_tokens=flight.job.prompt_tokens, prediction=prediction,
            priority=self._decider.engine_priority(replace(decision, rank_tokens=self._decider.rank(
                flight.job, decision.policy)), self._model["max_model_len"]),
            spilled_from=decision.spilled_from, fallback=decision.fallback, routing_ms=flight.routing_ms,
            queued_ms=flight.queued_s * 1000,
        )
        if self._limits["shortest_first"]:
            body.priority = route.priority
        client_wants_usage = bool(body.stream_options and body.stream_options.include_usage)
        if body.stream and not client_wants_usage:
            body.stream_options = StreamOptions(include_usage=True, **(
                {"continuous_usage_stats": body.stream_options.continuous_usage_stats} if body.stream_options else {}
            ))
        done = self._tracker(flight, gate, compare=flight.job.outputs == 1)
        ledger_of_pool = self._ledgers[decision.pool]
        try:
            async with asyncio.timeout(self._limits["request_timeout_s"]):
                for attempt in range(REPLICA_ATTEMPTS):
                    try:
                        return await forward(
                            self._pools[decision.pool], kind, body, route.headers(), route.extension(),
                            client_wants_usage, done, lambda: ledger_of_pool.streamed(flight.ticket.request_id),
                        )
                    except ReplicaFailed:  # nothing reached the client: another replica may serve it
                        if attempt == REPLICA_ATTEMPTS - 1:
                            raise
                        await asyncio.sleep(REPLICA_RETRY_S * 2**attempt)  # Ray drops the dead one meanwhile
        except TimeoutError:
            done(None)
            raise APIError(408, "The request timed out before the model answered.") from None
        except BaseException:
            done(None)
            raise

    def _tracker(self, flight: _InFlight, gate: PoolGate, compare: bool):
        """Counts the request in flight now; the returned callback, once, when the pool is done."""
        pool = flight.decision.pool
        self._metrics.routed(pool, spilled=flight.decision.spilled_from is not None)
        self._metrics.inflight(pool, self._load.inflight(pool))

        def done(completion_tokens: int | None) -> None:
            if flight.finished:
                return
            flight.finished = True
            gate.leave()
            self._ledgers[pool].drop(flight.ticket.request_id)
            self._metrics.inflight(pool, self._load.inflight(pool))
            self._queue_metrics.waiting(pool, len(gate.queue))
            outcome = flight.outcome
            if compare and outcome is not None and outcome.prediction is not None and completion_tokens is not None:
                self._score(flight, outcome.prediction, completion_tokens)

        return done

    def _score(self, flight: _InFlight, prediction: dict, completion_tokens: int) -> None:
        pool = flight.decision.pool
        self._metrics.completed(pool, self._predictor.name, prediction["expected_tokens"], completion_tokens)
        head = flight.head or next(iter(self._quality), None)
        quality = self._quality.get(head)
        if quality is None:
            return
        hit = prediction["bin"] == self._bins.pool_of(completion_tokens)
        if quality.observe(prediction["expected_tokens"], completion_tokens, hit):
            state = "trusted again" if quality.trusted else "below its floor: routing length-blind"
            log.warning("live prediction quality of %s %s: %s", head, state, quality.report())
        self._quality_metrics.update(head, quality.report())
