"""Calibration of the head's length distribution, fitted on held-out prompts, and its coverage.

A head trained on a few thousand noisy samples and early-stopped on MAE is overconfident: its
[p10, p90] holds ~70-75% of true lengths, not 80%, so the quantiles the router uses for
conservative batching and tail-aware ordering mean something else than they say. Two fixes,
both fitted on the validation prompts and applied by LengthHead to every output:
- "temperature": one scalar dividing the logits, fitted by the negative log-likelihood of the
  true lengths' bins. It reaches 80% but flattens toward the bins' average: on the embedded
  model the NLL-optimal temperature (~2-3) costs 15-20 tokens of MAE, because bin likelihood
  ignores how far apart bins are.
- "quantile" (the default; Kuleshov et al., ICML 2018): a monotone map R of the predicted CDF,
  the empirical CDF of the probability-integral transforms u = F(y) of held-out lengths, so that
  G = R(F) puts the right share of lengths below each of its quantiles. It widens the tails
  where the head is overconfident and leaves the median about where it was.

Lengths are integers while the bins' uniform-within-bin CDF is continuous: a length l stands for
(l - 1, l] of that continuous variable. So its PIT is the midpoint (F(l - 1) + F(l)) / 2, and l
lies in the central interval exactly when ceil(p10) <= l <= ceil(p90); without the ceiling, a
truncated answer (l = max_tokens) would count as outside whenever p90 falls inside the last bin
(max_tokens - 1, max_tokens].
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from predictor.head import LengthBins

Calibration = Literal["none", "temperature", "quantile"]
# log10 of the temperatures tried: 0.05 to 20 in steps of about 2%, with T = 1 among them.
_LOG10_GRID = torch.linspace(-1.3, 1.3, 261)
CDF_KNOTS = 20  # R is piecewise linear between 0, 1/20, ..., 1


def bin_nll(logits: Tensor, lengths: Tensor, bins: LengthBins, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the true lengths' bins under softmax(logits / T)."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -log_probs.gather(-1, bins.index(lengths)[:, None]).mean().item()


@torch.no_grad()
def fit_temperature(logits: Tensor, lengths: Tensor, bins: LengthBins) -> float:
    """The temperature in [0.05, 20] minimising `bin_nll` on held-out logits (one row per sample)."""
    temperatures = (10 ** _LOG10_GRID).tolist()
    return min(temperatures, key=lambda t: bin_nll(logits, lengths, bins, t))


def pit(probs: Tensor, lengths: Tensor, bins: LengthBins) -> Tensor:
    """Probability-integral transform of integer lengths (midpoint of (l - 1, l])."""
    return (bins.cdf(probs, lengths - 1) + bins.cdf(probs, lengths)) / 2


@torch.no_grad()
def fit_cdf_map(probs: Tensor, lengths: Tensor, bins: LengthBins, knots: int = CDF_KNOTS) -> list[float]:
    """R at 0, 1/knots, ..., 1: the share of held-out PITs at or below each point (R(0) = 0,
    R(1) = 1), so that R(F(y)) is uniform on those lengths."""
    u = pit(probs, lengths, bins)
    grid = torch.linspace(0, 1, knots + 1)
    r = (u[None, :] <= grid[:, None]).float().mean(-1)
    r[0], r[-1] = 0.0, 1.0
    return r.tolist()


def interval_coverage(lower, upper, lengths) -> float:
    """Share of integer lengths inside [ceil(lower), ceil(upper)] (see the module docstring)."""
    lo, hi, y = (torch.as_tensor(v, dtype=torch.float64) for v in (lower, upper, lengths))
    return ((y >= torch.ceil(lo)) & (y <= torch.ceil(hi))).double().mean().item()


def central_interval(probs: Tensor, bins: LengthBins, mass: float = 0.8) -> tuple[Tensor, Tensor]:
    """(lower, upper) quantiles holding the central `mass` of each distribution (p10, p90 at 0.8)."""
    tail = (1 - mass) / 2
    return bins.quantile(probs, tail), bins.quantile(probs, 1 - tail)
