"""How good a head is on served requests, censored ones included where that is honest.

MAE in tokens over the requests whose length the head can score (exact ones, and those censored
at or beyond the cap, which sit in its last bin: predictor.fit.scorable), the figure the offline
benchmarks report. Concordance (Harrell's C) is what a length-aware scheduler needs: the share of
request pairs whose predicted order matches their true order. A censored request enters a pair
only where the order is certain, i.e. against an exact one shorter than its cut.

Served traffic drifts, so the learner compares heads on a recency-weighted MAE too ("mae_recent",
predictor.online.learner): the same rows, each weighted by how recent it is.
"""

from __future__ import annotations

import torch
from torch import Tensor

from predictor.fit import scorable
from predictor.head import LengthBins, LengthHead


def concordance(predicted: Tensor, tokens: Tensor, censored: Tensor) -> float | None:
    """Share of ordered pairs that the prediction orders the same way (ties in the prediction count
    half); None without any pair of known order."""
    tokens = tokens.float()
    # i is certainly shorter than j when i is exact and shorter than j's length or cut.
    shorter = (~censored)[:, None] & (tokens[:, None] < tokens[None, :])
    pairs = shorter.sum().item()
    if not pairs:
        return None
    p = predicted.float()
    agree = (p[:, None] < p[None, :]).float() + 0.5 * (p[:, None] == p[None, :]).float()
    return (agree * shorter).sum().item() / pairs


def mae(predicted: Tensor, tokens: Tensor, censored: Tensor, bins: LengthBins,
        weight: Tensor | None = None) -> float | None:
    keep, target = scorable(tokens.float(), censored, bins)
    if not keep.any():
        return None
    error = (predicted.float()[keep] - target[keep]).abs()
    if weight is None:
        return error.mean().item()
    w = weight.float()[keep]
    if w.sum() <= 0:  # every scored row too old to weigh: judge them alike rather than not at all
        return error.mean().item()
    return ((error * w).sum() / w.sum()).item()


@torch.no_grad()
def evaluate(head: LengthHead, bins: LengthBins, x: Tensor, tokens: Tensor, censored: Tensor,
             weight: Tensor | None = None) -> dict:
    """{"mae", "mae_recent" (weighted by `weight`), "concordance", "scored"} of the head's expected
    length on these requests."""
    expected = bins.expected(head(x).softmax(-1))
    keep, _ = scorable(tokens.float(), censored, bins)
    return {"mae": mae(expected, tokens, censored, bins), "mae_recent": mae(expected, tokens, censored, bins, weight),
            "concordance": concordance(expected, tokens, censored), "scored": int(keep.sum())}
