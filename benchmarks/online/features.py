"""Last-token features of every prompt in the dataset, the learner's input, from the shared cache.

The learner sees what the serving stack would hand it: the final-layer hidden state of the last
prompt token (pooling "last", 576 floats on the embedded model). They come from predictor.train's
FeatureCache, so the accuracy benchmark's cache is reused and whatever is missing is extracted
once, on one thread (the machine is shared with engines), and timed for the report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from predictor.dataset import load_samples
from predictor.features import FeatureConfig
from predictor.train import CACHE_DIR, DEFAULT_TRAIL_LAYER, RECIPES, FeatureCache, open_dataset, pooled_inputs

DATASET = Path(__file__).resolve().parents[1] / "datasets" / "smollm2-135m-instruct"


@dataclass
class Request:
    """One sampled answer as the live system would see it: a request id, its prompt's features and
    the length it generated; `prompt_id` groups a prompt's samples (RL rollouts arrive together)."""

    request_id: str
    prompt_id: str
    scenario: str
    prompt_tokens: int
    tokens: int
    vector: torch.Tensor


def load_requests(dataset: Path = DATASET, cache_dir: Path = CACHE_DIR) -> tuple[list[Request], dict]:
    """Every sample of the dataset as a request, and the dataset's model, its max_tokens and how long
    the missing features took ("extraction")."""
    _, model_hash, tokenizer, settings, splits = open_dataset("embedded", dataset, needed=())
    examples = [e for split in splits.values() for e in split]
    cache = FeatureCache(cache_dir, model_hash, FeatureConfig(aux_layer=DEFAULT_TRAIL_LAYER))
    missing = cache.missing(examples)
    timing = {"prompts": len(examples), "extracted": len(missing), "seconds": 0.0, "threads": 1}
    if missing:
        from transformers import AutoModelForCausalLM

        from predictor.model_files import resolve_model_source

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        model = AutoModelForCausalLM.from_pretrained(resolve_model_source("embedded"), dtype=torch.float32).eval()
        start = time.perf_counter()
        cache.fill(model, missing, tokenizer.pad_token_id)
        timing["seconds"] = time.perf_counter() - start
        timing["tokens"] = sum(len(e.ids) for e in missing)
        torch.set_num_threads(threads)
    vectors = dict(zip((e.prompt_id for e in examples),
                       pooled_inputs(cache, examples, RECIPES["last_ens5"], debias=True)))
    requests = [Request(f"{r['prompt_id']}#{r['sample_idx']}", r["prompt_id"], r["scenario"], r["prompt_tokens"],
                        int(r["output_tokens"]), vectors[r["prompt_id"]]) for r in load_samples(dataset)]
    return requests, {"model_id": settings["model_id"], "model_hash": model_hash,
                      "max_tokens": int(settings["max_tokens"]), "extraction": timing}
