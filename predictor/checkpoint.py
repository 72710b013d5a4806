"""Save and load a trained length head with everything needed to reproduce its inputs.

The head only makes sense on features of the exact base model it was trained on (same weights,
same layer, same pooling), so the sidecar records them and loading refuses a mismatched base model
instead of silently predicting garbage. Weights go to `<name>.safetensors` (no pickle), settings
to `<name>.json` beside it, readable without torch.

Format 2 added the head's fitting settings (hidden width, ensemble members), its input
standardisation and its calibration (temperature, CDF map); a format-1 checkpoint (one MLP, no
standardisation, temperature 1) still loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from pydantic import BaseModel, Field
from safetensors.torch import load_file, save_file

from predictor.fit import FitConfig
from predictor.head import LengthBins, LengthHead
from predictor.losses import LossConfig
from predictor.pooling import PoolingConfig

FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)


class BaseModelMismatchError(ValueError):
    def __init__(self, checkpoint: str | os.PathLike, trained_on: str, serving: str):
        super().__init__(
            f"checkpoint {checkpoint} was trained on base model weights {trained_on}, "
            f"but the serving model's weights hash is {serving}; retrain the head for this model"
        )
        self.trained_on = trained_on
        self.serving = serving


class CheckpointMeta(BaseModel):
    format: int = FORMAT_VERSION
    base_model_id: str
    base_model_hash: str
    feature_layer: int  # FeatureConfig.layer the pooled hidden states come from
    feature_dim: int
    debias: bool = True  # FeatureConfig.debias of the attention features
    pooling: PoolingConfig
    bins: LengthBins
    loss: LossConfig
    fit: FitConfig = FitConfig()  # format 1 recorded only its dropout, 0.1 = FitConfig's default
    # The calibration LengthHead applies (predictor.calibration): a logit temperature and/or a map
    # of the predicted CDF at 0, 1/M, ..., 1.
    temperature: float = Field(1.0, gt=0)
    cdf_map: list[float] | None = None
    training_data_version: str
    metrics: dict[str, float] = {}


def sidecar_path(path: str | os.PathLike) -> Path:
    return Path(path).with_suffix(".json")


def save_checkpoint(path: str | os.PathLike, head: LengthHead, meta: CheckpointMeta) -> Path:
    """Write `path` (.safetensors) and its JSON sidecar; returns the weights path."""
    path = Path(path).with_suffix(".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}, str(path))
    sidecar_path(path).write_text(meta.model_dump_json(indent=2) + "\n")
    return path


def read_meta(path: str | os.PathLike) -> CheckpointMeta:
    """A checkpoint's settings alone (bins, pooling), without torch weights."""
    return CheckpointMeta.model_validate(json.loads(sidecar_path(Path(path).with_suffix(".safetensors")).read_text()))


def load_checkpoint(
    path: str | os.PathLike, expected_base_model_hash: str | None = None
) -> tuple[LengthHead, CheckpointMeta]:
    """Head in eval mode plus its settings; raises BaseModelMismatchError on another base model."""
    path = Path(path).with_suffix(".safetensors")
    meta = read_meta(path)
    if meta.format not in READABLE_FORMATS:
        raise ValueError(f"{path}: checkpoint format {meta.format}, this code reads {list(READABLE_FORMATS)}")
    if expected_base_model_hash is not None and meta.base_model_hash != expected_base_model_hash:
        raise BaseModelMismatchError(path, meta.base_model_hash, expected_base_model_hash)
    head = LengthHead(meta.feature_dim, meta.bins.k, **meta.fit.architecture())
    state = load_file(str(path))
    if meta.format == 1:  # one MLP named `net`, no standardisation
        state = {**{k.replace("net.", "members.0.", 1): v for k, v in state.items()},
                 "shift": head.shift, "scale": head.scale}
    head.load_state_dict(state)
    head.temperature = meta.temperature
    head.cdf_map = None if meta.cdf_map is None else torch.tensor(meta.cdf_map)
    return head.eval(), meta
