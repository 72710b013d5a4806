"""Inference entry point: prompts -> prefill features -> pooling -> head -> LengthPrediction.

Kept free of Ray and serving code so the prediction deployment, the benchmarks and the tests all
call the same object. Prompts are grouped by length into micro-batches under a padded-token
budget, so peak memory is bounded by the budget, not by how many or how long the prompts are.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn

from deployments.model_files import model_weights_hash
from predictor.checkpoint import CheckpointMeta, load_checkpoint
from predictor.features import FeatureConfig, extract_features, micro_batches, pad_left
from predictor.head import LengthHead, LengthPrediction, summarise
from predictor.pooling import pool

# A prompt is token ids (already templated, as the engine sees them), a raw user message (wrapped
# in the chat template with the generation prompt, as the dataset was generated), or chat messages.
Prompt = list[int] | str | list[dict]


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if prompt and isinstance(prompt[0], dict):
        return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False))
    return list(prompt)


class LengthEstimator:
    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        head: LengthHead,
        meta: CheckpointMeta,
        max_batch_tokens: int = 4096,
        max_batch_size: int = 32,
    ):
        entropy, attention = meta.pooling.needs()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.head = head.to(next(model.parameters()).device).eval()
        self.meta = meta
        self.features = FeatureConfig(layer=meta.feature_layer, entropy=entropy, attention=attention, debias=meta.debias)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @classmethod
    def load(
        cls, model_path: str | os.PathLike, checkpoint_path: str | os.PathLike, device: str = "cpu", **kwargs
    ) -> "LengthEstimator":
        """Load the serving model's weights from `model_path`; refuses a head trained on other weights."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        head, meta = load_checkpoint(checkpoint_path, expected_base_model_hash=model_weights_hash(model_path))
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
        return cls(model, AutoTokenizer.from_pretrained(model_path), head, meta, **kwargs)

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    @torch.no_grad()
    def predict(self, prompts: Sequence[Prompt]) -> list[LengthPrediction]:
        ids = [self.encode(p) for p in prompts]
        if any(len(s) == 0 for s in ids):
            raise ValueError("empty prompt")
        results: list[LengthPrediction | None] = [None] * len(ids)
        for group in micro_batches([len(s) for s in ids], self.max_batch_tokens, self.max_batch_size):
            input_ids, mask = pad_left([ids[i] for i in group], self.pad_id)
            features = extract_features(self.model, input_ids, mask, self.features)
            probs = torch.softmax(self.head(pool(features, self.meta.pooling)), dim=-1)
            for i, prediction in zip(group, summarise(probs, self.meta.bins)):
                results[i] = prediction
        return results
