"""The router's side of the predictor: a prediction or a reason why not, never an exception.

A request must not fail because its length could not be predicted, so every failure here (no
deployment, a dead replica, a slow batch, an unreadable prompt) becomes a short reason that the
router labels its fallback with. The deployment answers each head's distribution; describing it
for the pools (capped expectation, quantiles, the pool with the most mass) is the router's
(router.scheduling.pools).

Concurrency is bounded (`max_concurrent`, one full prefill batch per predictor replica by
default): the predictor never queues more than it can batch, so it cannot fall further and
further behind a burst; requests beyond that wait here, for a prediction they may no longer need
by the time a slot frees (a request that got a replica meanwhile cancels its wait). A call that
times out or whose request goes away is cancelled on the predictor too, not abandoned to run
for nobody.

Each answer also says what its prefill took (`PREFILL`: its share of its batch's seconds and the
tokens it read), and `measured_prefill` asks for the prefill the predictor timed at its start:
the predictor budget (router.scheduling.budget) prices a prediction at the speed the machine
really has, from before the first burst on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ray.serve.handle import DeploymentHandle

from predictor.head import LengthBins, LengthPrediction
from router.scheduling.pools import Pools
from router.scheduling.request import Prediction

log = logging.getLogger("ray.serve")
PREFILL = "prefill"  # an answer's entry beside the heads': {"seconds", "tokens"} of its prefill


@dataclass(frozen=True)
class Outcome:
    prediction: Prediction | None
    failure: str | None = None  # short reason: metric label and X-Routing-Fallback value
    detail: str = ""
    latency_s: float = 0.0  # router-side wait for the answer, queueing for a slot included
    prefill_s: float = 0.0  # the predictor's compute for this prompt (its share of its batch's)
    prefill_tokens: int = 0  # the prompt tokens it read


class PredictorClient:
    def __init__(self, handle: DeploymentHandle | None, name: str | None, timeout_s: float, max_prompt_tokens: int,
                 heads: dict[str, LengthBins], pools: Pools, max_concurrent: int):
        self._handle = handle
        self.name = name
        self.heads = heads  # head name -> its length bins; the first is the default
        self._pools = pools
        self._timeout_s = timeout_s
        self._max_prompt_tokens = max_prompt_tokens
        self.max_concurrent = max_concurrent
        self._slots: asyncio.Semaphore | None = None  # made on the replica's event loop, at first use
        self.waiting = 0  # calls waiting for a slot

    async def predict(self, ids: list[int], cap: int | None, head: str | None = None, wait: bool = True,
                      timeout_s: float | None = None, request_id: str | None = None) -> Outcome:
        """One prompt's prediction by `head` (default: the first), capped at `cap` tokens.

        Every head comes from the same prefill, so asking for another costs nothing more.
        `wait=False`: only if a slot is free now (a request that is not waiting itself must not
        pile up in front of the predictor). `timeout_s`: a bound other than the configured one,
        for a prediction nobody waits on (one made beside a request). `request_id`: the request's,
        for a learning predictor to join its features with its length when it finishes.
        """
        if self._handle is None:
            return Outcome(None, "no_predictor")
        if len(ids) > self._max_prompt_tokens:
            return Outcome(None, "prompt_too_long", f"{len(ids)} prompt tokens > {self._max_prompt_tokens}")
        head = head or next(iter(self.heads))
        start = time.perf_counter()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent)
        if not wait and self._slots.locked():
            return Outcome(None, "predictor_busy", f"all {self.max_concurrent} prediction slots busy")
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        try:
            answer, failure, detail = await self._ask(ids, request_id, timeout_s or self._timeout_s)
        finally:
            self._slots.release()
        latency = time.perf_counter() - start
        if answer is None:
            return Outcome(None, failure, detail, latency)
        if "error" in answer:
            return Outcome(None, answer.get("code", "invalid_prompt"), answer["error"], latency)
        if head not in answer:
            return Outcome(None, "no_head", f"the predictor serves no {head} head yet", latency)
        prediction = self._pools.describe(head, LengthPrediction(**answer[head]), self.heads[head], cap)
        prefill = answer.get(PREFILL, {"seconds": 0.0, "tokens": 0})
        return Outcome(prediction, latency_s=latency, prefill_s=prefill["seconds"], prefill_tokens=prefill["tokens"])

    async def measured_prefill(self, timeout_s: float = 10.0) -> tuple[float, int] | None:
        """(seconds, tokens) of the prefill the predictor timed at its start; None while it cannot
        answer (it starts in minutes on a CPU)."""
        if self._handle is None:
            return None
        try:
            async with asyncio.timeout(timeout_s):
                answer = await self._handle.measured_prefill.remote()
        except Exception:  # not up yet, or restarting: the caller asks again later
            return None
        return answer["seconds"], answer["tokens"]

    async def _ask(self, ids: list[int], request_id: str | None, timeout_s: float) -> tuple[dict | None, str | None, str]:
        response = self._handle.remote(ids, request_id)
        try:
            async with asyncio.timeout(timeout_s):
                return await response, None, ""
        except TimeoutError:
            response.cancel()
            return None, "timeout", f"no prediction within {timeout_s} s"
        except asyncio.CancelledError:
            response.cancel()
            raise
        except Exception as e:  # a dead or failing replica: route without it
            log.exception("predictor call failed")
            return None, "error", f"{type(e).__name__}: {e}"
