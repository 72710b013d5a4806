"""The HTTP front door: an OpenAI-compatible API that validates, predicts, picks a pool, and relays.

It is the application's ingress deployment; the predictor and the vLLM pools sit behind
DeploymentHandles. Validation, prompt rendering, pool choice, load tracking and relaying live in
their own modules, which keeps this file about routes and the order of the steps.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException
from vllm.entrypoints.generate.base.protocol import StreamOptions

from router.errors import APIError
from router.forwarding import forward
from router.length_bins import PoolBins
from router.policies import POLICIES, Job, PolicyChain, PolicyContext, priority
from router.pool_load import PoolLoad
from router.predictor_client import Outcome, PredictorClient
from router.prompt_ids import UnsupportedPrompt, prompt_ids
from router.routing import BenchmarkOverrides, Route, benchmark_overrides
from router.telemetry import RoutingMetrics
from router.validation import parse_request, read_body, request_kind

log = logging.getLogger("ray.serve")
api = FastAPI(title="lengthserve", description="Length-aware OpenAI-compatible LLM serving")


@api.exception_handler(APIError)
async def _api_error(_: Request, exc: APIError):
    return exc.response()


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException):
    return APIError(exc.status_code, str(exc.detail)).response()


@api.exception_handler(Exception)
async def _unexpected(_: Request, exc: Exception):
    log.exception("unhandled error in the router")
    return APIError(500, f"Internal error: {type(exc).__name__}.").response()


def _max_tokens(body) -> int | None:
    return getattr(body, "max_completion_tokens", None) or body.max_tokens


def _single_output(body, ids: list[list[int]] | None) -> bool:
    """usage.completion_tokens is one output's length only for one prompt and n = 1."""
    return ids is not None and len(ids) == 1 and (body.n or 1) == 1


@serve.deployment
@serve.ingress(api)
class Router:
    def __init__(
        self, pools: dict[str, DeploymentHandle], predictor: DeploymentHandle | None, config: dict, routing: dict
    ):
        from transformers import AutoTokenizer

        self._model = config["model"]
        self._limits = config["router"]
        # Handles configured once: each .options() call creates a new handle with its own state.
        self._pools = {name: h.options(stream=True) for name, h in pools.items()}
        self._tokenizer = AutoTokenizer.from_pretrained(routing["model_path"])
        self._bins = PoolBins(**routing["output_bins"])
        self._load = PoolLoad(list(self._pools), routing["capacities"])
        ctx = PolicyContext(
            pools=list(self._pools), output_bins=self._bins, input_edges=self._limits["input_edges"] or [],
            replicas=routing["replicas"], load=self._load,
        )
        self._policy_name, self._fallback_name = self._limits["policy"], self._limits["fallback_policy"]
        # Benchmark headers let any request pick any policy: all are built once, each with its own state.
        self._benchmark = self._limits["benchmark_headers"]
        self._chain = PolicyChain(ctx, POLICIES if self._benchmark else [self._policy_name], self._fallback_name)
        spec = config["predictor"] or {}
        self._predictor = PredictorClient(
            predictor, routing["predictor_name"], spec.get("timeout_s", 0), spec.get("max_prompt_tokens", 0),
            routing["predictor_heads"],
        )
        self._metrics = RoutingMetrics(self._policy_name)
        self._created = int(time.time())

    @api.get("/health")
    async def health(self) -> dict:
        return {
            "status": "ok", "model": self._model["id"], "pools": list(self._pools),
            "policy": self._policy_name, "predictor": self._predictor.name, "output_edges": list(self._bins.edges),
            "inflight": {pool: self._load.inflight(pool) for pool in self._pools},  # this router replica's
        }

    @api.get("/v1/models")
    async def models(self) -> dict:
        card = {
            "id": self._model["id"],
            "object": "model",
            "created": self._created,
            "owned_by": "lengthserve",
            "max_model_len": self._model["max_model_len"],
        }
        return {"object": "list", "data": [card]}

    @api.post("/v1/chat/completions")
    async def chat(self, request: Request):
        return await self._serve(request, "chat")

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._serve(request, "completions")

    @api.post("/v1/length")
    async def length(self, request: Request):
        """Only the prediction, for external schedulers: a chat or a completions body."""
        raw = await read_body(request, self._limits["max_body_bytes"])
        kind = request_kind(raw)
        body = parse_request(raw, kind, self._model["id"], self._model["max_model_len"])
        bench = self._overrides(request)
        policy = bench.policy or self._policy_name
        ids, outcome = await self._predict(body, kind, policy)
        if outcome.prediction is None:
            raise APIError(503, f"No length prediction ({outcome.failure}): {outcome.detail}", code=outcome.failure)
        answer = {
            "object": "length_prediction", "model": self._model["id"], "predictor": self._predictor.name,
            "prompt_tokens": max(len(i) for i in ids), **outcome.prediction,
        }
        if bench.policy is not None:  # a benchmark planning its groups: the pool this policy picks now
            job = self._job(ids, outcome, bench)
            answer["routing"] = dict(zip(("pool", "policy", "fallback"), self._choose(job, outcome, policy)))
        return answer

    def _overrides(self, request: Request) -> BenchmarkOverrides:
        return benchmark_overrides(request.headers, self._benchmark, self._chain.policies, self._pools)

    async def _predict(self, body, kind: str, policy: str) -> tuple[list[list[int]] | None, Outcome]:
        try:
            ids = prompt_ids(self._tokenizer, body, kind)
        except UnsupportedPrompt as e:
            return None, Outcome(None, "unsupported_prompt", str(e))
        # A predicted policy reads its own head (ESTP or EGTP); the others, the default head.
        head = policy if policy in self._predictor.heads else None
        outcome = await self._predictor.predict(ids, _max_tokens(body), head)
        if outcome.prediction is not None:
            self._metrics.predictor_latency(self._predictor.name, outcome.latency_s)
        return ids, outcome

    def _choose(self, job: Job, outcome: Outcome, policy: str) -> tuple[str, str, str | None]:
        """(pool, deciding policy, fallback reason); a fallback is counted and logged."""
        pool, decided_by, reason = self._chain.choose(job, policy)
        if reason is not None:
            self._metrics.fallback(reason, outcome.detail or reason)
        return pool, decided_by, reason

    @staticmethod
    def _job(ids: list[list[int]] | None, outcome: Outcome, bench: BenchmarkOverrides) -> Job:
        return Job(
            prompt_tokens=None if ids is None else max(len(i) for i in ids),
            prediction=outcome.prediction, prediction_failure=outcome.failure, true_tokens=bench.true_tokens,
        )

    async def _route(self, request: Request, body, kind: str) -> tuple[Route, list[list[int]] | None]:
        start = time.perf_counter()
        bench = self._overrides(request)
        policy = bench.policy or self._policy_name
        ids, outcome = await self._predict(body, kind, policy)
        job = self._job(ids, outcome, bench)
        if bench.pool is not None:  # planned by the benchmark (batch mode): no decision, no spillover
            chosen, fallback = bench.pool, None
            pool = chosen
        else:
            chosen, policy, fallback = self._choose(job, outcome, policy)
            pool = self._load.spill(chosen) if self._limits["spillover"] else chosen
        route = Route(
            pool=pool, policy=policy, prompt_tokens=job.prompt_tokens, prediction=job.prediction,
            priority=priority(job, chosen, policy, self._bins, self._model["max_model_len"], _max_tokens(body)),
            spilled_from=chosen if pool != chosen else None, fallback=fallback,
            routing_ms=(time.perf_counter() - start) * 1000,
        )
        return route, ids

    async def _serve(self, request: Request, kind: str):
        raw = await read_body(request, self._limits["max_body_bytes"])
        body = parse_request(raw, kind, self._model["id"], self._model["max_model_len"])
        route, ids = await self._route(request, body, kind)
        if self._limits["shortest_first"]:
            body.priority = route.priority
        client_wants_usage = bool(body.stream_options and body.stream_options.include_usage)
        if body.stream and not client_wants_usage:
            body.stream_options = StreamOptions(include_usage=True, **(
                {"continuous_usage_stats": body.stream_options.continuous_usage_stats} if body.stream_options else {}
            ))
        done = self._tracker(route, compare=_single_output(body, ids))
        try:
            async with asyncio.timeout(self._limits["request_timeout_s"]):
                return await forward(
                    self._pools[route.pool], kind, body, route.headers(), route.extension(), client_wants_usage, done
                )
        except TimeoutError:
            done(None)
            raise APIError(408, "The request timed out before the model answered.") from None
        except BaseException:
            done(None)
            raise

    def _tracker(self, route: Route, compare: bool):
        """Counts the request in flight now; the returned callback, once, when the pool is done."""
        self._load.acquire(route.pool)
        self._metrics.routed(route.pool, spilled=route.spilled_from is not None)
        self._metrics.inflight(route.pool, self._load.inflight(route.pool))
        settled = False

        def done(completion_tokens: int | None) -> None:
            nonlocal settled
            if settled:
                return
            settled = True
            self._load.release(route.pool)
            self._metrics.inflight(route.pool, self._load.inflight(route.pool))
            if compare and route.prediction is not None and completion_tokens is not None:
                self._metrics.completed(
                    route.pool, self._predictor.name, route.prediction["expected_tokens"], completion_tokens
                )

        return done
