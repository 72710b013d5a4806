"""The simulator's prediction cache serves only what the deployed predictor would answer now."""

import json

from benchmarks.simulator import predictions
from predictor.estimator import prompt_tail


def test_a_prompt_is_predicted_from_its_last_tokens_only_when_a_limit_is_set():
    ids = list(range(10))
    assert prompt_tail(ids, 4) == [6, 7, 8, 9]
    assert prompt_tail(ids, 20) == ids
    assert prompt_tail(ids, None) == ids


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_entries_of_other_token_ids_or_checkpoints_are_pruned_and_never_served(tmp_path, monkeypatch):
    monkeypatch.setattr(predictions, "RESULTS", tmp_path)
    monkeypatch.setattr(predictions, "checkpoint_hash", lambda name: "now")
    whole, tail, short = list(range(300)), list(range(44, 300)), [1, 2, 3]
    prediction = {"expected_tokens": 10.0, "quantiles": {"p10": 5.0, "p50": 9.0, "p90": 20.0}, "bin": 0,
                  "probabilities": [1.0]}
    _write(predictions.cache_path("last"), [
        # the long prompt predicted whole (before truncation), then from its tail
        {"prompt_id": "long", "ids": predictions.ids_hash(whole), "prompt_tokens": 300, "checkpoint": "now",
         "prediction": {**prediction, "expected_tokens": 1.0}},
        {"prompt_id": "short", "ids": predictions.ids_hash(short), "prompt_tokens": 3, "checkpoint": "old",
         "prediction": prediction},
        {"prompt_id": "short", "ids": predictions.ids_hash(short), "prompt_tokens": 3, "checkpoint": "now",
         "prediction": prediction},
    ])
    predictions.prune_stale("last", {"long": prompt_tail(whole, 256), "short": short})
    assert prompt_tail(whole, 256) == tail
    kept = [json.loads(line) for line in predictions.cache_path("last").read_text().splitlines()]
    assert [(r["prompt_id"], r["checkpoint"]) for r in kept] == [("short", "now")]
    assert set(predictions.load_cache("last")) == {"short"}
