import os

import pytest
import torch

from predictor.checkpoint import BaseModelMismatchError, CheckpointMeta, save_checkpoint
from predictor.estimator import LengthEstimator
from predictor.features import extract_features, micro_batches, pad_left
from predictor.head import LengthBins, LengthHead
from predictor.losses import LossConfig
from predictor.pooling import PoolingConfig, pool

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODEL_DIR = os.path.join(os.path.dirname(__file__), "..", "models", "SmolLM2-135M-Instruct")
pytestmark = pytest.mark.skipif(not os.path.isdir(MODEL_DIR), reason="converted model folder missing")

PROMPTS = ["Hi", "Explain recursion in two sentences.", "List five fruits.", "Write a haiku about rain."]


def write_checkpoint(tmp_path, base_hash, pooling=PoolingConfig()):
    torch.manual_seed(0)
    meta = CheckpointMeta(
        base_model_id="SmolLM2-135M-Instruct", base_model_hash=base_hash, feature_layer=-1, feature_dim=576,
        pooling=pooling, bins=LengthBins.log_spaced(k=20, max_tokens=1024), loss=LossConfig(),
        training_data_version="untrained",
    )
    return save_checkpoint(tmp_path / "head", LengthHead(576, 20), meta)


@pytest.fixture(scope="module")
def estimator(tmp_path_factory):
    from deployments.model_files import model_weights_hash

    path = write_checkpoint(tmp_path_factory.mktemp("ckpt"), model_weights_hash(MODEL_DIR))
    return LengthEstimator.load(MODEL_DIR, path, max_batch_tokens=80)


def test_predictions_match_the_manual_pipeline(estimator):
    ids = [estimator.encode(p) for p in PROMPTS]
    assert estimator.encode(ids[0]) == ids[0]
    assert estimator.encode([{"role": "user", "content": PROMPTS[0]}]) == ids[0]
    assert len(micro_batches([len(s) for s in ids], estimator.max_batch_tokens, 32)) > 1  # the budget splits the batch

    predictions = estimator.predict(PROMPTS)
    with torch.no_grad():
        features = extract_features(estimator.model, *pad_left(ids, 2), estimator.features)
        probs = estimator.head(pool(features, estimator.meta.pooling)).softmax(-1)
    expected = estimator.meta.bins.expected(probs)
    for i, p in enumerate(predictions):
        assert p.expected_tokens == pytest.approx(expected[i].item(), rel=1e-4)
        assert 0 <= p.quantiles["p10"] <= p.quantiles["p50"] <= p.quantiles["p90"] <= 1024
        assert 0 <= p.bin < 20 and sum(p.probabilities) == pytest.approx(1.0, abs=1e-5)


def test_other_base_model_is_refused(tmp_path):
    path = write_checkpoint(tmp_path, "0123456789abcdef")
    with pytest.raises(BaseModelMismatchError):
        LengthEstimator.load(MODEL_DIR, path)
