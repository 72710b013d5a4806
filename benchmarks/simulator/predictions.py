"""Real ESTP/EGTP predictions for every prompt of the dataset, cached on disk.

The simulator must route on what the deployed predictor would answer, so the predictions come
from the committed checkpoints through `LengthEstimator`, on the token ids the router computes
(`router.prompt_ids` on the chat request a client sends). That is a CPU prefill per prompt:
it runs once, and the cache (one JSON line per prompt, keyed by the prompt's token ids and the
checkpoint's hash) lets a growing dataset or a rerun predict only what is new.

    python -m benchmarks.simulator predict        # under /tmp/gen/heavy.sh on a shared machine
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from benchmarks.forelen.build import DEFAULT_OUT
from predictor.dataset import load_samples
from deployments.config import DEFAULT_CHECKPOINTS
from predictor.head import LengthPrediction

RESULTS = Path(__file__).resolve().parents[1] / "results"
CHECKPOINTS = ("estp", "egtp")


def cache_path(name: str) -> Path:
    return RESULTS / f"predictions_{name}.jsonl"


def checkpoint_hash(name: str) -> str:
    weights = (DEFAULT_CHECKPOINTS / name / "head").with_suffix(".safetensors")
    return hashlib.sha256(weights.read_bytes()).hexdigest()[:16]


def ids_hash(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def chat_body(model_id: str, prompt: str, max_tokens: int | None):
    """The request a client sends for a dataset prompt: one user message, as the dataset was generated."""
    from ray.serve.llm.openai_api_models import ChatCompletionRequest

    return ChatCompletionRequest(model=model_id, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens)


def router_ids(tokenizer, model_id: str, prompt: str) -> list[int]:
    from router.prompt_ids import prompt_ids

    return prompt_ids(tokenizer, chat_body(model_id, prompt, None), "chat")[0]


def _current_rows(name: str) -> list[dict]:
    """The cache's entries made by the checkpoint as it is now."""
    path, current = cache_path(name), checkpoint_hash(name)
    if not path.exists():
        return []
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [r for r in rows if r["checkpoint"] == current]


def prune_stale(name: str) -> None:
    """Drop the entries of earlier checkpoints: a retrained head makes them dead weight in the repo."""
    path, rows = cache_path(name), _current_rows(name)
    if path.exists() and len(rows) != sum(1 for line in path.read_text().splitlines() if line.strip()):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def load_cache(name: str) -> dict[str, LengthPrediction]:
    """prompt_id -> prediction of the current checkpoint."""
    return {r["prompt_id"]: LengthPrediction(**r["prediction"]) for r in _current_rows(name)}


def predict_all(max_prompt_tokens: int, batch: int = 32, threads: int = 2) -> dict[str, int]:
    """Predict every dataset prompt missing from the caches; returns how many were added per checkpoint."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from predictor.model_files import EMBEDDED_MODEL_ID, model_weights_hash, resolve_model_source
    from predictor.checkpoint import load_checkpoint
    from predictor.estimator import LengthEstimator

    torch.set_num_threads(threads)
    model_path = resolve_model_source("embedded")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = {r["prompt_id"]: r["prompt"] for r in load_samples(DEFAULT_OUT)}
    ids = {pid: router_ids(tokenizer, EMBEDDED_MODEL_ID, text) for pid, text in prompts.items()}
    # The router never predicts longer prompts (predictor.max_prompt_tokens): they fall back.
    ids = {pid: i for pid, i in ids.items() if len(i) <= max_prompt_tokens}
    model = None
    added = {}
    for name in CHECKPOINTS:
        prune_stale(name)
        done = {(r["prompt_id"], r["ids"]) for r in _current_rows(name)}
        todo = [pid for pid in ids if (pid, ids_hash(ids[pid])) not in done]
        added[name] = len(todo)
        if not todo:
            continue
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        head, meta = load_checkpoint(DEFAULT_CHECKPOINTS / name / "head", model_weights_hash(model_path))
        estimator = LengthEstimator(model, tokenizer, {name: (head, meta)})
        current = checkpoint_hash(name)
        todo.sort(key=lambda pid: len(ids[pid]))  # similar lengths share a padded micro-batch
        with cache_path(name).open("a") as fh:
            for start in tqdm(range(0, len(todo), batch), desc=f"predict {name}", unit="batch"):
                chunk = todo[start:start + batch]
                for pid, prediction in zip(chunk, estimator.predict([ids[pid] for pid in chunk])):
                    row = {"prompt_id": pid, "ids": ids_hash(ids[pid]), "prompt_tokens": len(ids[pid]),
                           "checkpoint": current, "prediction": asdict(prediction)}
                    fh.write(json.dumps(row) + "\n")
                fh.flush()
    return added
