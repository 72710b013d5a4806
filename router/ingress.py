"""The HTTP front door: an OpenAI-compatible API that validates, picks a pool, and relays.

It is the application's ingress deployment; the vLLM pools sit behind DeploymentHandles. Keeping
validation, pool choice and relaying in separate modules keeps this file about routes only.
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

from router.errors import APIError
from router.forwarding import forward
from router.policies import POLICIES
from router.validation import parse_request, read_body

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


@serve.deployment
@serve.ingress(api)
class Router:
    def __init__(self, pools: dict[str, DeploymentHandle], config: dict):
        self._model = config["model"]
        self._limits = config["router"]
        # Handles configured once: each .options() call creates a new handle with its own state.
        self._pools = {name: h.options(stream=True) for name, h in pools.items()}
        self._policy = POLICIES["round_robin"](list(self._pools))
        self._created = int(time.time())

    @api.get("/health")
    async def health(self) -> dict:
        return {"status": "ok", "model": self._model["id"], "pools": list(self._pools)}

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

    async def _serve(self, request: Request, kind: str):
        raw = await read_body(request, self._limits["max_body_bytes"])
        body = parse_request(raw, kind, self._model["id"], self._model["max_model_len"])
        pool = self._policy.choose(body)
        try:
            async with asyncio.timeout(self._limits["request_timeout_s"]):
                return await forward(self._pools[pool], kind, body, {"X-Pool": pool})
        except TimeoutError:
            raise APIError(408, "The request timed out before the model answered.") from None
