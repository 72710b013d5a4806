"""Token pooling: turn per-token prefill features into one vector per prompt.

ESTP weights each token by how much the final layer attends to it (S, semantic importance) and
by how uncertain the model is there (H, entropy), because both mark tokens that shape the answer
length; EGTP, average and last-token pooling are the baselines and ablations it is compared with.
All methods only produce weights over tokens; the pooled vector is always sum_i w_i h_i.

Two choices the paper leaves open, made here:
- Attention sink. The first real token (`<|im_start|>`) receives about half of all attention, so
  it would dominate S. Under causal attention its hidden state depends on nothing after it, i.e.
  it is the same vector for every prompt and carries no information about this one. So ESTP
  gives it weight 0 and leaves it out of the normalisation statistics (`mask_sink`).
- Last token. No query follows it, so it receives no attention, yet it is the state the model
  decodes from. Masking it would discard the most predictive token; its S is instead set to the
  mean S of the other pooled tokens, which z-scores to exactly 0: neutral, so its weight comes
  from its entropy alone.

Combined views (`method="concat"`): the pooled vectors of several methods side by side, e.g. ESTP's
pooled state next to the last token's state. On the embedded model ESTP spreads its weight over
~38 tokens and gives the last token about 1.3%, while the last token alone predicts better than
any pooling (benchmarks/results/predictor_accuracy.md): concatenation lets the head read both
without choosing between them.

Normalisation (default z-score over the pooled tokens of each prompt): S and H live on unrelated
scales (debiased S is a mean attention share, which shrinks like 1/length; H is in nats), so they
must be put on a common scale before mixing with lambda. Z-score rather than min-max because S is
heavy-tailed: with min-max one outlier squeezes every other token near 0, and values confined to
[0, 1] make softmax(T / alpha) nearly uniform at alpha = 1. With z-scores, alpha is a temperature
in standard deviations, comparable across prompts of any length.
"""

from __future__ import annotations

from typing import Callable, Literal

import torch
from pydantic import BaseModel, Field, model_validator
from torch import Tensor

from predictor.features import PrefillFeatures, last_positions

Method = Literal["estp", "egtp", "avg", "last"]


class PoolingConfig(BaseModel):
    method: Method | Literal["concat"] = "estp"
    lam: float = Field(0.5, ge=0.0, le=1.0)  # lambda1 on S; lambda2 = 1 - lam on H
    alpha: float = Field(1.0, gt=0.0)  # softmax temperature
    normalisation: Literal["zscore", "minmax", "none"] = "zscore"
    mask_sink: bool = True
    # concat: the methods whose pooled vectors are concatenated, in this order (ESTP's settings above
    # apply to its part).
    views: list[Method] = []

    @model_validator(mode="after")
    def _views_only_for_concat(self) -> "PoolingConfig":
        if (self.method == "concat") != bool(self.views) or len(set(self.views)) != len(self.views):
            raise ValueError(f"method concat needs distinct views, other methods none: {self.method} {self.views}")
        return self

    def parts(self) -> list["PoolingConfig"]:
        """One config per pooled vector: the views of a concat, else itself."""
        if self.method != "concat":
            return [self]
        return [self.model_copy(update={"method": view, "views": []}) for view in self.views]

    def needs(self) -> tuple[bool, bool]:
        """(entropy, attention) the method reads, so extraction can skip the rest."""
        entropy = attention = False
        for part in self.parts():
            if part.method == "estp":
                entropy, attention = entropy or part.lam < 1.0, attention or part.lam > 0.0
            else:
                entropy = entropy or part.method == "egtp"
        return entropy, attention


def _one_hot_at(positions: Tensor, mask: Tensor) -> Tensor:
    out = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
    out[torch.arange(mask.shape[0], device=mask.device), positions] = True
    return out & mask


def first_token(mask: Tensor) -> Tensor:
    """[B, T] bool marking each row's first real token, the attention sink."""
    return _one_hot_at(mask.long().argmax(-1), mask)


def last_token(mask: Tensor) -> Tensor:
    return _one_hot_at(last_positions(mask), mask)


def masked_softmax(scores: Tensor, keep: Tensor) -> Tensor:
    """Softmax over the kept tokens of each row; the rest get exactly 0."""
    return scores.masked_fill(~keep, float("-inf")).softmax(dim=-1).nan_to_num(0.0)


def normalise(values: Tensor, keep: Tensor, how: str) -> Tensor:
    """Per-row normalisation using only the kept tokens' statistics; constant rows map to 0."""
    if how == "none":
        return values
    n = keep.sum(-1, keepdim=True).clamp(min=1)
    if how == "zscore":
        mean = (values * keep).sum(-1, keepdim=True) / n
        std = (((values - mean) * keep) ** 2).sum(-1, keepdim=True).div(n).sqrt()
        return (values - mean) / std.clamp(min=1e-6)
    lo = values.masked_fill(~keep, float("inf")).amin(-1, keepdim=True)
    hi = values.masked_fill(~keep, float("-inf")).amax(-1, keepdim=True)
    return (values - lo) / (hi - lo).clamp(min=1e-6)


def pooled_tokens(mask: Tensor, mask_sink: bool) -> Tensor:
    """Tokens that may get weight; the sink stays in when it is a row's only token."""
    keep = mask & ~first_token(mask) if mask_sink else mask.clone()
    empty = ~keep.any(-1)
    keep[empty] = mask[empty]
    return keep


def _estp(f: PrefillFeatures, cfg: PoolingConfig) -> Tensor:
    keep = pooled_tokens(f.mask, cfg.mask_sink)
    score = torch.zeros(f.mask.shape, dtype=torch.float32, device=f.mask.device)
    if cfg.lam > 0:
        if f.attention_received is None:
            raise ValueError("ESTP with lam > 0 needs attention_received features")
        s = f.attention_received.clone()
        last = last_token(f.mask) & keep
        others = keep & ~last
        mean_others = (s * others).sum(-1) / others.sum(-1).clamp(min=1)
        s[last] = mean_others[last.any(-1)]
        score = score + cfg.lam * normalise(s, keep, cfg.normalisation)
    if cfg.lam < 1:
        if f.entropy is None:
            raise ValueError("ESTP with lam < 1 needs entropy features")
        score = score + (1 - cfg.lam) * normalise(f.entropy, keep, cfg.normalisation)
    return masked_softmax(score / cfg.alpha, keep)


def _egtp(f: PrefillFeatures, cfg: PoolingConfig) -> Tensor:
    """EGTP as published: softmax of raw entropy over all real tokens, no sink handling."""
    if f.entropy is None:
        raise ValueError("EGTP pooling needs entropy features")
    return masked_softmax(f.entropy, f.mask)


def _avg(f: PrefillFeatures, cfg: PoolingConfig) -> Tensor:
    return f.mask.float() / f.mask.sum(-1, keepdim=True).clamp(min=1)


def _last(f: PrefillFeatures, cfg: PoolingConfig) -> Tensor:
    return last_token(f.mask).float()


WEIGHTS: dict[str, Callable[[PrefillFeatures, PoolingConfig], Tensor]] = {
    "estp": _estp, "egtp": _egtp, "avg": _avg, "last": _last,
}


def pooling_weights(features: PrefillFeatures, config: PoolingConfig) -> Tensor:
    """[B, T] weights of one pooling method, each row summing to 1 over real tokens, 0 on padding."""
    if config.method == "concat":
        raise ValueError("a concat pooling has one weight row per view: ask each of config.parts()")
    return WEIGHTS[config.method](features, config)


def pool(features: PrefillFeatures, config: PoolingConfig) -> Tensor:
    """[B, d] pooled representation sum_i w_i h_i ([B, views x d] for a concat)."""
    return torch.cat([torch.einsum("bt,btd->bd", pooling_weights(features, part), features.hidden)
                      for part in config.parts()], dim=-1)
