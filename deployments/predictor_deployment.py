"""The length predictor as a Ray Serve deployment, beside the vLLM replicas on the same node.

It runs the serving model's own prefill (its own copy of the weights, loaded through
`LengthEstimator`) plus the trained head, on the token ids the router computed exactly as the
engine will see them. Concurrent requests are batched with `@serve.batch`, so a burst costs one
padded prefill instead of one per request. Torch is held to one thread: the cores belong to the
engines, and a second thread against a busy core was measured 3-9x slower.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch
from ray import serve

from predictor.estimator import LengthEstimator
from router.length_bins import PoolBins


@serve.deployment
class LengthPredictor:
    def __init__(
        self, model_path: str, checkpoint: str, pools: dict, device: str = "cpu",
        max_batch_size: int = 8, batch_wait_timeout_s: float = 0.01, max_batch_tokens: int = 4096,
    ):
        torch.set_num_threads(1)
        # OpenMP's thread count is per calling thread: the prefill thread sets its own as well.
        self._prefill = ThreadPoolExecutor(max_workers=1, initializer=torch.set_num_threads, initargs=(1,))
        self._estimator = LengthEstimator.load(
            model_path, checkpoint, device=device, max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size,
        )
        self._pools = PoolBins(**pools)
        self._predict_batch.set_max_batch_size(max_batch_size)
        self._predict_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def __call__(self, token_ids: list[int], max_tokens: int | None = None) -> dict:
        """{expected_tokens, quantiles, bin (pool name), pool_probabilities}, capped at max_tokens."""
        return await self._predict_batch((token_ids, max_tokens))

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _predict_batch(self, jobs: list[tuple[list[int], int | None]]) -> list[dict]:
        # Off the event loop, so the replica keeps answering health checks and queueing requests.
        loop = asyncio.get_running_loop()
        predictions = await loop.run_in_executor(self._prefill, self._estimator.predict, [ids for ids, _ in jobs])
        bins = self._estimator.meta.bins
        return [self._pools.describe(p, bins, cap) for p, (_, cap) in zip(predictions, jobs)]
