"""The training CLI end to end on a tiny synthetic dataset generated from the real chat template."""

import json

import pytest
import torch

from predictor import train
from predictor.model_files import model_weights_hash
from predictor.checkpoint import load_checkpoint
from predictor.estimator import LengthEstimator, encode_prompt
from predictor.features import extract_features, pad_left
from predictor.pooling import pool
from tests import MODEL_DIR

torch.set_num_threads(1)

PROMPTS = {
    "train": ["Say hi.", "Write a long story about a dragon.", "Name a colour.", "Explain gravity in detail."],
    "val": ["Say yes.", "Write a long essay about the moon."],
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    root = tmp_path_factory.mktemp("data")
    settings = {"model_id": "SmolLM2-135M-Instruct", "weights_hash": model_weights_hash(MODEL_DIR), "max_tokens": 128}
    (root / "meta.json").write_text(json.dumps({"settings": settings, "format": 1}))
    with open(root / "samples.jsonl", "w") as fh:
        for split, prompts in PROMPTS.items():
            for n, text in enumerate(prompts):
                for k in range(2):
                    length = 100 + 10 * k if "long" in text else 5 + k
                    fh.write(json.dumps({"prompt_id": f"{split}/{n}", "sample_idx": k, "split": split, "prompt": text,
                                         "prompt_tokens": len(encode_prompt(tokenizer, text)),
                                         "output_tokens": length, "finish_reason": "stop"}) + "\n")
        fh.write('{"cut short')  # a partial last line, as a stopped build leaves
    return root


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def run(dataset, cache_dir, out_dir, method, *extra):
    return train.main(["--dataset", str(dataset), "--method", method, "--model", str(MODEL_DIR),
                       "--out", str(out_dir / method), "--cache-dir", str(cache_dir), "--epochs", "3", *extra])


def test_train_cache_and_reload(dataset, cache_dir, tmp_path, monkeypatch):
    path = run(dataset, cache_dir, tmp_path, "estp")
    cached = list(cache_dir.glob("*/*.safetensors"))
    assert len(cached) == 6  # one file per distinct prompt

    head, meta = load_checkpoint(path, expected_base_model_hash=model_weights_hash(MODEL_DIR))
    assert meta.pooling.method == "estp" and meta.loss.name == "crps+smoothl1" and meta.feature_layer == -1
    assert meta.bins.max_tokens == 128 and meta.training_data_version.endswith(":12")
    assert meta.metrics["train_samples"] == 8 and meta.metrics["val_samples"] == 4

    # Other methods reuse the cache: no model forward at all.
    monkeypatch.setattr(train, "extract_features", lambda *a, **k: pytest.fail("cache not reused"))
    trail = run(dataset, cache_dir, tmp_path, "trail")
    _, trail_meta = load_checkpoint(trail)
    assert trail_meta.feature_layer == train.DEFAULT_TRAIL_LAYER and trail_meta.bins.k <= 10
    run(dataset, cache_dir, tmp_path, "estp", "--lam", "0", "--no-debias", "--loss", "crps")


@pytest.mark.parametrize("method", ["estp", "trail", "early4_ens5"])
def test_training_inputs_match_inference_inputs(dataset, cache_dir, tmp_path, method):
    """The cached path must pool exactly what LengthEstimator pools at serving time."""
    path = run(dataset, cache_dir, tmp_path, method)
    est = LengthEstimator.load(MODEL_DIR, path)
    _, splits = train.read_dataset(dataset, est.tokenizer)
    recipe = train.RECIPES[method]
    _, meta = est.heads[est.default]
    cache = train.FeatureCache(cache_dir, meta.base_model_hash, train.cached_layer(recipe.layer))
    from_cache = train.pooled_inputs(cache, splits["val"], recipe, debias=True)
    ids = [e.ids for e in splits["val"]]
    with torch.no_grad():
        live = pool(extract_features(est.model, *pad_left(ids, 2), est.features), meta.pooling)
    assert torch.allclose(from_cache, live, rtol=1e-3, atol=1e-3)  # float16 cache
    assert len(est.predict(PROMPTS["val"])) == 2
