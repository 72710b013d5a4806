import pytest
import torch
from pydantic import ValidationError

from predictor.head import LengthBins, LengthHead, summarise

torch.set_num_threads(1)


def test_quantile_bins_balance_and_spike():
    lengths = torch.cat([torch.arange(1, 801), torch.full((200,), 1024)])  # 20% truncated
    bins = LengthBins.from_lengths(lengths, k=10, max_tokens=1024)
    assert bins.edges[0] == 0 and bins.edges[-1] == 1024
    assert bins.edges[-2] == 1023 and bins.centres[-1] == 1024  # the truncation spike's own bin
    counts = torch.bincount(bins.index(lengths.float()), minlength=bins.k)
    assert counts[:-1].min() >= 80 and counts[:-1].max() <= 100  # the 9 regular bins split 800 evenly
    assert bins.k == 10


def test_bins_without_spike_and_ties():
    lengths = torch.tensor([5] * 50 + list(range(100, 150)))
    bins = LengthBins.from_lengths(lengths, k=20, max_tokens=1024)
    assert bins.k < 20  # tied lengths merge quantile edges
    assert all(b > a for a, b in zip(bins.edges, bins.edges[1:]))


def test_bin_index_is_right_closed_and_clamped():
    bins = LengthBins(edges=[0, 10, 100, 1024], centres=[5, 50, 500], max_tokens=1024)
    assert bins.index(torch.tensor([1.0, 10.0, 11.0, 100.0, 1024.0, 5000.0])).tolist() == [0, 0, 1, 1, 2, 2]


def test_invalid_bins_rejected():
    with pytest.raises(ValidationError):
        LengthBins(edges=[0, 10, 5], centres=[5, 7], max_tokens=10)
    with pytest.raises(ValidationError):
        LengthBins(edges=[0, 10, 20], centres=[15, 17], max_tokens=20)


def test_soft_labels():
    bins = LengthBins.log_spaced(k=5, max_tokens=100)
    soft = bins.soft_labels(torch.tensor([0, 2]), tau=1.0)
    assert torch.allclose(soft.sum(-1), torch.ones(2))
    assert soft[1].argmax() == 2 and torch.isclose(soft[1, 1] / soft[1, 2], torch.exp(torch.tensor(-1.0)))
    assert torch.isclose(soft[1, 1], soft[1, 3])


def test_expected_and_quantiles():
    bins = LengthBins(edges=[0, 100, 200, 400], centres=[50, 150, 300], max_tokens=400)
    probs = torch.tensor([[0.2, 0.5, 0.3], [0.0, 1.0, 0.0]])
    assert torch.allclose(bins.expected(probs), torch.tensor([0.2 * 50 + 0.5 * 150 + 0.3 * 300, 150.0]))
    # CDF at edges: 0, 0.2, 0.7, 1.0 -> p50 is 60% of the way through bin 1, p10 half way through bin 0
    assert torch.allclose(bins.quantile(probs, 0.5), torch.tensor([160.0, 150.0]))
    assert torch.allclose(bins.quantile(probs, 0.1), torch.tensor([50.0, 110.0]))
    (first, second) = summarise(probs, bins)
    assert first.bin == 1 and second.bin == 1
    assert first.quantiles["p10"] <= first.quantiles["p50"] <= first.quantiles["p90"]
    assert first.quantiles["p90"] == pytest.approx(200 + 200 * 2 / 3)
    assert sum(first.probabilities) == pytest.approx(1.0)


def test_head_shape():
    head = LengthHead(576, 20).eval()
    assert head(torch.randn(3, 576)).shape == (3, 20)
    (net,) = head.members
    assert [type(m).__name__ for m in net] == ["Linear", "LayerNorm", "ReLU", "Dropout", "Linear"]
    assert net[0].out_features == 288
    assert LengthHead(576, 20, hidden=64).members[0][0].out_features == 64


def test_ensemble_averages_probabilities_and_temperature_divides_logits():
    torch.manual_seed(0)
    head = LengthHead(8, 5, members=3).eval()
    x = torch.randn(4, 8)
    mean = torch.stack([m(x).softmax(-1) for m in head.members]).mean(0)
    assert torch.allclose(head(x).softmax(-1), mean, atol=1e-6)
    raw = head(x)
    head.temperature = 2.0
    assert torch.allclose(head(x), raw / 2)


def test_standardisation_is_fitted_on_training_inputs():
    head = LengthHead(3, 4).eval()
    x = torch.tensor([[0.0, 10.0, 5.0], [2.0, 30.0, 5.0]])
    head.fit_standardisation(x)
    z = (x - head.shift) / head.scale
    assert torch.allclose(z.mean(0), torch.zeros(3)) and torch.equal(head.scale[2], torch.tensor(1e-6))
    assert torch.allclose(head(x), head.members[0](z))
