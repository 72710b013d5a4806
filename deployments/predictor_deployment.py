"""The length predictor as a Ray Serve deployment, beside the vLLM replicas on the same node.

It runs the serving model's own prefill (its own copy of the weights) plus the trained heads
(predictor.estimator.LengthEstimator: one prefill, every head) on the token ids the router
computed exactly as the engine will see them, and answers each head's distribution: expected
length, quantiles and bin probabilities. Mapping them to pools or ranks is the router's business.

Concurrent requests are batched with `@serve.batch` (on a GPU one prefill serves the batch; on a
CPU the micro-batches keep padding small, as padding costs like tokens there), and a bad prompt
fails only its own answer ({"error": ...}), never its batch. Long prompts are predicted from their
tail (`truncate_prompt_tokens`). Torch is held to one thread: the cores belong to the engines, and
a second thread against a busy core was measured 3-9x slower.

Each answer says what its prefill took (its share of the batch's compute seconds and the tokens it
read), and the replica times one prefill at its start (`measured_prefill`): the router's predictor
budget (router.scheduling.budget) prices a prediction at the speed this machine really has, from
before its first request on, and follows it as load changes.

With online learning (a learner handle, deployments.learner_deployment), the replica sends the
learner the head's input of every prompt it predicts (features cost nothing more: the prefill
ran anyway), and pulls the learner's newest head every few seconds, swapping it in between
batches. Before the learner has a head (a cold start), prompts get no prediction but their
features still go to the learner.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
from ray import serve
from ray.serve.handle import DeploymentHandle

from predictor.checkpoint import load_checkpoint
from predictor.estimator import InvalidPrompt, LengthEstimator, prompt_tail
from predictor.pooling import PoolingConfig
from router.serving.predictor_client import PREFILL

log = logging.getLogger("ray.serve")
PULL_S = 5.0  # how often a replica asks the learner for a newer head
WARMUP_TOKENS = 256  # the prompt timed at start (the default truncate_prompt_tokens)


@serve.deployment
class LengthPredictor:
    def __init__(
        self, model_path: str, checkpoints: dict[str, str], device: str = "cpu", dtype: str = "float32",
        max_batch_size: int = 8, batch_wait_timeout_s: float = 0.01, max_batch_tokens: int = 4096,
        max_prompt_tokens: int | None = None, truncate_prompt_tokens: int | None = None,
        learner: DeploymentHandle | None = None, learned_head: str | None = None,
        learned_pooling: PoolingConfig | None = None,
    ):
        if learner is not None and (learned_head is None or learned_pooling is None):
            raise ValueError("a learning predictor needs the name of the head it learns and that head's pooling")
        torch.set_num_threads(1)
        # OpenMP's thread count is per calling thread: the prefill thread sets its own as well.
        self._prefill = ThreadPoolExecutor(max_workers=1, initializer=torch.set_num_threads, initargs=(1,))
        self._estimator = LengthEstimator.load(
            model_path, checkpoints, device=device, dtype=getattr(torch, dtype), max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size, max_prompt_tokens=max_prompt_tokens,
            truncate_prompt_tokens=truncate_prompt_tokens,
            learn=learned_pooling if learner is not None else None,
        )
        self._truncate = truncate_prompt_tokens
        self._measured = self._time_prefill(min(WARMUP_TOKENS, truncate_prompt_tokens or WARMUP_TOKENS,
                                                max_prompt_tokens or WARMUP_TOKENS))
        self._predict_batch.set_max_batch_size(max_batch_size)
        self._predict_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self._learner, self._learned_head = learner, learned_head
        self._version: int | None = None  # of the learned head this replica serves
        self._puller: asyncio.Task | None = None

    def _time_prefill(self, tokens: int) -> dict[str, float]:
        """One prompt of `tokens` tokens, prefilled twice: the first warms the model up (its
        allocations are one-off), the second is timed."""
        ids = [list(range(1, tokens + 1))]
        self._estimator.predict_and_pool(ids)
        start = time.perf_counter()
        self._estimator.predict_and_pool(ids)
        seconds = time.perf_counter() - start
        log.info("predictor prefill: %.4f s for %d tokens at start", seconds, tokens)
        return {"seconds": seconds, "tokens": tokens}

    async def measured_prefill(self) -> dict[str, float]:
        """The prefill timed at start: {"seconds", "tokens"}."""
        return self._measured

    async def __call__(self, token_ids: list[int], request_id: str | None = None) -> dict[str, dict]:
        """Per head: {expected_tokens, quantiles, bin, probabilities}, and what its prefill took
        (PREFILL: {seconds, tokens}); or {"error": why} for this prompt."""
        if self._learner is not None and self._puller is None:
            self._puller = asyncio.get_running_loop().create_task(self._pull_heads())
        return await self._predict_batch(token_ids, request_id)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _predict_batch(self, prompts: list[list[int]], request_ids: list[str | None]) -> list[dict]:
        # Off the event loop, so the replica keeps answering health checks and queueing requests.
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        results, vectors = await loop.run_in_executor(self._prefill, self._estimator.predict_and_pool, prompts)
        seconds = time.perf_counter() - start
        read = [0 if isinstance(r, InvalidPrompt) else len(prompt_tail(ids, self._truncate))
                for r, ids in zip(results, prompts)]
        per_token = seconds / max(1, sum(read))  # the batch's seconds, shared out by the tokens each prompt read
        if self._learner is not None:
            rows = [(rid, v.tolist(), len(ids)) for rid, v, ids in zip(request_ids, vectors, prompts)
                    if rid is not None and v is not None]
            if rows:
                self._learner.features.remote(rows)  # fire and forget: learning never delays a prediction
        return [{"error": str(r), "code": "invalid_prompt"} if isinstance(r, InvalidPrompt) else
                ({**{name: asdict(p) for name, p in r.items()}, PREFILL: {"seconds": n * per_token, "tokens": n}}
                 if r else {"error": "no head yet: the learner has not installed one", "code": "no_head"})
                for r, n in zip(results, read)]

    async def _pull_heads(self) -> None:
        while True:
            try:
                answer = await self._learner.head.remote(self._version)
                if answer is not None:
                    with tempfile.TemporaryDirectory() as tmp:
                        stem = Path(tmp) / "head"
                        stem.with_suffix(".safetensors").write_bytes(answer["weights"])
                        stem.with_suffix(".json").write_text(answer["meta"])
                        head, meta = load_checkpoint(stem)
                    self._estimator.set_head(self._learned_head, head, meta)
                    self._version = answer["version"]
                    log.info("predictor now serves learned head version %s", self._version)
            except Exception:  # the learner is down or restarting: keep serving the head we have
                log.exception("pulling the learned head failed")
            await asyncio.sleep(PULL_S)
