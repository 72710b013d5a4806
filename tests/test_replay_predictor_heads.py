"""ESTP and EGTP heads on one shared prefill give what each head gives on its own."""

import os

import pytest
import torch

from deployments.config import DEFAULT_CHECKPOINTS
from deployments.predictor_deployment import HeadSet, shared_features
from predictor.checkpoint import load_checkpoint
from predictor.estimator import LengthEstimator

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODEL_DIR = os.path.join(os.path.dirname(__file__), "..", "models", "SmolLM2-135M-Instruct")
HEADS = {name: str(DEFAULT_CHECKPOINTS / name / "head") for name in ("estp", "egtp")}


@pytest.mark.skipif(not os.path.isdir(MODEL_DIR), reason="converted model folder missing")
def test_one_prefill_serves_both_heads_like_separate_estimators():
    heads = HeadSet.load(MODEL_DIR, HEADS, max_batch_tokens=64)
    prompts = ["Say hi.", "Explain recursion in two sentences, then give an example in Python."]
    ids = [heads.estimator.encode(p) for p in prompts]
    shared = heads.predict(ids)
    for name, path in HEADS.items():
        alone = LengthEstimator(heads.estimator.model, heads.estimator.tokenizer, *load_checkpoint(path))
        for by_head, own in zip(shared, alone.predict(ids)):
            assert by_head[name].expected_tokens == pytest.approx(own.expected_tokens, rel=1e-4)
            assert by_head[name].bin == own.bin
    assert shared[0]["estp"].expected_tokens != shared[0]["egtp"].expected_tokens


def test_heads_reading_different_layers_cannot_share_a_prefill():
    _, estp = load_checkpoint(HEADS["estp"])
    _, egtp = load_checkpoint(HEADS["egtp"])
    config = shared_features([estp, egtp])
    assert config.entropy and config.attention and config.layer == estp.feature_layer
    with pytest.raises(ValueError, match="different feature layers"):
        shared_features([estp, egtp.model_copy(update={"feature_layer": 3})])
