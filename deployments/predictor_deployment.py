"""The length predictor as a Ray Serve deployment, beside the vLLM replicas on the same node.

It runs the serving model's own prefill (its own copy of the weights) plus the trained heads
(predictor.estimator.LengthEstimator: one prefill, every head) on the token ids the router
computed exactly as the engine will see them, and answers each head's distribution: expected
length, quantiles and bin probabilities. Mapping them to pools or ranks is the router's business.

Concurrent requests are batched with `@serve.batch`, so a burst costs one padded prefill instead
of one per request, and a bad prompt fails only its own answer ({"error": ...}), never its batch.
Torch is held to one thread: the cores belong to the engines, and a second thread against a busy
core was measured 3-9x slower.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import torch
from ray import serve

from predictor.estimator import InvalidPrompt, LengthEstimator


@serve.deployment
class LengthPredictor:
    def __init__(
        self, model_path: str, checkpoints: dict[str, str], device: str = "cpu", dtype: str = "float32",
        max_batch_size: int = 8, batch_wait_timeout_s: float = 0.01, max_batch_tokens: int = 4096,
        max_prompt_tokens: int | None = None,
    ):
        torch.set_num_threads(1)
        # OpenMP's thread count is per calling thread: the prefill thread sets its own as well.
        self._prefill = ThreadPoolExecutor(max_workers=1, initializer=torch.set_num_threads, initargs=(1,))
        self._estimator = LengthEstimator.load(
            model_path, checkpoints, device=device, dtype=getattr(torch, dtype), max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size, max_prompt_tokens=max_prompt_tokens,
        )
        self._predict_batch.set_max_batch_size(max_batch_size)
        self._predict_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def __call__(self, token_ids: list[int]) -> dict[str, dict]:
        """Per head: {expected_tokens, quantiles, bin, probabilities}; or {"error": why} for this prompt."""
        return await self._predict_batch(token_ids)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _predict_batch(self, prompts: list[list[int]]) -> list[dict]:
        # Off the event loop, so the replica keeps answering health checks and queueing requests.
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._prefill, self._estimator.predict_each, prompts)
        return [{"error": str(r)} if isinstance(r, InvalidPrompt) else {name: asdict(p) for name, p in r.items()}
                for r in results]
