"""Fit a length head on per-prompt inputs: the one training loop of every method and benchmark.

Inputs are one vector per prompt (pooled prefill features, a proxy encoder's embedding); each
prompt carries all of its sampled lengths, and `FitConfig.targets` decides how they become
training rows (predictor.targets). Early stopping keeps the epoch with the lowest validation
error, judged per sample (every sampled length of a validation prompt is one error), whatever
the training targets. After training, a calibration fitted on the same validation prompts
(predictor.calibration) makes its quantiles honest; the head applies it to every output.

The options that suit 2-3k samples (weight decay, dropout, a smaller hidden layer, input
standardisation, an ensemble over seeds) are fields here so that the accuracy benchmark can
measure each, and a checkpoint records the ones its head was trained with.

Censored samples (stopped by their max_tokens; predictor.losses) train through their survival
likelihood. Early stopping and calibration read only the validation samples whose length the
head can score: the exact ones, and those censored at or beyond max_tokens, which in the head's
world are exact (their bin is the last one, their length clamped to max_tokens is how offline
training counts a truncated sample). A sample censored below the cap has no error to measure
(its length is anywhere above c, so an error against c would reward predicting short), and its
probability-integral transform is only known to lie in [F(c - 1), 1], so as a point it would
bend the CDF map. Dropping the ones at the cap as well would bias both toward short answers,
since truncation removes exactly the longest.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, Field

from predictor.calibration import Calibration, central_interval, fit_cdf_map, fit_temperature, interval_coverage
from predictor.head import LengthBins, LengthHead
from predictor.losses import LossConfig, length_loss
from predictor.targets import TargetMode, build_targets, sample_rows


class FitConfig(BaseModel):
    epochs: int = Field(200, ge=1)
    patience: int = Field(20, ge=1)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(64, ge=1)
    weight_decay: float = Field(1e-2, ge=0)
    dropout: float = Field(0.1, ge=0, lt=1)
    hidden: int | None = Field(None, ge=1)  # None: half the input width (EGTP)
    members: int = Field(1, ge=1)  # ensemble size; member m trains from seed seed * members + m
    standardise: bool = False  # z-score the inputs with training statistics
    targets: TargetMode = "samples"
    calibrate: Calibration = "quantile"  # fitted on the validation prompts
    seed: int = 0

    def architecture(self) -> dict:
        """LengthHead's keyword arguments."""
        return {"dropout": self.dropout, "hidden": self.hidden, "members": self.members}


def _ranks(x: torch.Tensor) -> torch.Tensor:
    return x.argsort().argsort().float()


def val_error(loss_name: str, expected: torch.Tensor, lengths: torch.Tensor) -> tuple[str, float]:
    """(name, value) of the early-stopping criterion, lower is better.

    MAE in tokens, except for a ranking loss: it fixes the order of predictions but not their
    scale, so its MAE says nothing about its epochs; those are judged by rank correlation.
    """
    if loss_name == "rank":
        if len(lengths) < 2:
            return "val_neg_spearman", 0.0  # no order to judge
        rho = torch.corrcoef(torch.stack([_ranks(expected), _ranks(lengths)]))[0, 1].nan_to_num(0.0)  # nan: constant
        return "val_neg_spearman", -rho.item()
    return "val_mae", (expected - lengths).abs().mean().item()


def _train_member(head: LengthHead, x, targets, x_val, y_val, bins: LengthBins, loss: LossConfig,
                  config: FitConfig, seed: int) -> tuple[float, int, int]:
    """AdamW on one single-member head; leaves it at its best validation epoch: (error, best
    epoch, epochs run)."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    best = (float("inf"), 0, None)
    for epoch in range(config.epochs):
        head.train()
        for batch in torch.randperm(len(targets.rows)).split(config.batch_size):
            opt.zero_grad()
            histogram = None if targets.histogram is None else targets.histogram[batch]
            censored = None if targets.censored is None else targets.censored[batch]
            length_loss(head(x[targets.rows[batch]]), targets.lengths[batch], bins, loss, histogram,
                        censored).backward()
            opt.step()
        head.eval()
        with torch.no_grad():
            _, error = val_error(loss.name, bins.expected(head(x_val).softmax(-1)), y_val)
        if error < best[0]:
            best = (error, epoch, {k: v.clone() for k, v in head.state_dict().items()})
        elif epoch - best[1] >= config.patience:
            break
    head.load_state_dict(best[2])
    return best[0], best[1], epoch + 1


def scorable(lengths: torch.Tensor, censored: torch.Tensor, bins: LengthBins) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, lengths) of the samples an error can be measured on: exact ones, and censored ones at
    or beyond the cap with their length clamped to max_tokens (see the module docstring)."""
    at_cap = censored & (lengths >= bins.max_tokens)
    return ~censored | at_cap, torch.where(at_cap, lengths.clamp(max=bins.max_tokens), lengths)


def fit_head(x_train: torch.Tensor, train_lengths: list[list[int]], x_val: torch.Tensor,
             val_lengths: list[list[int]], bins: LengthBins, loss: LossConfig,
             config: FitConfig = FitConfig(), train_censored: list[list[bool]] | None = None,
             val_censored: list[list[bool]] | None = None) -> tuple[LengthHead, dict[str, float]]:
    """A head (in eval mode, calibrated unless told not to) and its validation metrics.

    `x_*` hold one row per prompt, `*_lengths` every sampled length of each prompt and `*_censored`,
    if given, which of them were stopped by max_tokens (lower bounds).
    """
    head = LengthHead(x_train.shape[1], bins.k, **config.architecture())
    if config.standardise:
        head.fit_standardisation(x_train)
    targets = build_targets(train_lengths, config.targets, bins, train_censored)
    val_rows, y_val = sample_rows(val_lengths)
    if val_censored is not None:
        keep, y_val = scorable(y_val, torch.tensor([c for s in val_censored for c in s], dtype=torch.bool), bins)
        if not keep.any():
            raise ValueError("no validation sample with a known length to early-stop and calibrate on")
        val_rows, y_val = val_rows[keep], y_val[keep]
    x_val = x_val[val_rows]
    runs = []
    for m, member in enumerate(head.members):
        seed = config.seed * config.members + m
        torch.manual_seed(seed)  # the member's initial weights
        single = LengthHead(x_train.shape[1], bins.k, **{**config.architecture(), "members": 1})
        single.shift.copy_(head.shift)
        single.scale.copy_(head.scale)
        runs.append(_train_member(single, x_train, targets, x_val, y_val, bins, loss, config, seed))
        member.load_state_dict(single.members[0].state_dict())
    head.eval()
    metrics = {"best_epoch": sum(r[1] for r in runs) / len(runs), "epochs_run": sum(r[2] for r in runs) / len(runs)}
    with torch.no_grad():
        if config.calibrate == "temperature":
            head.temperature = fit_temperature(head.uncalibrated(x_val), y_val, bins)
        elif config.calibrate == "quantile":
            head.cdf_map = torch.tensor(fit_cdf_map(head(x_val).softmax(-1), y_val, bins))
        probs = head(x_val).softmax(-1)
    name, error = val_error(loss.name, bins.expected(probs), y_val)
    return head, {name: error, **metrics, "temperature": head.temperature,
                  "val_coverage_p10_p90": interval_coverage(*central_interval(probs, bins), y_val)}


def train_on_inputs(x_train: torch.Tensor, x_val: torch.Tensor, train_lengths: list[list[int]],
                    val_lengths: list[list[int]], num_bins: int, loss: LossConfig, max_tokens: int,
                    config: FitConfig = FitConfig()) -> tuple[LengthHead, LengthBins, dict[str, float]]:
    """Head on per-prompt inputs [P, d] of any origin; bins from the training lengths only."""
    _, y_train = sample_rows(train_lengths)
    bins = LengthBins.from_lengths(y_train, k=num_bins, max_tokens=max_tokens)
    head, metrics = fit_head(x_train, train_lengths, x_val, val_lengths, bins, loss, config)
    return head, bins, {**metrics, "train_samples": float(len(y_train)),
                        "val_samples": float(sum(len(x) for x in val_lengths))}
