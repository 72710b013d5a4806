"""The accuracy benchmark end to end (cross-validated) on the short prompts of the tiny dataset fixture."""

import json
import shutil

import pytest
import torch

from benchmarks import predictor_accuracy
from tests import FORELEN_TINY as FIXTURE
from tests import MODEL_DIR

torch.set_num_threads(1)
METHODS = ["estp", "egtp", "ltr_c", "tfidf", "estp_no_debias", "estp_lam0.5", "estp_lam1", "estp_last"]
SCENARIOS = {"chat", "longseq", "reasoning", "rl"}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """One run on the fixture's prompts of at most 110 tokens (feature extraction dominates)."""
    data = tmp_path_factory.mktemp("data")
    shutil.copy(FIXTURE / "meta.json", data)
    rows = [json.loads(line) for line in (FIXTURE / "samples.jsonl").read_text().splitlines()]
    (data / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["prompt_tokens"] <= 110))
    out = tmp_path_factory.mktemp("out")
    with pytest.MonkeyPatch.context() as mp:  # two 12-token prompts keep the timing loop short
        mp.setattr(predictor_accuracy, "_overhead_prompts", lambda splits, _: [e.ids[:12] for e in splits["test"]])
        returned = predictor_accuracy.main([
            "--dataset", str(data), "--out-dir", str(out), "--cache-dir", str(tmp_path_factory.mktemp("cache")),
            "--model", str(MODEL_DIR), "--methods", *METHODS, "--seeds", "2", "--folds", "2", "--epochs", "3",
            "--repeats", "1",
        ])
    return returned, out


def test_outputs_written(result):
    returned, out = result
    assert json.loads((out / "predictor_accuracy.json").read_text()) == json.loads(json.dumps(returned))
    text = (out / "predictor_accuracy.md").read_text()
    for heading in ("Targets", "Table 2", "scenario median (no prompt)", "noise floor, leave-one-out", "p50",
                    "Paired tests", "Table 3", "Pool accuracy", "ceiling, in-sample median", "Coverage",
                    "Where ESTP does not beat EGTP", "Table 6", "Table 8", "Training toward the ceiling", "Figure 5"):
        assert heading in text
    for plot in ("mae", "lambda", "weights"):
        assert (out / f"predictor_accuracy_{plot}.png").stat().st_size > 0


def test_json_shape_and_metric_sanity(result):
    r, _ = result
    assert set(r["methods"]) == {"estp", "egtp", "ltr_c", "tfidf"} and set(r["toward_ceiling"]) == {"estp_last"}
    assert set(r["ablations"]) == {"estp_no_debias"} and set(r["lambda_sweep"]) == {"0.5", "1"}
    assert r["lambda_sweep"]["0.5"] == r["methods"]["estp"]  # the same training, run once
    for group in ("methods", "ablations", "lambda_sweep", "toward_ceiling"):
        for name, metrics in r[group].items():
            assert set(metrics) == SCENARIOS | {"avg"}  # cross-validation predicts every prompt
            for m in metrics.values():
                assert m["mae"] >= 0 and m["rmse"] >= m["mae"] and m["mae_p50"] >= 0 and m["mae_se"] >= 0
                assert all(0 <= m[k] <= 1 for k in ("acc", "acc_short", "acc_medium", "acc_long", "pool_acc",
                                                    "coverage_p10_p90") if m[k] is not None)
                assert ("mae_std" in m) == (name != "tfidf")  # the text model draws no seed
    assert r["methods"]["ltr_c"]["avg"]["coverage_p10_p90"] is None  # a ranker has no distribution
    assert r["noise_floor_mae"]["rl"] > 0 and r["noise_floor_mae"]["chat"] is None  # only RL is sampled more than once
    assert 0 <= r["ceiling_pool_accuracy"]["rl"]["in_sample"] <= 1 and r["ceiling"]["rl"]["prompts_2plus"] == 3
    assert set(r["scenario_median"]) == SCENARIOS | {"avg"}  # the prompt-free reference row
    assert r["dataset"]["prompts"] == 17 and r["dataset"]["splits"]["test"] == {"prompts": 2, "samples": 2}
    e = r["evaluation"]
    assert e["folds"] == 2 and e["seeds"] == 2 and e["best"] in {**r["methods"], **r["toward_ceiling"]}
    assert {"estp_vs_egtp", "estp_vs_ltr_c", "estp_vs_tfidf"} <= set(e["paired_tests"])
    for test in e["paired_tests"].values():
        assert 0 <= test["p_value"] <= 1 and 0 <= test["p50"]["p_value"] <= 1 and test["prompts"] == 17
    assert r["training"]["ltr_c"]["val_neg_spearman"] <= 1 and "C" in r["training"]["tfidf"]


def test_overhead_and_token_weights(result):
    r, _ = result
    o = r["overhead"]
    assert o["predictors"][0] == "estp" and set(o["predictors"]) == {"estp", r["evaluation"]["best"]}
    for batch in ("batch_1", "batch_2"):
        for name in o["predictors"]:
            assert o[batch]["prefill_ms_per_request"] > 0 and o[batch][f"{name}_ms_per_request"] > 0
            assert o[batch][f"{name}_peak_mib"] >= 0 and o[batch]["prompt_tokens"] == [12] * int(batch[-1])
    assert o["estp_over_prefill"] == o["batch_1"]["estp_latency_ratio"] > 0
    shares = r["weight_shares"]
    assert (shares["prefix_tokens"], shares["suffix_tokens"]) == (24, 6)  # SmolLM2's system prompt, assistant turn
    for method in ("estp", "egtp"):
        m = shares[method]
        assert 0 <= m["last"] <= m["suffix"] <= 1 and 0 <= m["prefix"] < 1 and m["effective_tokens"] >= 1
    for example in r["token_weights"]:
        assert len(example["tokens"]) == len(example["estp"]) == len(example["egtp"])
        assert sum(example["estp"]) == pytest.approx(1, abs=1e-4) and example["estp"][0] == 0  # sink masked
