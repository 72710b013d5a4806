"""One refit: a snapshot of the reservoir in, a candidate head and its held-out quality out.

Kept apart from the learner as a pure function of picklable data, so that it can run in a child
process at low priority (predictor.online.schedule) while the learner keeps taking labels.

The snapshot's held-out rows (a stable share of request keys, predictor.online.learner) drive
early stopping and calibration, as the validation prompts do offline, and are then the rows the
candidate is judged on. That makes its held-out MAE slightly optimistic; an earlier refit was
tuned on (mostly) the same rows, because the split is stable, so refits compete on equal terms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from torch import Tensor

from predictor.checkpoint import CheckpointMeta
from predictor.fit import FitConfig, fit_head, scorable
from predictor.head import LengthBins, LengthHead
from predictor.losses import LossConfig
from predictor.online.quality import evaluate
from predictor.pooling import PoolingConfig


@dataclass
class RefitData:
    """Everything a refit needs, detached from the learner."""

    x: Tensor  # [N, d]
    tokens: Tensor  # [N]
    censored: Tensor  # [N] bool
    heldout: Tensor  # [N] bool
    weight: Tensor  # [N] how much each held-out row counts when heads are compared (recency)
    bins: LengthBins
    loss: LossConfig
    fit: FitConfig
    model_id: str
    model_hash: str
    pooling: PoolingConfig
    observed: int  # requests offered to the reservoir when the snapshot was taken
    taken_at: float = field(default_factory=time.time)


@dataclass
class HeldOut:
    x: Tensor
    tokens: Tensor
    censored: Tensor
    weight: Tensor


@dataclass
class Candidate:
    head: LengthHead
    meta: CheckpointMeta
    heldout: HeldOut  # the rows it must beat the current head on
    quality: dict  # its held-out "mae", "mae_recent", "concordance", "scored"
    seconds: float  # wall time of the fit


def fit_candidate(data: RefitData) -> Candidate:
    start = time.perf_counter()
    train, held = ~data.heldout, data.heldout
    if not train.any() or not scorable(data.tokens[held].float(), data.censored[held], data.bins)[0].any():
        raise ValueError("a refit needs training rows and held-out rows of known length")
    as_prompts = lambda v: [[int(t)] for t in v.tolist()]  # noqa: E731  one sample per request
    head, metrics = fit_head(
        data.x[train], as_prompts(data.tokens[train]), data.x[held], as_prompts(data.tokens[held]), data.bins,
        data.loss, data.fit, as_prompts(data.censored[train]), as_prompts(data.censored[held]))
    heldout = HeldOut(data.x[held], data.tokens[held], data.censored[held], data.weight[held])
    quality = evaluate(head, data.bins, heldout.x, heldout.tokens, heldout.censored, heldout.weight)
    meta = CheckpointMeta(
        base_model_id=data.model_id, base_model_hash=data.model_hash, feature_layer=-1, feature_dim=data.x.shape[1],
        pooling=data.pooling, bins=data.bins, loss=data.loss, fit=data.fit, temperature=head.temperature,
        cdf_map=None if head.cdf_map is None else head.cdf_map.tolist(),
        training_data_version=f"online:{data.observed}",
        metrics={**metrics, "train_samples": float(train.sum()), "heldout_samples": float(held.sum()),
                 "censored_samples": float(data.censored.sum()),
                 **{f"heldout_{k}": float(v) for k, v in quality.items() if v is not None}},
    )
    return Candidate(head, meta, heldout, quality, time.perf_counter() - start)

