import pytest
import torch

from predictor.head import LengthBins
from predictor.losses import LOSSES, LossConfig, crps, length_loss

torch.set_num_threads(1)

BINS = LengthBins(edges=[0, 100, 200, 400], centres=[50, 150, 300], max_tokens=400)


def one_hot(index, k=3):
    return torch.nn.functional.one_hot(torch.tensor(index), k).float()


def one_hot_log_probs(index, k=3):
    return torch.log(one_hot(index, k).clamp(min=1e-30))


def test_crps_perfect_is_zero_and_one_hot_equals_absolute_error():
    assert crps(one_hot_log_probs([0, 1, 2]), one_hot([0, 1, 2]), BINS).item() == pytest.approx(0.0, abs=1e-6)
    # one-hot on bin 2 when the truth is bin 0: |300 - 50| / 400
    assert crps(one_hot_log_probs([2]), one_hot([0]), BINS).item() == pytest.approx(250 / 400)


def test_crps_known_value_for_a_spread_prediction():
    log_probs = torch.log(torch.tensor([[0.5, 0.5, 0.0]]).clamp(min=1e-30))
    # truth bin 1: CDF gap 50..150 has F = 0.5 vs G = 0, gap 150..300 has F = 1 vs G = 1
    assert crps(log_probs, one_hot([1]), BINS).item() == pytest.approx(0.25 * 100 / 400, rel=1e-5)
    # against a target spread the same way, the distance is 0
    assert crps(log_probs, torch.tensor([[0.5, 0.5, 0.0]]), BINS).item() == pytest.approx(0.0, abs=1e-6)


def test_a_histogram_target_is_the_mean_of_its_samples_for_ce_and_a_distance_for_crps():
    """Multi-sample targets: CE on the empirical histogram is the mean CE of the samples; CRPS
    is smallest when the prediction matches the histogram."""
    logits = torch.randn(1, 3)
    histogram = torch.tensor([[0.5, 0.0, 0.5]])
    cfg = LossConfig(name="ce")
    per_sample = length_loss(logits.repeat(2, 1), torch.tensor([50.0, 300.0]), BINS, cfg)
    assert length_loss(logits, torch.tensor([175.0]), BINS, cfg, histogram).item() == pytest.approx(per_sample.item())
    matching = torch.log(histogram.clamp(min=1e-30))
    assert crps(matching, histogram, BINS) < crps(one_hot_log_probs([0]), histogram, BINS)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_is_finite_and_has_gradients(name):
    logits = torch.randn(6, 3, requires_grad=True)
    lengths = torch.tensor([10.0, 120.0, 390.0, 150.0, 600.0, 50.0])
    loss = length_loss(logits, lengths, BINS, LossConfig(name=name))
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_losses_prefer_the_right_answer():
    lengths = torch.tensor([50.0, 300.0])
    right = torch.tensor([[8.0, 0.0, 0.0], [0.0, 0.0, 8.0]])
    wrong = right.flip(-1)
    for name in LOSSES:
        cfg = LossConfig(name=name)
        assert length_loss(right, lengths, BINS, cfg) < length_loss(wrong, lengths, BINS, cfg), name


def test_ce_mse_weights():
    logits = torch.randn(4, 3)
    lengths = torch.tensor([10.0, 150.0, 250.0, 399.0])
    ce = -(BINS.soft_labels(BINS.index(lengths)) * torch.log_softmax(logits, -1)).sum(-1).mean()
    mse = ((BINS.expected(logits.softmax(-1)) - lengths) / 400).pow(2).mean()
    assert length_loss(logits, lengths, BINS, LossConfig(name="ce+mse")).item() == pytest.approx(
        (0.95 * ce + 0.05 * mse).item(), rel=1e-5)


def test_unknown_loss():
    with pytest.raises(KeyError):
        length_loss(torch.zeros(1, 3), torch.tensor([1.0]), BINS, LossConfig(name="nope"))
