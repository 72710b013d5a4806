"""The accuracy benchmark's arithmetic on hand-computed values: metrics, calibration, selection."""

import math

import numpy as np
import pytest
import torch

from benchmarks.accuracy.corpus import limit_examples, round_robin
from benchmarks.accuracy.crossval import Corpus, match_quantiles
from benchmarks.accuracy.metrics import by_scenario, clustered_se, length_class, scores
from benchmarks.accuracy.scoring import paired_test, scenario_median, score
from benchmarks.accuracy.variants import VARIANTS, select
from benchmarks.predictor_accuracy import _figure_prompts, _overhead_prompts
from predictor.fit import val_error
from predictor.train import Example
from router.scheduling.pools import Pools


def test_length_class_boundaries():
    # Short < 200, Medium 200-500 inclusive, Long > 500.
    assert length_class([0, 199, 200, 500, 501, 1024]).tolist() == [0, 0, 1, 1, 2, 2]


def test_scores_known_values():
    m = scores([100, 300, 600, 150], [150, 250, 700, 600])
    assert m["n"] == 4
    assert m["mae"] == pytest.approx(162.5)
    assert m["rmse"] == pytest.approx(math.sqrt((50 ** 2 + 50 ** 2 + 100 ** 2 + 450 ** 2) / 4))
    assert m["acc"] == pytest.approx(0.75)  # the last one: long predicted short
    assert (m["acc_short"], m["acc_medium"], m["acc_long"]) == (1.0, 1.0, 0.5)
    assert m["mae_se"] == pytest.approx(np.std([50, 50, 100, 450], ddof=1) / 2)


def test_scores_missing_class_and_bad_input():
    m = scores([10, 20], [10, 30])
    assert m["acc_medium"] is None and m["acc_long"] is None and m["acc"] == 1.0
    assert scores([5], [7])["mae_se"] is None
    with pytest.raises(ValueError):
        scores([1, 2], [1])


def test_by_scenario_is_an_unweighted_mean_over_scenarios():
    out = by_scenario([0, 0, 0, 0], [10, 20, 20, 20], ["a", "b", "b", "b"])
    assert out["a"]["mae"] == 10 and out["b"]["mae"] == 20
    assert out["avg"]["mae"] == 15 and out["avg"]["n"] == 4  # not 17.5, the per-sample mean
    assert out["avg"]["acc_long"] is None


def test_seeds_mean_and_spread():
    out = scores([[10, 10], [30, 30]], [0, 0])  # two seeds: MAE 10 and 30
    assert out["mae"] == 20 and out["mae_std"] == 10 and out["n"] == 2
    assert out["mae_se"] == 0  # the seed-averaged errors (20, 20) do not vary
    assert "mae_std" not in scores([10, 10], [0, 0])


def test_clustered_standard_error_counts_a_prompt_once():
    values = [1.0, 1.0, 1.0, 5.0]
    assert clustered_se(values) == pytest.approx(np.std(values, ddof=1) / 2)  # independent samples
    # Prompt a holds three identical samples: two clusters (sums -3 and +3 around the mean 2), G = 2.
    assert clustered_se(values, ["a", "a", "a", "b"]) == pytest.approx(np.sqrt(2 * (9 + 9)) / 4)
    assert clustered_se([1.0, 2.0], ["a", "a"]) is None


def test_match_quantiles_keeps_order_and_takes_the_training_scale():
    ref_scores, ref_lengths = np.array([1.0, 2.0, 3.0, 4.0]), np.array([10.0, 20.0, 30.0, 40.0])
    out = match_quantiles(np.array([0.0, 2.5, 9.0]), ref_scores, ref_lengths)
    assert out.tolist() == [10.0, 25.0, 40.0]


def test_rank_loss_is_early_stopped_on_rank_correlation():
    lengths = torch.tensor([10.0, 20.0, 30.0])
    assert val_error("rank", torch.tensor([0.1, 0.2, 0.3]), lengths) == ("val_neg_spearman", pytest.approx(-1.0))
    assert val_error("rank", torch.tensor([0.3, 0.2, 0.1]), lengths)[1] == pytest.approx(1.0)
    assert val_error("rank", torch.tensor([0.5]), torch.tensor([3.0]))[1] == 0.0  # one sample: no order
    assert val_error("crps+smoothl1", torch.tensor([12.0, 20.0, 25.0]), lengths) == ("val_mae", pytest.approx(7 / 3))


def test_limit_takes_whole_prompts_round_robin_over_scenarios():
    examples = [Example("rl/1", [1], [5] * 8), Example("rl/2", [2], [5] * 8), Example("chat/1", [3], [5]),
                Example("chat/2", [4], [5])]
    scenario = {e.prompt_id: e.prompt_id.split("/")[0] for e in examples}
    assert [e.prompt_id for e in round_robin(examples, scenario)] == ["chat/1", "rl/1", "chat/2", "rl/2"]
    assert [e.prompt_id for e in limit_examples(examples, 2, scenario)] == ["chat/1", "rl/1"]
    assert limit_examples(examples, None, scenario) is examples


def _corpus(examples, scenarios, folds) -> Corpus:
    return Corpus(examples, scenarios, [""] * len(examples), np.array(folds), 1024)


POOLS = Pools(("short", "medium", "long"), (100.0, 300.0))


def test_scenario_median_predicts_each_scenarios_median_of_the_other_folds():
    examples = [Example("a", [1], [10, 30]), Example("b", [2], [20]), Example("c", [3], [100, 300]),
                Example("t1", [4], [25]), Example("t2", [5], [150, 250])]
    corpus = _corpus(examples, ["chat", "chat", "rl", "chat", "rl"], [0, 0, 0, 1, 1])
    pred = scenario_median(corpus, POOLS)
    assert pred["expected"][3] == 20 and pred["expected"][4] == 200  # fold 1 from fold 0's lengths
    assert pred["expected"][0] == 25 and pred["expected"][2] == 200  # and the other way round
    assert pred["pool"].tolist() == [0, 0, 1, 0, 1]
    m = score(pred, corpus, POOLS)
    assert m["rl"]["mae"] == pytest.approx((100 + 100 + 50 + 50) / 4)
    assert m["rl"]["coverage_p10_p90"] is None  # a point prediction has no interval


def test_paired_test_detects_a_consistent_difference_and_not_noise():
    rng = np.random.default_rng(0)
    examples = [Example(f"p{i}", [i], [1, 2]) for i in range(60)]
    corpus = _corpus(examples, ["a", "b"] * 30, [0, 1] * 30)
    base = rng.uniform(50, 150, 120)
    better = paired_test(base - 5 + rng.normal(0, 1, 120), base, corpus)
    assert better["mae_difference"] == pytest.approx(-5, abs=0.5) and better["p_value"] < 1e-6
    assert better["wilcoxon_p_value"] < 1e-6 and better["prompts"] == 60
    same = paired_test(base + rng.normal(0, 1, 120), base, corpus)
    assert same["p_value"] > 0.05


def test_select_expands_groups_and_rejects_unknown_names():
    assert list(select(["egtp", "estp", "egtp"])) == ["egtp", "estp"]
    assert set(select(["ablations"])) == {"estp_no_debias", "estp_no_smoothl1", "estp_no_crps"}
    assert {"tfidf", "tfidf_reg"} <= set(select(["methods"])) and "estp_distribution" in select(["toward_ceiling"])
    assert len(select(["lambda_sweep"])) == 5 and len(select(["all"])) == len(VARIANTS)
    assert VARIANTS["estp_lam0.5"].key() == VARIANTS["estp"].key()  # trained once
    with pytest.raises(ValueError):
        select(["nope"])


def test_overhead_and_figure_prompts_are_typical_and_spread_over_scenarios():
    def ex(pid, n):
        return Example(pid, list(range(n)), [1])

    test = [ex("a/1", 10), ex("a/2", 50), ex("a/3", 52), ex("b/1", 49), ex("b/2", 200)] * 2
    scenario = {e.prompt_id: e.prompt_id[0] for e in test}
    picked = _overhead_prompts({"train": [], "val": [], "test": test}, scenario)
    assert [len(ids) for ids in picked][:4] == [50, 49, 50, 49]  # closest to the median (50), a and b in turn
    few = {"train": [ex("a/9", 7)] * 8, "val": [], "test": test[:1]}
    assert len(_overhead_prompts(few, {"a/1": "a", "a/9": "a"})) == 8  # too few test prompts: all splits
    assert [e.prompt_id for e in _figure_prompts(test + [ex("b/3", 500)], {**scenario, "b/3": "b"})] == ["a/3", "b/1"]
