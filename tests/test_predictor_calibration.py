"""Calibration and coverage on constructed distributions whose answers are known by hand."""

import pytest
import torch

from predictor.calibration import central_interval, fit_cdf_map, fit_temperature, interval_coverage, pit
from predictor.head import LengthBins, LengthHead

BINS = LengthBins(edges=[0, 100, 200, 400], centres=[50, 150, 300], max_tokens=400)


def test_central_interval_and_coverage_by_hand():
    probs = torch.tensor([[0.1, 0.8, 0.1]])
    lo, hi = central_interval(probs, BINS)
    assert (lo.item(), hi.item()) == (pytest.approx(100.0), pytest.approx(200.0))  # CDF 0.1 at 100, 0.9 at 200
    lengths = torch.tensor([99.0, 100.0, 150.0, 200.0, 201.0])
    assert interval_coverage(lo.repeat(5), hi.repeat(5), lengths) == pytest.approx(3 / 5)


def test_a_truncated_answer_inside_the_spike_bin_is_covered():
    bins = LengthBins(edges=[0, 1023, 1024], centres=[300, 1024], max_tokens=1024)
    lo, hi = central_interval(torch.tensor([[0.85, 0.15]]), bins)
    assert 1023 < hi.item() < 1024  # p90 inside (1023, 1024]: length 1024 is the spike itself
    assert interval_coverage(lo, hi, torch.tensor([1024.0])) == 1.0
    assert interval_coverage(lo, torch.tensor([1022.5]), torch.tensor([1024.0])) == 0.0


def test_pit_is_the_midpoint_of_the_length_cell():
    probs = torch.tensor([[0.2, 0.5, 0.3]])
    # F(100) = 0.2, F(99) = 0.198: midpoint 0.199; F(400) = 1, F(399) = 1 - 0.3 / 200
    assert pit(probs, torch.tensor([100.0]), BINS).item() == pytest.approx(0.199)
    assert pit(probs, torch.tensor([400.0]), BINS).item() == pytest.approx(1 - 0.3 / 400)


def test_temperature_flattens_an_overconfident_head_and_keeps_a_calibrated_one():
    lengths = torch.tensor([50.0] * 10 + [150.0] * 10 + [300.0] * 10)  # a third in each bin
    sharp = torch.tensor([[0.0, 6.0, 0.0]]).repeat(30, 1)  # almost all on the middle bin
    assert fit_temperature(sharp, lengths, BINS) > 5
    honest = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(10, 1)
    matching = torch.tensor([50.0] * 5 + [150.0] * 3 + [300.0] * 2)
    assert fit_temperature(honest, matching, BINS) == pytest.approx(1.0, rel=0.03)


def test_cdf_map_makes_an_overconfident_head_cover_80_percent():
    torch.manual_seed(0)
    lengths = torch.rand(4000) * 400  # truth uniform on (0, 400]
    narrow = torch.tensor([[0.05, 0.9, 0.05]]).repeat(4000, 1)  # [p10, p90] = [100, 200]: covers ~25%
    assert interval_coverage(*central_interval(narrow, BINS), lengths) < 0.3
    head = LengthHead(2, 3, hidden=4).eval()
    head.members[0][-1].weight.data.zero_()
    head.members[0][-1].bias.data = torch.log(torch.tensor([0.05, 0.9, 0.05]))
    x = torch.zeros(4000, 2)
    head.cdf_map = torch.tensor(fit_cdf_map(head(x).softmax(-1), lengths, BINS))
    calibrated = head(x).softmax(-1)
    assert interval_coverage(*central_interval(calibrated, BINS), lengths) == pytest.approx(0.8, abs=0.03)
    identity = fit_cdf_map(torch.tensor([[0.25, 0.25, 0.5]]).repeat(4000, 1), lengths, BINS)
    assert identity == pytest.approx(torch.linspace(0, 1, 21).tolist(), abs=0.03)  # calibrated already
