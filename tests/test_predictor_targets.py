"""Multi-sample training targets, built from the tiny fixture dataset's prompts."""

import numpy as np
import pytest
import torch

from predictor.dataset import load_samples
from predictor.head import LengthBins
from predictor.targets import build_targets
from tests import FORELEN_TINY


@pytest.fixture(scope="module")
def prompts():
    lengths: dict[str, list[int]] = {}
    for r in load_samples(FORELEN_TINY):
        lengths.setdefault(r["prompt_id"], []).append(r["output_tokens"])
    return list(lengths), list(lengths.values())


@pytest.fixture(scope="module")
def bins(prompts):
    return LengthBins.from_lengths([x for sample in prompts[1] for x in sample], k=5, max_tokens=1024)


def test_samples_mode_is_one_row_per_sample(prompts, bins):
    ids, lengths = prompts
    t = build_targets(lengths, "samples", bins)
    assert len(t.rows) == sum(len(x) for x in lengths) and t.histogram is None
    assert [int(x) for x in t.lengths] == [x for sample in lengths for x in sample]
    assert [ids[i] for i in t.rows.tolist()] == [ids[p] for p, sample in enumerate(lengths) for _ in sample]


def test_median_and_distribution_are_one_row_per_prompt(prompts, bins):
    ids, lengths = prompts
    multi = ids.index("rl/deepscaler/4549")
    assert sorted(lengths[multi]) == [46, 113, 233, 398]  # the fixture's four samples of this prompt
    for mode in ("median", "distribution"):
        t = build_targets(lengths, mode, bins)
        assert t.rows.tolist() == list(range(len(ids)))
        assert t.lengths.tolist() == pytest.approx([float(np.median(x)) for x in lengths])
        assert t.lengths[multi].item() == pytest.approx((113 + 233) / 2)
    assert build_targets(lengths, "median", bins).histogram is None


def test_distribution_target_is_the_empirical_histogram(prompts, bins):
    ids, lengths = prompts
    h = build_targets(lengths, "distribution", bins).histogram
    assert h.shape == (len(ids), bins.k) and torch.allclose(h.sum(-1), torch.ones(len(ids)))
    for p, sample in enumerate(lengths):
        expected = np.bincount(bins.index(torch.tensor(sample, dtype=torch.float32)).numpy(), minlength=bins.k)
        assert h[p].tolist() == pytest.approx((expected / len(sample)).tolist())
        if len(sample) == 1:  # a single sample: the one-hot target of the per-sample mode
            assert h[p].max() == 1.0


def test_unknown_mode_is_refused(prompts, bins):
    with pytest.raises(ValueError):
        build_targets(prompts[1], "mean", bins)
