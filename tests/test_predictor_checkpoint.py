import json

import pytest
import torch

from predictor.checkpoint import BaseModelMismatchError, CheckpointMeta, load_checkpoint, save_checkpoint
from predictor.head import LengthBins, LengthHead
from predictor.losses import LossConfig
from predictor.pooling import PoolingConfig

torch.set_num_threads(1)


def make_meta(**overrides) -> CheckpointMeta:
    fields = dict(
        base_model_id="SmolLM2-135M-Instruct",
        base_model_hash="a672150fb4f99d7c",
        feature_layer=-1,
        feature_dim=16,
        pooling=PoolingConfig(lam=0.3, alpha=0.7),
        bins=LengthBins.from_lengths(torch.arange(1, 500), k=6, max_tokens=1024),
        loss=LossConfig(),
        training_data_version="test:0",
    )
    return CheckpointMeta(**{**fields, **overrides})


def test_round_trip(tmp_path):
    torch.manual_seed(0)
    meta = make_meta()
    head = LengthHead(meta.feature_dim, meta.bins.k).eval()
    path = save_checkpoint(tmp_path / "estp", head, meta)
    assert path.suffix == ".safetensors" and path.with_suffix(".json").exists()
    assert json.loads(path.with_suffix(".json").read_text())["pooling"]["lam"] == 0.3

    loaded, loaded_meta = load_checkpoint(path, expected_base_model_hash="a672150fb4f99d7c")
    assert loaded_meta == meta
    assert not loaded.training
    x = torch.randn(5, meta.feature_dim)
    assert torch.equal(loaded(x), head(x))


def test_other_base_model_is_refused(tmp_path):
    meta = make_meta()
    path = save_checkpoint(tmp_path / "estp", LengthHead(meta.feature_dim, meta.bins.k), meta)
    with pytest.raises(BaseModelMismatchError) as err:
        load_checkpoint(path, expected_base_model_hash="0123456789abcdef")
    assert "a672150fb4f99d7c" in str(err.value) and "0123456789abcdef" in str(err.value)
    load_checkpoint(path)  # no expectation given: loads
