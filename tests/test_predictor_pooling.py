import pytest
import torch

from predictor.features import PrefillFeatures, pad_left
from predictor.pooling import PoolingConfig, first_token, normalise, pool, pooling_weights

torch.set_num_threads(1)


def synthetic(lengths=(6, 3, 1), d=4, seed=0) -> PrefillFeatures:
    g = torch.Generator().manual_seed(seed)
    _, mask = pad_left([[1] * n for n in lengths], pad_id=0)
    shape = mask.shape
    received = torch.rand(shape, generator=g) * mask
    received[first_token(mask)] = 10.0  # a sink, as the real model has
    received[:, -1] = 0.0  # the last token receives nothing
    return PrefillFeatures(
        hidden=torch.randn(*shape, d, generator=g) * mask[..., None],
        mask=mask,
        entropy=torch.rand(shape, generator=g) * 5 * mask,
        attention_received=received,
    )


@pytest.mark.parametrize("method", ["estp", "egtp", "avg", "last"])
def test_weights_sum_to_one_and_skip_padding(method):
    f = synthetic()
    w = pooling_weights(f, PoolingConfig(method=method))
    assert torch.allclose(w.sum(-1), torch.ones(3))
    assert (w[~f.mask] == 0).all()
    assert (w >= 0).all()
    assert pool(f, PoolingConfig(method=method)).shape == (3, 4)


def test_estp_masks_sink_but_not_a_lone_token():
    f = synthetic()
    w = pooling_weights(f, PoolingConfig())
    sink = first_token(f.mask)
    assert (w[sink][:2] == 0).all()  # rows with more than one token
    assert w[2, -1] == 1.0  # a one-token row keeps its only token


def test_last_token_gets_neutral_attention_score():
    f = synthetic(lengths=(6,))
    only_attention = pooling_weights(f, PoolingConfig(lam=1.0))
    keep = f.mask[0].clone()
    keep[-f.mask[0].sum()] = False  # drop the sink
    # Imputed with the mean of the others, the last token's z-score is 0, i.e. weight exp(0)/Z,
    # which is the geometric mean of the other weights.
    others = only_attention[0, keep][:-1]
    assert torch.isclose(only_attention[0, -1], others.log().mean().exp(), rtol=1e-5)


def test_lambda_zero_is_entropy_pooling():
    f = synthetic()
    plain = PoolingConfig(lam=0.0, alpha=1.0, normalisation="none", mask_sink=False)
    assert torch.allclose(pooling_weights(f, plain), pooling_weights(f, PoolingConfig(method="egtp")))
    # With the defaults (z-score, sink masked) lam = 0 ignores attention altogether.
    f_no_attention = PrefillFeatures(hidden=f.hidden, mask=f.mask, entropy=f.entropy)
    assert torch.allclose(pooling_weights(f, PoolingConfig(lam=0.0)),
                          pooling_weights(f_no_attention, PoolingConfig(lam=0.0)))


def test_alpha_sharpens_weights():
    f = synthetic()
    soft = pooling_weights(f, PoolingConfig(alpha=10.0))[0]
    sharp = pooling_weights(f, PoolingConfig(alpha=0.1))[0]
    assert sharp.max() > soft.max()


def test_avg_and_last():
    f = synthetic()
    avg = pool(f, PoolingConfig(method="avg"))
    assert torch.allclose(avg[1], f.hidden[1, -3:].mean(0))
    assert torch.allclose(pool(f, PoolingConfig(method="last")), f.hidden[:, -1])


@pytest.mark.parametrize("how", ["zscore", "minmax"])
def test_normalise_uses_only_kept_tokens(how):
    values = torch.tensor([[100.0, 1.0, 2.0, 3.0]])
    keep = torch.tensor([[False, True, True, True]])
    out = normalise(values, keep, how)[keep]
    expected = {"zscore": torch.tensor([-1.2247, 0.0, 1.2247]), "minmax": torch.tensor([0.0, 0.5, 1.0])}[how]
    assert torch.allclose(out, expected, atol=1e-4)


def test_missing_features_raise():
    f = synthetic()
    with pytest.raises(ValueError):
        pooling_weights(PrefillFeatures(hidden=f.hidden, mask=f.mask, entropy=f.entropy), PoolingConfig())


def test_concat_is_the_views_side_by_side_and_reads_what_they_read():
    f = synthetic()
    concat = PoolingConfig(method="concat", views=["estp", "last"], lam=0.3)
    out = pool(f, concat)
    assert out.shape == (3, 8)
    assert torch.equal(out[:, :4], pool(f, PoolingConfig(method="estp", lam=0.3)))
    assert torch.equal(out[:, 4:], pool(f, PoolingConfig(method="last")))
    assert concat.needs() == (True, True)
    assert PoolingConfig(method="concat", views=["avg", "last"]).needs() == (False, False)
    assert PoolingConfig(method="concat", views=["egtp", "avg"]).needs() == (True, False)
    with pytest.raises(ValueError):
        pooling_weights(f, concat)  # one weight row per view, not one for the concat


@pytest.mark.parametrize("method,views", [("concat", []), ("estp", ["last"]), ("concat", ["avg", "avg"])])
def test_views_only_with_concat(method, views):
    with pytest.raises(ValueError):
        PoolingConfig(method=method, views=views)
