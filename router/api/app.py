"""The HTTP front door: an OpenAI-compatible API over the serving pipeline. Routes and error handlers only.

It is the application's ingress deployment; the predictor and the vLLM pools sit behind
DeploymentHandles, reached only through the pipeline (router.serving.pipeline). A request is
authenticated before its body is read (router.api.auth), size-limited (router.api.validation.BodyLimit),
parsed into vLLM's protocol models (router.api.protocol) and checked (router.api.validation); the pipeline
serves it; this turns the outcome into JSON or SSE with the routing headers (router.api.headers), and
any failure into an OpenAI-format error.
"""

from __future__ import annotations

import logging
import time
import weakref

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.exceptions import TaskCancelledError
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException
from vllm.exceptions import VLLMValidationError

from router.api.auth import AuthMiddleware, Keys
from router.api.errors import error_response
from router.api.headers import benchmark_overrides, prediction_json, routing_extension, routing_headers
from router.api.protocol import ChatBody, CompletionBody
from router.api.validation import BodyLimit, check_request, parse_request, request_kind, validation_error
from router.serving.config import RoutingPlan, StackConfig
from router.serving.errors import APIError
from router.serving.pipeline import Overrides, Pipeline, Served
from router.serving.readiness import Readiness
from router.serving.rollout import RolloutRequest

log = logging.getLogger("ray.serve")
HEALTH, LIVENESS = "/health", "/health/live"
MAX_CLIENT_ID = 128  # characters of a client's X-Request-Id kept (echoed back and logged)
api = FastAPI(title="lengthserve", description="Length-aware OpenAI-compatible LLM serving")


@api.exception_handler(APIError)
async def _api_error(_: Request, exc: APIError):
    return error_response(exc)


@api.exception_handler(RequestValidationError)
@api.exception_handler(VLLMValidationError)
async def _invalid_body(_: Request, exc):
    return error_response(validation_error(exc, getattr(exc, "body", None)))  # FastAPI's error holds the body


_UNPARSEABLE = {UnicodeDecodeError: "Request body is not valid UTF-8.", RecursionError: "Request body is nested too deeply."}


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException):
    cause = type(exc.__cause__)  # FastAPI's 400 "error parsing the body" hides why
    return error_response(APIError(exc.status_code, _UNPARSEABLE.get(cause, str(exc.detail))))


@api.exception_handler(Exception)
async def _unexpected(_: Request, exc: Exception):
    log.exception("unhandled error in the router")
    return error_response(APIError(500, f"Internal error: {type(exc).__name__}."))


class _SSEResponse(StreamingResponse):
    """Ray Serve reports a client that hung up mid-stream by raising TaskCancelledError from
    `receive`, where Starlette waits for an `http.disconnect` message: take it as one."""

    async def listen_for_disconnect(self, receive) -> None:
        try:
            await super().listen_for_disconnect(receive)
        except TaskCancelledError:
            pass


def _response(served: Served, stream: bool, client_wants_usage: bool):
    request, answer = served.request, served.answer
    headers = routing_headers(request)
    if not stream:
        return JSONResponse({**answer.json(), **routing_extension(request)}, headers=headers)
    response = _SSEResponse(answer.sse(keep_usage=client_wants_usage), media_type="text/event-stream",
                            headers=headers)
    # A cancelled ASGI task never runs a body it did not start: the answer is then abandoned.
    weakref.finalize(response, answer.abandon)
    return response


@serve.deployment
@serve.ingress(api)
class Router:
    def __init__(self, pools: dict[str, DeploymentHandle], predictor: DeploymentHandle | None, config: StackConfig,
                 plan: RoutingPlan, learner: DeploymentHandle | None = None):
        self._config = config
        self._model = config.model
        router = config.router
        self._keys = Keys.from_env()
        if router.benchmark_headers and not self._keys.benchmark:
            raise RuntimeError("router.benchmark_headers: true needs a benchmark key: set LENGTHSERVE_BENCHMARK_KEYS "
                               "(or LENGTHSERVE_BENCHMARK_KEY_FILE) in the environment `serve run` starts from")
        api.add_middleware(BodyLimit, max_bytes=router.max_body_bytes)
        open_paths = frozenset({LIVENESS} if router.auth.protect_health else {HEALTH, LIVENESS})
        api.add_middleware(AuthMiddleware, keys=self._keys, open_paths=open_paths)  # outermost: before the body
        self._pipeline = Pipeline(config, plan, pools, predictor, learner)
        self._vocab_size = len(self._pipeline.tokenizer)
        self._readiness = Readiness([*pools.values(), *(h for h in (predictor, learner) if h is not None)])
        self._created = int(time.time())
        self._metrics_port: int | None = None

    @api.get(HEALTH)
    async def health(self):
        """Readiness: 200 while every pool and the predictor have a running replica, else 503."""
        self._pipeline.probe_prefill()  # probes come before traffic: the budget knows the predictor's speed by then
        running = await self._readiness.running()
        ready = all(n > 0 for n in running.values())
        body = {"status": "ok" if ready else "starting", "model": self._model.id, "running_replicas": running,
                **self._pipeline.status(), "engine_requests": await self._pipeline.engine_requests(),
                "metrics_port": self._node_metrics_port()}
        if self._pipeline.labels is not None:
            body["learner"] = await self._pipeline.labels.status()
        return JSONResponse(body, status_code=200 if ready else 503, headers={} if ready else {"Retry-After": "5"})

    def __del__(self):
        """Ray Serve's shutdown hook: what the router keeps across restarts is written out."""
        if (pipeline := getattr(self, "_pipeline", None)) is not None:
            pipeline.close()

    @api.get(LIVENESS)
    async def live(self) -> dict:
        """Liveness: the router answers (whatever its pools are doing)."""
        return {"status": "alive"}

    def _node_metrics_port(self) -> int | None:
        """The Prometheus port of this node's Ray metrics agent, where the router's metrics are."""
        if self._metrics_port is None:
            import ray

            node = ray.get_runtime_context().get_node_id()
            self._metrics_port = next((n.get("MetricsExportPort") for n in ray.nodes() if n["NodeID"] == node), None)
        return self._metrics_port

    def _card(self) -> dict:
        return {"id": self._model.id, "object": "model", "created": self._created, "owned_by": "lengthserve",
                "max_model_len": self._model.max_model_len}

    @api.get("/v1/models")
    async def models(self) -> dict:
        return {"object": "list", "data": [self._card()]}

    @api.get("/v1/models/{model_id:path}")
    async def model(self, model_id: str) -> dict:
        self._served_model(model_id)
        return self._card()

    def _served_model(self, model_id: str | None) -> None:
        if model_id != self._model.id:
            raise APIError(404, f"The model '{model_id}' does not exist; this server serves '{self._model.id}'.",
                           param="model", code="model_not_found")

    def _overrides(self, request: Request) -> Overrides:
        return benchmark_overrides(request.headers, self._config.router.benchmark_headers,
                                   self._pipeline.scheduler.chain.policies, self._pipeline.pools, self._keys)

    def _checked(self, body, kind: str) -> None:
        check_request(body, kind, self._model.id, self._model.max_model_len, self._config.router.limits,
                      self._vocab_size, seeded_sampling=self._model.accelerator != "cpu")

    @api.post("/v1/chat/completions")
    async def chat(self, body: ChatBody, request: Request):
        return await self._serve(body, "chat", request)

    @api.post("/v1/completions")
    async def completions(self, body: CompletionBody, request: Request):
        return await self._serve(body, "completions", request)

    async def _serve(self, body, kind: str, request: Request):
        self._checked(body, kind)
        client_wants_usage = bool(body.stream_options and body.stream_options.include_usage)
        client_id = (request.headers.get("x-request-id") or "")[:MAX_CLIENT_ID] or None
        served = await self._pipeline.serve(body, kind, self._overrides(request), client_id)
        return _response(served, bool(body.stream), client_wants_usage)

    @api.post("/v1/length")
    async def length(self, request: Request) -> dict:
        """Only the length, as the router would rank the request, and its source (a small `max_tokens`,
        the client's hint, the prompt's history or the head), for external schedulers: a chat or a
        completions body."""
        raw = await request.body()
        kind = request_kind(raw)
        body = parse_request(raw, kind)
        self._checked(body, kind)
        overrides = self._overrides(request)
        record = await self._pipeline.length(body, kind, overrides)
        answer = {"object": "length_prediction", "model": self._model.id, "predictor": self._pipeline.predictor.name,
                  **prediction_json(record.estimate, record.prompt_tokens)}
        if overrides.policy is not None:  # a benchmark planning its groups: the pool this policy picks now
            answer["routing"] = {"pool": record.pool, "policy": record.decided_by, "fallback": record.fallback,
                                 "rank_tokens": record.rank_tokens}
        return answer

    @api.post("/v1/rollout")
    async def rollout_http(self, body: RolloutRequest, request: Request) -> dict:
        """The rollout endpoint (router.serving.rollout): every sample of a batch, with its length and timing."""
        if body.known_tokens is not None:  # told lengths steer the schedule, as the oracle header does
            if not self._config.router.benchmark_headers:
                raise APIError(400, "known_tokens: benchmark headers are off (router.benchmark_headers: false).",
                               param="known_tokens")
            self._keys.check_benchmark(request.headers)
        return await self.rollout(body)

    async def rollout(self, request: RolloutRequest | dict, pool: str | None = None) -> dict:
        """The Python API on Ray: `serve.get_app_handle("lengthserve").rollout.remote({...}).result()`."""
        req = request if isinstance(request, RolloutRequest) else RolloutRequest.model_validate(request)
        self._served_model(req.model)
        if req.max_tokens > self._model.max_model_len:
            raise APIError(400, f"'max_tokens' = {req.max_tokens} exceeds the model's context.", param="max_tokens")
        return await self._pipeline.rollout(req, pool)
