"""The length predictor as a Ray Serve deployment, beside the vLLM replicas on the same node.

It runs the serving model's own prefill (its own copy of the weights, loaded through
`LengthEstimator`) plus the trained head, on the token ids the router computed exactly as the
engine will see them. Concurrent requests are batched with `@serve.batch`, so a burst costs one
padded prefill instead of one per request. Torch is held to one thread: the cores belong to the
engines, and a second thread against a busy core was measured 3-9x slower.

Several heads (ESTP and EGTP, for benchmarks that compare them in one run) share that one
prefill: features are extracted once, for the union of what the heads read, and only the cheap
pooling and head run per head. One head, the default, costs exactly what it did alone.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch
from ray import serve

from deployments.model_files import model_weights_hash
from predictor.checkpoint import CheckpointMeta, load_checkpoint
from predictor.estimator import LengthEstimator
from predictor.features import FeatureConfig, extract_features, micro_batches, pad_left
from predictor.head import LengthHead, LengthPrediction, summarise
from predictor.pooling import pool
from router.length_bins import PoolBins


def shared_features(metas: list[CheckpointMeta]) -> FeatureConfig:
    """One extraction that serves every head, or an error when they read different layers."""
    layers = {m.feature_layer for m in metas}
    if len(layers) > 1:
        raise ValueError(f"predictor heads read different feature layers {sorted(layers)}: one prefill cannot serve them")
    needs = [m.pooling.needs() for m in metas]
    debias = {m.debias for m, (_, attention) in zip(metas, needs) if attention}
    if len(debias) > 1:
        raise ValueError("predictor heads disagree on attention debiasing: one prefill cannot serve them")
    return FeatureConfig(
        layer=metas[0].feature_layer, entropy=any(e for e, _ in needs), attention=any(a for _, a in needs),
        debias=debias.pop() if debias else metas[0].debias,
    )


class HeadSet:
    """The first head's estimator (model, tokenizer, batching limits) plus more heads on its prefill."""

    def __init__(self, estimator: LengthEstimator, heads: dict[str, tuple[LengthHead, CheckpointMeta]]):
        device = next(estimator.model.parameters()).device
        self.estimator = estimator
        self.heads = {name: (head.to(device).eval(), meta) for name, (head, meta) in heads.items()}
        self.features = shared_features([meta for _, meta in self.heads.values()])

    @classmethod
    def load(cls, model_path: str, checkpoints: dict[str, str], device: str = "cpu", **kwargs) -> "HeadSet":
        first, *_ = checkpoints
        estimator = LengthEstimator.load(model_path, checkpoints[first], device=device, **kwargs)
        weights = model_weights_hash(model_path)
        heads = {name: load_checkpoint(path, expected_base_model_hash=weights) for name, path in checkpoints.items()}
        return cls(estimator, heads)

    @torch.no_grad()
    def predict(self, ids: list[list[int]]) -> list[dict[str, LengthPrediction]]:
        est = self.estimator
        if any(len(s) == 0 for s in ids):
            raise ValueError("empty prompt")
        results: list[dict[str, LengthPrediction]] = [{} for _ in ids]
        for group in micro_batches([len(s) for s in ids], est.max_batch_tokens, est.max_batch_size):
            input_ids, mask = pad_left([ids[i] for i in group], est.pad_id)
            features = extract_features(est.model, input_ids, mask, self.features)
            for name, (head, meta) in self.heads.items():
                probs = torch.softmax(head(pool(features, meta.pooling)), dim=-1)
                for i, prediction in zip(group, summarise(probs, meta.bins)):
                    results[i][name] = prediction
        return results


@serve.deployment
class LengthPredictor:
    def __init__(
        self, model_path: str, checkpoints: dict[str, str], pools: dict, device: str = "cpu",
        max_batch_size: int = 8, batch_wait_timeout_s: float = 0.01, max_batch_tokens: int = 4096,
    ):
        torch.set_num_threads(1)
        # OpenMP's thread count is per calling thread: the prefill thread sets its own as well.
        self._prefill = ThreadPoolExecutor(max_workers=1, initializer=torch.set_num_threads, initargs=(1,))
        self._heads = HeadSet.load(
            model_path, checkpoints, device=device, max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size,
        )
        self._pools = PoolBins(**pools)
        self._predict_batch.set_max_batch_size(max_batch_size)
        self._predict_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def __call__(self, token_ids: list[int], max_tokens: int | None = None) -> dict[str, dict]:
        """Per head: {expected_tokens, quantiles, bin (pool name), pool_probabilities}, capped at max_tokens."""
        return await self._predict_batch((token_ids, max_tokens))

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _predict_batch(self, jobs: list[tuple[list[int], int | None]]) -> list[dict[str, dict]]:
        # Off the event loop, so the replica keeps answering health checks and queueing requests.
        loop = asyncio.get_running_loop()
        predictions = await loop.run_in_executor(self._prefill, self._heads.predict, [ids for ids, _ in jobs])
        return [
            {name: self._pools.describe(p, self._heads.heads[name][1].bins, cap) for name, p in by_head.items()}
            for by_head, (_, cap) in zip(predictions, jobs)
        ]
