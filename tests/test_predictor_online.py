"""Learning from served traffic: censored labels in the loss and fit loop, the stratified
reservoir, the online learner (install rule, versions, persistence, atomic publication) and the
refit scheduler. Small synthetic inputs, one torch thread, no model and no Ray."""

import pytest
import torch

from predictor.fit import FitConfig, fit_head, scorable
from predictor.head import LengthBins
from predictor.losses import LossConfig, length_loss
from predictor.targets import build_targets

torch.set_num_threads(1)

SPIKY = LengthBins(edges=[0, 10, 20, 1023, 1024], centres=[5, 15, 500, 1024], max_tokens=1024)


# --- censored labels ------------------------------------------------------------------------------

def test_survival_counts_the_cut_bin_by_its_uniform_share_and_the_cap_as_the_last_bin():
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    s = lambda c: SPIKY.survival(p, torch.tensor([float(c)])).item()  # noqa: E731
    assert s(15) == pytest.approx(0.2 * (20 - 14) / 10 + 0.3 + 0.4)  # P(L >= 15) = mass above 14
    assert s(0) == pytest.approx(1.0) and s(1) == pytest.approx(1.0)
    assert s(1024) == pytest.approx(0.4) and s(5000) == pytest.approx(0.4)  # at and beyond the cap: the last bin
    assert s(1023) == pytest.approx(0.3 / 1003 + 0.4)  # continuous into the cap with a spike bin
    wide = LengthBins(edges=[0, 100, 1024], centres=[50, 600], max_tokens=1024)
    q = torch.tensor([[0.25, 0.75]])
    assert wide.survival(q, torch.tensor([1024.0])).item() == pytest.approx(0.75)  # where an exact 1024 would go


def test_a_censored_row_costs_minus_log_survival_and_an_exact_row_the_configured_loss():
    logits = torch.tensor([[0.3, -1.0, 0.5, 0.2], [1.0, 0.0, -0.5, 0.1], [0.0, 0.0, 0.0, 2.0]])
    lengths = torch.tensor([15.0, 300.0, 1024.0])
    censored = torch.tensor([True, False, True])
    probs = logits.softmax(-1)
    nll = -SPIKY.survival(probs, lengths).log()
    alone = length_loss(logits[:1], lengths[:1], SPIKY, censored=censored[:1])
    assert alone.item() == pytest.approx(nll[0].item(), rel=1e-5)
    assert length_loss(logits[2:], lengths[2:], SPIKY, censored=censored[2:]).item() == pytest.approx(
        -probs[2, -1].log().item(), rel=1e-5)
    exact = length_loss(logits[1:2], lengths[1:2], SPIKY)
    mixed = length_loss(logits, lengths, SPIKY, censored=censored)
    assert mixed.item() == pytest.approx((nll[0] + nll[2] + exact).item() / 3, rel=1e-5)
    no_flags = length_loss(logits, lengths, SPIKY)
    assert torch.equal(length_loss(logits, lengths, SPIKY, censored=torch.zeros(3, dtype=torch.bool)), no_flags)


def _cut_at(c: int, n: int = 160, seed: int = 0):
    """Short prompts (dim 0 = 0) answer in ~100 tokens, long ones (dim 0 = 1) in ~700, but every
    long answer was stopped at c tokens, as a client's max_tokens would."""
    g = torch.Generator().manual_seed(seed)
    long = torch.arange(n) % 2 == 1
    x = torch.cat([long.float()[:, None], torch.randn(n, 3, generator=g) * 0.1], dim=1)
    natural = torch.where(long, 700, 100) + torch.randint(-40, 40, (n,), generator=g)
    observed = torch.where(long, torch.tensor(c), natural)
    return x, [[int(v)] for v in observed], [[bool(v)] for v in long]


def test_a_censored_label_moves_the_predicted_mass_above_its_cut():
    bins = LengthBins.log_spaced(12, 1024, 16.0)
    x, y, cens = _cut_at(300)
    xv, yv, cv = _cut_at(300, 60, 1)
    config = FitConfig(epochs=60, patience=60, batch_size=32, calibrate="none", hidden=16)
    censored_head, _ = fit_head(x, y, xv, yv, bins, LossConfig(), config, cens, cv)
    naive_head, _ = fit_head(x, y, xv, yv, bins, LossConfig(), config)  # the cut taken as the length
    long_prompt = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    with torch.no_grad():
        above = [bins.survival(h(long_prompt).softmax(-1), torch.tensor([301.0])).item()
                 for h in (censored_head, naive_head)]
        short = bins.expected(censored_head(torch.zeros(1, 4)).softmax(-1)).item()
    assert above[0] > 0.9 and above[0] > above[1] + 0.3
    assert short < 200  # exact rows still learn as before


def test_exact_only_training_is_unchanged_by_all_false_flags():
    x, y, _ = _cut_at(300, 60)
    xv, yv, _ = _cut_at(300, 20, 1)
    bins = LengthBins.from_lengths([v for s in y for v in s], k=6)
    config = FitConfig(epochs=8, patience=4, members=2)
    plain, m1 = fit_head(x, y, xv, yv, bins, LossConfig(), config)
    flagged, m2 = fit_head(x, y, xv, yv, bins, LossConfig(), config,
                           [[False] for _ in y], [[False] for _ in yv])
    assert m1 == m2 and all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), flagged.state_dict().values()))
    assert torch.equal(plain.cdf_map, flagged.cdf_map)


def test_only_rows_with_a_known_length_are_scored():
    lengths = torch.tensor([50.0, 300.0, 1024.0, 2048.0])
    keep, y = scorable(lengths, torch.tensor([False, True, True, True]), SPIKY)
    assert keep.tolist() == [True, False, True, True] and y.tolist() == [50, 300, 1024, 1024]


def test_per_prompt_targets_refuse_censored_samples():
    with pytest.raises(ValueError):
        build_targets([[10, 20]], "median", SPIKY, [[False, True]])
    assert build_targets([[10, 20]], "samples", SPIKY, [[False, True]]).censored.tolist() == [False, True]
    assert build_targets([[10, 20]], "median", SPIKY, [[False, False]]).lengths.tolist() == [15.0]
