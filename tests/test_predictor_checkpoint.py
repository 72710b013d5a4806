import json

import pytest
import torch

from safetensors.torch import save_file

from predictor.checkpoint import BaseModelMismatchError, CheckpointMeta, load_checkpoint, save_checkpoint
from predictor.fit import FitConfig
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


def test_ensemble_standardisation_and_calibration_round_trip(tmp_path):
    torch.manual_seed(0)
    meta = make_meta(fit=FitConfig(members=2, hidden=8, standardise=True), temperature=1.5,
                     cdf_map=torch.linspace(0, 1, 21).pow(2).tolist())
    head = LengthHead(meta.feature_dim, meta.bins.k, **meta.fit.architecture()).eval()
    head.fit_standardisation(torch.randn(10, meta.feature_dim) * 3 + 1)
    head.temperature, head.cdf_map = meta.temperature, torch.tensor(meta.cdf_map)
    loaded, loaded_meta = load_checkpoint(save_checkpoint(tmp_path / "ens", head, meta))
    assert loaded_meta == meta and len(loaded.members) == 2 and loaded.members[0][0].out_features == 8
    x = torch.randn(5, meta.feature_dim)
    assert torch.equal(loaded(x), head(x))
    assert not torch.allclose(loaded(x).softmax(-1), loaded.uncalibrated(x).softmax(-1))  # calibration applied


def test_format_1_checkpoints_still_load(tmp_path):
    """The committed heads before format 2: one MLP under `net`, dropout in the sidecar."""
    torch.manual_seed(0)
    meta = make_meta()
    head = LengthHead(meta.feature_dim, meta.bins.k).eval()
    save_file({k.replace("members.0.", "net."): v for k, v in head.state_dict().items() if k.startswith("members.")},
              str(tmp_path / "old.safetensors"))
    sidecar = {**json.loads(meta.model_dump_json()), "format": 1, "dropout": 0.1}
    for key in ("fit", "temperature", "cdf_map"):
        sidecar.pop(key)
    (tmp_path / "old.json").write_text(json.dumps(sidecar))
    loaded, loaded_meta = load_checkpoint(tmp_path / "old")
    assert loaded_meta.format == 1 and loaded.temperature == 1.0 and loaded.cdf_map is None
    x = torch.randn(3, meta.feature_dim)
    assert torch.equal(loaded(x), head(x))


def test_other_base_model_is_refused(tmp_path):
    meta = make_meta()
    path = save_checkpoint(tmp_path / "estp", LengthHead(meta.feature_dim, meta.bins.k), meta)
    with pytest.raises(BaseModelMismatchError) as err:
        load_checkpoint(path, expected_base_model_hash="0123456789abcdef")
    assert "a672150fb4f99d7c" in str(err.value) and "0123456789abcdef" in str(err.value)
    load_checkpoint(path)  # no expectation given: loads
