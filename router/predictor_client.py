"""The router's side of the predictor: a prediction or a reason why not, never an exception.

A request must not fail because its length could not be predicted, so every failure here (no
deployment, a dead replica, a slow batch, an unreadable prompt) becomes a short reason that the
router labels its fallback with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace

from ray.serve.handle import DeploymentHandle

log = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class Outcome:
    prediction: dict | None
    failure: str | None = None  # short reason: metric label and X-Routing-Fallback value
    detail: str = ""
    latency_s: float = 0.0  # router-side wait for the answer


class PredictorClient:
    def __init__(
        self, handle: DeploymentHandle | None, name: str | None, timeout_s: float, max_prompt_tokens: int,
        heads: list[str] | None = None,
    ):
        self._handle = handle
        self.name = name
        self.heads = heads or []  # the deployment answers for each head; the first is the default
        self._timeout_s = timeout_s
        self._max_prompt_tokens = max_prompt_tokens

    async def predict(self, ids: list[list[int]], cap: int | None, head: str | None = None) -> Outcome:
        """One prediction per prompt (batched completions); the longest stands for the request.

        `head` picks one of the deployment's heads (benchmarks comparing ESTP and EGTP in one
        run); every head comes from the same prefill, so asking for another costs nothing more.
        """
        if self._handle is None:
            return Outcome(None, "no_predictor")
        longest = max(len(i) for i in ids)
        if longest > self._max_prompt_tokens:
            return Outcome(None, "prompt_too_long", f"{longest} prompt tokens > {self._max_prompt_tokens}")
        start = time.perf_counter()
        outcome = await self._ask(ids, cap, head or self.heads[0])
        return replace(outcome, latency_s=time.perf_counter() - start)

    async def _ask(self, ids: list[list[int]], cap: int | None, head: str) -> Outcome:
        try:
            async with asyncio.timeout(self._timeout_s):
                predictions = await asyncio.gather(*(self._handle.remote(i, cap) for i in ids))
        except TimeoutError:
            return Outcome(None, "timeout", f"no prediction within {self._timeout_s} s")
        except Exception as e:  # a dead or failing replica: route without it
            log.exception("predictor call failed")
            return Outcome(None, "error", f"{type(e).__name__}: {e}")
        return Outcome(max((p[head] for p in predictions), key=lambda p: p["expected_tokens"]))
