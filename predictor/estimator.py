"""Inference entry point: prompts -> one prefill -> every head's pooling and distribution.

Kept free of Ray and serving code so the prediction deployment, the benchmarks and the tests all
call the same object. Several heads (ESTP and EGTP, for runs that compare them) share one
prefill: features are extracted once, for the union of what the heads read, and only the cheap
pooling and head run per head. Prompts are grouped by length into micro-batches under a
padded-token budget, so peak memory is bounded by the budget, not by how many or how long the
prompts are. A bad prompt (empty, ids outside the vocabulary, beyond the length limit) fails
alone (`predict_each`), never the batch it shares.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn

from predictor.checkpoint import CheckpointMeta, load_checkpoint
from predictor.features import (MAX_PADDING, FeatureConfig, PrefillFeatures, check_supported, extract_features,
                                micro_batches, pad_left)
from predictor.head import LengthHead, LengthPrediction, summarise
from predictor.model_files import model_weights_hash
from predictor.pooling import PoolingConfig, pool

# A prompt is token ids (already templated, as the engine sees them), a raw user message (wrapped
# in the chat template with the generation prompt, as the dataset was generated), or chat messages.
Prompt = list[int] | str | list[dict]
Heads = dict[str, tuple[LengthHead, CheckpointMeta]]


class InvalidPrompt(ValueError):
    """This prompt cannot be predicted; the others of its batch still are."""


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if prompt and isinstance(prompt[0], dict):
        return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False))
    return list(prompt)


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


def head_predictions(heads: Heads, features: PrefillFeatures) -> list[dict[str, LengthPrediction]]:
    """Every head's prediction for each prompt of a batch of features: the one place a head is
    applied, for live prefills and for cached features alike."""
    rows: list[dict[str, LengthPrediction]] = [{} for _ in range(features.mask.shape[0])]
    for name, (head, meta) in heads.items():
        probs = torch.softmax(head(pool(features, meta.pooling)), dim=-1)
        for row, prediction in zip(rows, summarise(probs, meta.bins)):
            row[name] = prediction
    return rows


def prompt_tail(ids: list[int], keep: int | None) -> list[int]:
    """The tokens a prompt is predicted from: its last `keep` (None: all). The end of a prompt
    holds the question that sets the answer's length; the simulator's prediction cache cuts
    prompts here too, so it predicts what the deployed estimator does."""
    return ids if keep is None else ids[-keep:]


class LengthEstimator:
    """The serving model's weights plus trained heads; the first head is the default.

    With `learn` (a pooling), each prediction also returns that pooling of the prompt, the input
    a learning head trains on (predictor.online); the estimator can then start with no head at
    all (a cold start: features, no predictions) and take heads as they are learned (`set_head`).

    With `truncate_prompt_tokens`, a longer prompt is predicted from its last N tokens: the
    prefill's cost grows with the prompt, and on a CPU it competes with the engines' decoding
    (docs/benchmarks.md measures the cost and the accuracy it gives up).
    """

    def __init__(self, model: nn.Module, tokenizer, heads: Heads, max_batch_tokens: int = 4096,
                 max_batch_size: int = 32, max_prompt_tokens: int | None = None,
                 learn: PoolingConfig | None = None, truncate_prompt_tokens: int | None = None):
        self.device = next(model.parameters()).device
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.heads = {name: (head.to(self.device).eval(), meta) for name, (head, meta) in heads.items()}
        self.default = next(iter(self.heads), None)
        self.learn = learn
        metas = [meta for _, meta in self.heads.values()]
        self.features = shared_features(metas) if metas else FeatureConfig(entropy=False, attention=False)
        if learn is not None:
            self.features = self.features.model_copy(update={
                "entropy": self.features.entropy or learn.needs()[0], "attention": self.features.attention or learn.needs()[1]})
        check_supported(self.model, self.features)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_prompt_tokens = max_prompt_tokens
        self.truncate_prompt_tokens = truncate_prompt_tokens
        self.max_padding = MAX_PADDING
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @classmethod
    def load(
        cls, model_path: str | os.PathLike, checkpoints: str | os.PathLike | dict[str, str | os.PathLike],
        device: str = "cpu", dtype: torch.dtype = torch.float32, **kwargs,
    ) -> "LengthEstimator":
        """Load the serving model's weights from `model_path` and the heads (name -> checkpoint, or
        one checkpoint path); refuses a head trained on other weights."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not isinstance(checkpoints, dict):
            checkpoints = {"default": checkpoints}
        weights = model_weights_hash(model_path)
        heads = {name: load_checkpoint(path, expected_base_model_hash=weights) for name, path in checkpoints.items()}
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
        return cls(model, AutoTokenizer.from_pretrained(model_path), heads, **kwargs)

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def validate(self, ids: list[int]) -> None:
        if not ids:
            raise InvalidPrompt("empty prompt")
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise InvalidPrompt(f"{len(ids)} prompt tokens > {self.max_prompt_tokens}")
        bad = next((i for i in ids if not (isinstance(i, int) and 0 <= i < self.vocab_size)), None)
        if bad is not None:
            raise InvalidPrompt(f"token id {bad!r} outside the vocabulary (0..{self.vocab_size - 1})")

    def set_head(self, name: str, head: LengthHead, meta: CheckpointMeta) -> None:
        """Serve `head` as `name` from the next batch on. The heads are replaced as one mapping, so
        a batch that already started keeps the heads it started with: never half of a swap."""
        if meta.feature_layer != self.features.layer:
            raise ValueError(f"head {name} reads layer {meta.feature_layer}, this estimator extracts {self.features.layer}")
        entropy, attention = meta.pooling.needs()
        if (entropy and not self.features.entropy) or (attention and not self.features.attention):
            raise ValueError(f"head {name} pools features this estimator does not extract")
        self.heads = {**self.heads, name: (head.to(self.device).eval(), meta)}

    def predict_each(self, ids: list[list[int]]) -> list[dict[str, LengthPrediction] | InvalidPrompt]:
        """Per prompt, every head's prediction, or the reason it cannot be predicted."""
        return self.predict_and_pool(ids)[0]

    @torch.no_grad()
    def predict_and_pool(self, ids: list[list[int]]) -> tuple[list[dict[str, LengthPrediction] | InvalidPrompt],
                                                              list[torch.Tensor | None]]:
        """Per prompt, every head's prediction (or why it cannot be predicted), and its `learn`
        pooling (None without `learn`, or for an invalid prompt)."""
        heads = self.heads  # one mapping for the whole call (set_head may replace it meanwhile)
        results: list = [None] * len(ids)
        vectors: list[torch.Tensor | None] = [None] * len(ids)
        valid = []
        for i, seq in enumerate(ids):
            try:
                self.validate(seq)
                valid.append(i)
            except InvalidPrompt as e:
                results[i] = e
        ids = [prompt_tail(seq, self.truncate_prompt_tokens) for seq in ids]
        for group in micro_batches([len(ids[i]) for i in valid], self.max_batch_tokens, self.max_batch_size,
                                   self.max_padding):
            members = [valid[g] for g in group]
            input_ids, mask = pad_left([ids[i] for i in members], self.pad_id)
            features = extract_features(self.model, input_ids, mask, self.features)
            for i, row in zip(members, head_predictions(heads, features)):
                results[i] = row
            if self.learn is not None:
                for i, vector in zip(members, pool(features, self.learn).float().cpu()):
                    vectors[i] = vector
        return results, vectors

    def predict(self, prompts: Sequence[Prompt]) -> list[LengthPrediction]:
        """The default head's predictions (offline use): any invalid prompt raises."""
        if self.default is None:
            raise ValueError("no head to predict with")
        out = []
        for result in self.predict_each([self.encode(p) for p in prompts]):
            if isinstance(result, InvalidPrompt):
                raise result
            out.append(result[self.default])
        return out
