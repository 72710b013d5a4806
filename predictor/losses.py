"""Training losses for the length head, selectable by name.

Every loss is a weighted sum of components that read the same batch view, so the paper's
configurations and ablations are rows of `LOSSES`, not separate code paths:
- "crps+smoothl1": ESTP (distribution shape + accurate expected length),
- "ce+mse": EGTP (0.95 CE on soft labels + 0.05 MSE),
- "crps" and "smoothl1": the ESTP ablations without the other term,
- "ce": classification over bins alone (TRAIL-style baseline),
- "rank": a pairwise ranking loss for the LTR-C baseline.

Targets: a prompt sampled several times has a distribution of lengths, not one length. The
distribution terms (CRPS, CE) read a target histogram over the bins, one-hot for a single sample
and the empirical distribution of a prompt's samples for multi-sample targets (ProD); the point
terms (SmoothL1, MSE, rank) read one target length per row (predictor.targets builds both).

Scale: lengths enter as length / max_tokens. That keeps the regression terms in [0, 1] whatever
the generation limit, and linear (not log) because the target metric, MAE in tokens, and the
padding a scheduler wastes are both linear in tokens. CRPS is divided by max_tokens too, so it
is on the same scale (for a one-hot prediction CRPS equals the absolute error).

Censored rows: a request stopped by its max_tokens = c did not reveal its length, only that it is
at least c. Treating c as the length would teach the head that such prompts stop at c; dropping
the row would teach it that long answers are rarer than they are (exactly the longest are the
ones cut). So a censored row contributes the likelihood of what was seen, -log P(L >= c) under the
head's bins (`LengthBins.survival`), and exact rows the configured loss; each row weighs 1/N of
the batch either way. Without censored rows the loss is computed exactly as before.
The two are on different scales (nats against fractions of max_tokens), so a censored row pulls
harder than an exact one: with a fifth of the rows cut at the cap, this raised the MAE of heads
learned online by about 5% against counting those rows as exact at the cap, which is why
predictor.online.learner does the latter for rows cut at the cap (benchmarks/results/online.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import Tensor

from predictor.head import LengthBins


class LossConfig(BaseModel):
    name: str = "crps+smoothl1"
    tau: float = Field(1.0, gt=0)  # soft-label width in bins (CE)
    # SmoothL1 switches from quadratic to linear at this normalised error (0.05 x 1,024 = 51
    # tokens): sampling noise gives long-tailed errors that should not dominate the gradient.
    beta: float = Field(0.05, gt=0)
    # Ranking margin scale in normalised length units: pairs this far apart count as ordered.
    rank_temperature: float = Field(0.05, gt=0)


@dataclass
class _Batch:
    log_probs: Tensor  # [N, K]
    expected: Tensor  # [N] expected length / max_tokens
    target: Tensor  # [N] true length / max_tokens
    histogram: Tensor  # [N, K] target distribution over the bins
    bins: LengthBins
    config: LossConfig


def crps(log_probs: Tensor, histogram: Tensor, bins: LengthBins) -> Tensor:
    """Exact CRPS-style distance between the predicted and the target distribution on bin centres.

    Both CDFs are step functions that jump only at centres, so the integral of their squared
    difference is a sum over the gaps between consecutive centres: sum_k (F_k - G_k)^2 (c_{k+1} - c_k).
    Divided by max_tokens; 0 when the prediction equals the target (for a one-hot target, the
    CRPS against the true bin's centre).
    """
    centres = bins.centres_t().to(log_probs.device)
    cdf = log_probs.exp().cumsum(-1)[:, :-1]
    truth = histogram.float().cumsum(-1)[:, :-1]
    return (((cdf - truth) ** 2) * (centres[1:] - centres[:-1])).sum(-1).mean() / bins.max_tokens


def _crps(b: _Batch) -> Tensor:
    return crps(b.log_probs, b.histogram, b.bins)


def _smoothl1(b: _Batch) -> Tensor:
    return F.smooth_l1_loss(b.expected, b.target, beta=b.config.beta)


def _ce(b: _Batch) -> Tensor:
    """Cross-entropy against the target histogram blurred by EGTP's soft labels (each sample's
    soft labels, averaged)."""
    k = torch.arange(b.bins.k, device=b.log_probs.device)
    soft = b.histogram.float() @ b.bins.soft_labels(k, b.config.tau)
    return -(soft * b.log_probs).sum(-1).mean()


def _mse(b: _Batch) -> Tensor:
    return F.mse_loss(b.expected, b.target)


def _rank(b: _Batch) -> Tensor:
    """RankNet-style logistic loss over every pair in the batch with different true lengths."""
    longer = b.target[:, None] > b.target[None, :]
    if not longer.any():
        return b.expected.sum() * 0.0
    margin = (b.expected[:, None] - b.expected[None, :]) / b.config.rank_temperature
    return F.softplus(-margin[longer]).mean()


COMPONENTS: dict[str, Callable[[_Batch], Tensor]] = {
    "crps": _crps, "smoothl1": _smoothl1, "ce": _ce, "mse": _mse, "rank": _rank,
}

LOSSES: dict[str, dict[str, float]] = {
    "crps+smoothl1": {"crps": 1.0, "smoothl1": 1.0},
    "ce+mse": {"ce": 0.95, "mse": 0.05},
    "ce": {"ce": 1.0},
    "crps": {"crps": 1.0},
    "smoothl1": {"smoothl1": 1.0},
    "rank": {"rank": 1.0},
}


def censored_nll(log_probs: Tensor, lengths: Tensor, bins: LengthBins) -> Tensor:
    """-log P(L >= c) per row, for rows whose generation was stopped at c tokens."""
    return -bins.survival(log_probs.exp(), lengths).clamp(min=1e-12).log()


def length_loss(logits: Tensor, lengths: Tensor, bins: LengthBins, config: LossConfig = LossConfig(),
                histogram: Tensor | None = None, censored: Tensor | None = None) -> Tensor:
    """Scalar loss for head logits [N, K] against target lengths [N] (tokens) and, for the
    distribution terms, target histograms [N, K] (default: one-hot of each length's bin).
    `censored` [N] bool marks rows whose length is only known to be at least `lengths`."""
    if config.name not in LOSSES:
        raise KeyError(f"unknown loss {config.name!r}; choose from {sorted(LOSSES)}")
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    lengths = lengths.float()
    if censored is None or not censored.any():
        return _configured_loss(log_probs, lengths, bins, config, histogram)
    exact = ~censored
    total = censored_nll(log_probs[censored], lengths[censored], bins).sum()
    if exact.any():
        part = None if histogram is None else histogram[exact]
        total = total + exact.sum() * _configured_loss(log_probs[exact], lengths[exact], bins, config, part)
    return total / len(lengths)


def _configured_loss(log_probs: Tensor, lengths: Tensor, bins: LengthBins, config: LossConfig,
                     histogram: Tensor | None) -> Tensor:
    batch = _Batch(
        log_probs=log_probs,
        expected=bins.expected(log_probs.exp()) / bins.max_tokens,
        target=lengths.clamp(max=bins.max_tokens) / bins.max_tokens,
        histogram=F.one_hot(bins.index(lengths), bins.k).float() if histogram is None else histogram,
        bins=bins,
        config=config,
    )
    return sum(weight * COMPONENTS[part](batch) for part, weight in LOSSES[config.name].items())
