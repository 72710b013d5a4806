"""Training targets from prompts with one or several sampled lengths.

The same prompt sampled again gives another length (71% of an RL prompt's length variance is
sampling noise), so a single sample is a noisy label. Where a prompt has several samples they can
be used three ways:
- "samples": one row per sample (each prompt's input repeated), the plain per-sample target;
  a prompt with 8 samples weighs 8 times one with a single sample;
- "median": one row per prompt whose point target is the sample median, the MAE-optimal value;
- "distribution": one row per prompt, point target the median and distribution target the
  empirical histogram of its samples over the bins (ProD, arXiv 2604.07931), so CRPS and CE fit
  the spread rather than one draw of it.
For a single-sample prompt all three give the same row.

A sample stopped by its max_tokens is censored: its length is a lower bound (predictor.losses).
Only "samples" takes censored samples, as rows of their own; a median or histogram of a prompt
with a lower bound among its samples is not known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from predictor.head import LengthBins

TargetMode = Literal["samples", "median", "distribution"]


@dataclass
class Targets:
    rows: Tensor  # [N] long: the prompt (index into the examples) each row reads
    lengths: Tensor  # [N] point target in tokens
    histogram: Tensor | None  # [N, K] distribution target; None: one-hot of `lengths`
    censored: Tensor | None = None  # [N] bool: `lengths` is a lower bound; None: every row exact


def sample_rows(lengths: list[list[int]]) -> tuple[Tensor, Tensor]:
    """(prompt index, length) for every sample of every prompt."""
    rows = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor([len(x) for x in lengths]))
    return rows, torch.tensor([x for sample in lengths for x in sample], dtype=torch.float32)


def build_targets(lengths: list[list[int]], mode: TargetMode, bins: LengthBins,
                  censored: list[list[bool]] | None = None) -> Targets:
    """Training rows for prompts with the given sampled lengths (one list per prompt) and, if given,
    which of those samples are censored (same shape)."""
    flags = None if censored is None else torch.tensor([c for sample in censored for c in sample], dtype=torch.bool)
    if flags is not None and [len(x) for x in censored] != [len(x) for x in lengths]:
        raise ValueError("censored flags must match the sampled lengths one for one")
    if mode == "samples":
        return Targets(*sample_rows(lengths), None, flags)
    if flags is not None and flags.any():
        raise ValueError(f"target mode {mode!r} needs exact lengths; censored samples need 'samples'")
    # quantile(0.5) averages the middle two of an even count, as np.median does.
    medians = torch.stack([torch.tensor(x, dtype=torch.float32).quantile(0.5) for x in lengths])
    rows = torch.arange(len(lengths))
    if mode == "median":
        return Targets(rows, medians, None)
    if mode == "distribution":
        histogram = torch.stack([
            F.one_hot(bins.index(torch.tensor(x, dtype=torch.float32)), bins.k).float().mean(0) for x in lengths
        ])
        return Targets(rows, medians, histogram)
    raise ValueError(f"unknown target mode {mode!r}")
