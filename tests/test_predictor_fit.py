"""The head-fitting loop: seeds, ensembles, standardisation, targets and calibration options."""

import pytest
import torch

from predictor.calibration import central_interval, interval_coverage
from predictor.fit import FitConfig, fit_head, train_on_inputs
from predictor.head import LengthBins
from predictor.losses import LossConfig

torch.set_num_threads(1)


def toy(n: int, seed: int):
    """Prompts whose first input dimension says short or long; lengths scatter around that."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g) * 0.1
    long = torch.rand(n, generator=g) < 0.5
    x[:, 0] = long.float() * 100  # a large-scale dimension, as pooled hidden states have
    lengths = [[int(b + 60 * torch.rand(1, generator=g)) for _ in range(2)] for b in (long.float() * 600 + 50).tolist()]
    return x, lengths


QUICK = dict(epochs=30, patience=10, batch_size=16)


def test_fit_learns_is_deterministic_and_reports_validation_metrics():
    (x, y), (xv, yv) = toy(120, 0), toy(40, 1)
    head, bins, metrics = train_on_inputs(x, xv, y, yv, 8, LossConfig(), 1024, FitConfig(**QUICK))
    again, _, _ = train_on_inputs(x, xv, y, yv, 8, LossConfig(), 1024, FitConfig(**QUICK))
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))
    assert metrics["val_mae"] < 120 and metrics["train_samples"] == 240 and metrics["val_samples"] == 80
    assert 0 <= metrics["val_coverage_p10_p90"] <= 1 and head.cdf_map is not None  # quantile calibration by default


def test_ensemble_members_start_from_different_seeds():
    (x, y), (xv, yv) = toy(60, 0), toy(20, 1)
    bins = LengthBins.from_lengths([v for s in y for v in s], k=6, max_tokens=1024)
    head, _ = fit_head(x, y, xv, yv, bins, LossConfig(), FitConfig(members=3, hidden=4, calibrate="none", **QUICK))
    first_layers = [m[0].weight for m in head.members]
    assert len(first_layers) == 3 and not torch.equal(first_layers[0], first_layers[1])
    assert head.cdf_map is None and head.temperature == 1.0


def test_standardisation_median_targets_and_temperature():
    (x, y), (xv, yv) = toy(80, 0), toy(30, 1)
    bins = LengthBins.from_lengths([v for s in y for v in s], k=6, max_tokens=1024)
    config = FitConfig(standardise=True, targets="median", calibrate="temperature", **QUICK)
    head, metrics = fit_head(x, y, xv, yv, bins, LossConfig(name="crps+smoothl1"), config)
    assert head.scale[0] > 10 and head.shift[0] > 10  # the large dimension is scaled down
    assert head.temperature == metrics["temperature"] and head.cdf_map is None
    with torch.no_grad():
        probs = head(xv.repeat_interleave(2, 0)).softmax(-1)
    truth = torch.tensor([v for s in yv for v in s], dtype=torch.float32)
    assert interval_coverage(*central_interval(probs, bins), truth) == pytest.approx(metrics["val_coverage_p10_p90"])
