
import pytest
import torch

from router.serving.config import DEFAULT_CHECKPOINTS
from predictor.checkpoint import BaseModelMismatchError, CheckpointMeta, load_checkpoint, save_checkpoint
from predictor.estimator import LengthEstimator, shared_features
from predictor.features import extract_features, micro_batches, pad_left
from predictor.head import LengthBins, LengthHead
from predictor.losses import LossConfig
from predictor.pooling import PoolingConfig, pool
from tests import MODEL_DIR

torch.set_num_threads(1)

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
    from predictor.model_files import model_weights_hash

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
        head, meta = estimator.heads[estimator.default]
        probs = head(pool(features, meta.pooling)).softmax(-1)
    expected = meta.bins.expected(probs)
    for i, p in enumerate(predictions):
        assert p.expected_tokens == pytest.approx(expected[i].item(), rel=1e-4)
        assert 0 <= p.quantiles["p10"] <= p.quantiles["p50"] <= p.quantiles["p90"] <= 1024
        assert 0 <= p.bin < 20 and sum(p.probabilities) == pytest.approx(1.0, abs=1e-5)


def test_a_concat_ensemble_calibrated_head_serves_through_the_same_path(tmp_path):
    """Combined views, ensembles and calibration live in pool() and LengthHead: the estimator
    (and so the deployment) serves them unchanged."""
    from predictor.fit import FitConfig
    from predictor.model_files import model_weights_hash

    torch.manual_seed(0)
    meta = CheckpointMeta(
        base_model_id="SmolLM2-135M-Instruct", base_model_hash=model_weights_hash(MODEL_DIR), feature_layer=-1,
        feature_dim=2 * 576, pooling=PoolingConfig(method="concat", views=["estp", "last"]),
        bins=LengthBins.log_spaced(k=20, max_tokens=1024), loss=LossConfig(), fit=FitConfig(members=2, hidden=32),
        cdf_map=torch.linspace(0, 1, 21).sqrt().tolist(), training_data_version="untrained",
    )
    head = LengthHead(meta.feature_dim, 20, **meta.fit.architecture())
    head.cdf_map = torch.tensor(meta.cdf_map)
    est = LengthEstimator.load(MODEL_DIR, save_checkpoint(tmp_path / "views", head, meta))
    assert est.features.entropy and est.features.attention
    ids = [est.encode(p) for p in PROMPTS[:2]]
    predictions = est.predict(PROMPTS[:2])
    with torch.no_grad():
        features = [extract_features(est.model, *pad_left([i], 2), est.features) for i in ids]  # one at a time
        pooled = torch.cat([torch.cat([pool(f, PoolingConfig(method=m)) for m in ("estp", "last")], -1)
                            for f in features])
        probs = head.eval()(pooled).softmax(-1)
        raw = head.uncalibrated(pooled).softmax(-1)
    for p, row, uncalibrated in zip(predictions, probs, raw):
        assert p.probabilities == pytest.approx(row.tolist(), abs=1e-5)
        assert p.probabilities != pytest.approx(uncalibrated.tolist(), abs=1e-3)


def test_other_base_model_is_refused(tmp_path):
    path = write_checkpoint(tmp_path, "0123456789abcdef")
    with pytest.raises(BaseModelMismatchError):
        LengthEstimator.load(MODEL_DIR, path)


def test_a_bad_prompt_fails_alone_and_its_batch_is_still_predicted(estimator):
    from predictor.estimator import InvalidPrompt

    good = estimator.encode(PROMPTS[0])
    results = estimator.predict_each([good, [], [10**9], good[:3]])
    assert isinstance(results[1], InvalidPrompt) and "empty" in str(results[1])
    assert isinstance(results[2], InvalidPrompt) and "vocabulary" in str(results[2])
    assert results[0][estimator.default].expected_tokens == pytest.approx(
        estimator.predict_each([good])[0][estimator.default].expected_tokens, rel=1e-4)
    assert estimator.default in results[3]


def test_micro_batches_keep_padding_bounded():
    # A 10-token prompt padded to 100 would be 45% padding: it goes alone.
    assert micro_batches([100, 10], max_batch_tokens=4096, max_batch_size=8) == [[1], [0]]
    assert micro_batches([100, 105, 110], max_batch_tokens=4096, max_batch_size=8) == [[0, 1, 2]]
    # The token budget still splits a group the padding would allow.
    assert micro_batches([100, 105, 110], max_batch_tokens=250, max_batch_size=8) == [[0, 1], [2]]
    assert micro_batches([100, 10], 4096, 8, max_padding=float("inf")) == [[1, 0]]


def test_a_truncated_prompt_is_predicted_from_its_tail(estimator):
    long = estimator.encode("Explain recursion, iteration and tail calls in detail, with examples in three languages.")
    short = estimator.encode(PROMPTS[0])
    keep = len(short)  # the short prompt fits whole, the long one is cut to its last `keep` tokens
    assert len(long) > keep
    estimator.truncate_prompt_tokens = keep
    try:
        cut = estimator.predict_each([long, short])
    finally:
        estimator.truncate_prompt_tokens = None
    tail, whole, untouched = estimator.predict_each([long[-keep:], long, short])
    name = estimator.default
    assert cut[0][name].expected_tokens == pytest.approx(tail[name].expected_tokens, rel=1e-4)
    assert cut[0][name].expected_tokens != pytest.approx(whole[name].expected_tokens, rel=1e-4)
    assert cut[1][name].expected_tokens == pytest.approx(untouched[name].expected_tokens, rel=1e-4)


DEFAULT_HEADS = {name: str(DEFAULT_CHECKPOINTS / name / "head") for name in ("estp", "egtp")}


def test_one_prefill_serves_both_heads_like_separate_estimators():
    shared = LengthEstimator.load(MODEL_DIR, DEFAULT_HEADS, max_batch_tokens=64)
    prompts = ["Say hi.", "Explain recursion in two sentences, then give an example in Python."]
    ids = [shared.encode(p) for p in prompts]
    both = shared.predict_each(ids)
    for name in DEFAULT_HEADS:
        alone = LengthEstimator(shared.model, shared.tokenizer, {name: shared.heads[name]})
        for by_head, own in zip(both, alone.predict(ids)):
            assert by_head[name].expected_tokens == pytest.approx(own.expected_tokens, rel=1e-4)
            assert by_head[name].bin == own.bin
    assert both[0]["estp"].expected_tokens != both[0]["egtp"].expected_tokens


def test_heads_reading_different_layers_cannot_share_a_prefill():
    _, estp = load_checkpoint(DEFAULT_HEADS["estp"])
    _, egtp = load_checkpoint(DEFAULT_HEADS["egtp"])
    config = shared_features([estp, egtp])
    assert config.entropy and config.attention and config.layer == estp.feature_layer
    with pytest.raises(ValueError, match="different feature layers"):
        shared_features([estp, egtp.model_copy(update={"feature_layer": 3})])


def test_a_model_with_qk_norms_fails_at_load_not_at_the_first_prediction(estimator):
    from predictor.features import FeatureConfig, check_supported

    attn = estimator.model.base_model.layers[-1].self_attn
    attn.q_norm = torch.nn.Identity()
    try:
        with pytest.raises(NotImplementedError, match="q/k norms"):
            check_supported(estimator.model, FeatureConfig())
        check_supported(estimator.model, FeatureConfig(attention=False))  # EGTP reads no attention: fine
    finally:
        del attn.q_norm
