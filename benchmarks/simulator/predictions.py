"""Real ESTP/EGTP predictions for every prompt of the dataset, cached on disk.

The simulator must route on what the deployed predictor would answer, so the predictions come
from the committed checkpoints through the estimator's own head path
(predictor.estimator.head_predictions), on the token ids the router computes (`router.serving.render`
on the chat request a client sends, cut to the tail the deployed predictor reads:
predictor.truncate_prompt_tokens). Where the training feature cache (predictor/cache, filled by
`predictor.train` and the accuracy benchmark) holds a prompt's prefill features, they are reused:
no prefill at all, only pooling and the heads (its hidden states are stored as float16, so a
prediction can differ from a live one in the last digits). Other prompts get one prefill. The
output cache (one JSON line per prompt, keyed by the prompt's token ids and the checkpoint's hash)
lets a growing dataset, a retrained head or a rerun predict only what is new.

    python -m benchmarks.simulator predict
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from benchmarks.forelen.build import DEFAULT_OUT
from predictor.dataset import load_samples
from router.serving.config import HEAD_CHECKPOINTS, head_checkpoint
from predictor.head import LengthPrediction

RESULTS = Path(__file__).resolve().parents[1] / "results"
CHECKPOINTS = tuple(HEAD_CHECKPOINTS)  # every head a policy can read


def cache_path(name: str) -> Path:
    return RESULTS / f"predictions_{name}.jsonl"


def checkpoint_hash(name: str) -> str:
    weights = head_checkpoint(name).with_suffix(".safetensors")
    return hashlib.sha256(weights.read_bytes()).hexdigest()[:16]


def ids_hash(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def chat_body(model_id: str, prompt: str, max_tokens: int | None):
    """The request a client sends for a dataset prompt: one user message, as the dataset was generated."""
    from ray.serve.llm.openai_api_models import ChatCompletionRequest

    return ChatCompletionRequest(model=model_id, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens)


def router_ids(tokenizer, model_id: str, prompt: str) -> list[int]:
    from router.serving.render import prompt_ids

    return prompt_ids(tokenizer, chat_body(model_id, prompt, None), "chat")[0]


def _current_rows(name: str) -> list[dict]:
    """The cache's entries made by the checkpoint as it is now."""
    path, current = cache_path(name), checkpoint_hash(name)
    if not path.exists():
        return []
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [r for r in rows if r["checkpoint"] == current]


def prune_stale(name: str, ids: dict[str, list[int]]) -> None:
    """Drop the entries of earlier checkpoints or of other token ids than `ids` (prompt_id -> the
    ids predicted now): a retrained head, a changed truncation or template makes them dead weight
    in the repo, and load_cache must not serve them."""
    path = cache_path(name)
    current = {pid: ids_hash(i) for pid, i in ids.items()}
    rows = [r for r in _current_rows(name) if current.get(r["prompt_id"]) == r["ids"]]
    if path.exists() and len(rows) != sum(1 for line in path.read_text().splitlines() if line.strip()):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def load_cache(name: str) -> dict[str, LengthPrediction]:
    """prompt_id -> prediction of the current checkpoint."""
    return {r["prompt_id"]: LengthPrediction(**r["prediction"]) for r in _current_rows(name)}


def predict_all(max_prompt_tokens: int, truncate_prompt_tokens: int | None, batch: int = 32,
                threads: int = 2) -> dict[str, int]:
    """Predict every dataset prompt missing from the caches, as the deployed predictor would (the
    same length limit and truncation); returns how many were added per checkpoint."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from predictor.checkpoint import load_checkpoint
    from predictor.estimator import LengthEstimator, head_predictions, prompt_tail, shared_features
    from predictor.model_files import EMBEDDED_MODEL_ID, model_weights_hash, resolve_model_source
    from predictor.train import CACHE_DIR, Example, FeatureCache, cached_features, cached_layer

    torch.set_num_threads(threads)
    model_path = resolve_model_source("embedded")
    weights = model_weights_hash(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = {r["prompt_id"]: r["prompt"] for r in load_samples(DEFAULT_OUT)}
    ids = {pid: router_ids(tokenizer, EMBEDDED_MODEL_ID, text) for pid, text in prompts.items()}
    # The router never predicts longer prompts (predictor.max_prompt_tokens): they fall back.
    lengths = {pid: len(i) for pid, i in ids.items() if len(i) <= max_prompt_tokens}
    ids = {pid: prompt_tail(ids[pid], truncate_prompt_tokens) for pid in lengths}
    heads = {name: load_checkpoint(head_checkpoint(name), weights) for name in CHECKPOINTS}
    todo = {}
    for name in CHECKPOINTS:
        prune_stale(name, ids)
        done = {(r["prompt_id"], r["ids"]) for r in _current_rows(name)}
        todo[name] = [pid for pid in ids if (pid, ids_hash(ids[pid])) not in done]
    predicted: dict[str, dict] = {}
    model = None
    # One prefill serves the heads of one layer: the early exit's head gets its own.
    for layer in sorted({meta.feature_layer for _, meta in heads.values()}):
        group = {name: h for name, h in heads.items() if h[1].feature_layer == layer}
        features = FeatureCache(CACHE_DIR, weights, cached_layer(layer))
        missing = sorted({pid for name in group for pid in todo[name]}, key=lambda pid: len(ids[pid]))
        uncached = {tuple(e.ids) for e in features.missing([Example(pid, ids[pid]) for pid in missing])}
        fresh = [pid for pid in missing if tuple(ids[pid]) in uncached]
        cached = [pid for pid in missing if tuple(ids[pid]) not in uncached]
        debias = shared_features([meta for _, meta in group.values()]).debias
        with torch.no_grad():
            for pid in tqdm(cached, desc=f"predict layer {layer} (cached features)", unit="prompt"):
                row = head_predictions(group, cached_features(features.load(ids[pid]), debias))[0]
                predicted[pid] = {**predicted.get(pid, {}), **row}
        if fresh:
            model = model or AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
            estimator = LengthEstimator(model, tokenizer, group)
            for start in tqdm(range(0, len(fresh), batch), desc=f"predict layer {layer} (prefill)", unit="batch"):
                chunk = fresh[start:start + batch]
                for pid, row in zip(chunk, estimator.predict_each([ids[pid] for pid in chunk])):
                    predicted[pid] = {**predicted.get(pid, {}), **row}
    for name in CHECKPOINTS:
        current = checkpoint_hash(name)
        with cache_path(name).open("a") as fh:
            for pid in todo[name]:
                row = {"prompt_id": pid, "ids": ids_hash(ids[pid]), "prompt_tokens": lengths[pid],
                       "checkpoint": current, "prediction": asdict(predicted[pid][name])}
                fh.write(json.dumps(row) + "\n")
    return {name: len(pids) for name, pids in todo.items()}
