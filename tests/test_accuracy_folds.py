"""Cross-validation folds: by prompt, stratified by scenario, inner validation apart."""

from collections import Counter, defaultdict

import numpy as np

from benchmarks.accuracy.crossval import Corpus
from benchmarks.accuracy.folds import fold_split, prompt_folds
from predictor.dataset import load_samples
from predictor.train import Example
from tests import FORELEN_TINY


def _corpus_of_rows(rows: list[dict], k: int) -> Corpus:
    """Samples grouped into prompts the way the benchmark groups them."""
    by_prompt: dict[str, Example] = {}
    scenario = {}
    for r in rows:
        by_prompt.setdefault(r["prompt_id"], Example(r["prompt_id"], [])).lengths.append(r["output_tokens"])
        scenario[r["prompt_id"]] = r["scenario"]
    examples = list(by_prompt.values())
    scenarios = [scenario[e.prompt_id] for e in examples]
    return Corpus(examples, scenarios, [""] * len(examples), prompt_folds(scenarios, k), 1024)


def test_every_sample_of_a_prompt_lands_in_one_fold():
    rows = load_samples(FORELEN_TINY)
    rows = rows + [{**r, "sample_idx": r["sample_idx"] + 100} for r in rows[::3]]  # more multi-sample prompts
    corpus = _corpus_of_rows(rows[::-1], k=2)  # samples of a prompt far apart in the file
    prompt_of_sample, _ = corpus.samples()
    folds_of = defaultdict(set)
    for p in prompt_of_sample:
        folds_of[corpus.examples[p].prompt_id].add(int(corpus.folds[p]))
    assert len(prompt_of_sample) == len(rows)
    assert all(len(f) == 1 for f in folds_of.values())
    assert {f for fs in folds_of.values() for f in fs} == {0, 1}


def test_folds_are_stratified_by_scenario_and_inner_splits_are_disjoint():
    scenarios = ["rl"] * 20 + ["chat"] * 60 + ["longseq"] * 40
    folds = prompt_folds(scenarios, k=5, seed=3)
    for fold in range(5):
        counts = Counter(s for s, f in zip(scenarios, folds) if f == fold)
        assert counts == {"rl": 4, "chat": 12, "longseq": 8}
        train, val, held_out = fold_split(folds, fold, scenarios)
        assert not set(train) & set(val) and not set(train) & set(held_out) and not set(val) & set(held_out)
        assert sorted([*train, *val, *held_out]) == list(range(len(scenarios)))
        in_val = Counter(scenarios[i] for i in val)  # 15 of the 96 other prompts, in proportion
        assert sum(in_val.values()) == 15
        assert all(abs(in_val[s] - 15 * n / 120) <= 1 for s, n in Counter(scenarios).items())
    assert not np.array_equal(folds, prompt_folds(scenarios, k=5, seed=4))


def test_tiny_corpora_fall_back_to_an_unstratified_inner_split():
    scenarios = ["a", "a", "b", "b", "c", "c", "d", "d"]
    folds = prompt_folds(scenarios, k=2)
    train, val, held_out = fold_split(folds, 0, scenarios)
    assert len(val) == 1 and len(train) == 3 and len(held_out) == 4
