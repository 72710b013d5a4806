"""Train a variant on the train split (early stop on val), predict the test split, score it.

Inputs are computed once per variant and shared by its seeds: pooled prefill features from the
feature cache, or the proxy encoder's embeddings. Training is predictor/train.py's own loop.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import zip_longest
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from benchmarks.accuracy.metrics import by_scenario, over_seeds
from benchmarks.accuracy.variants import Variant
from predictor.dataset import load_samples
from benchmarks.forelen.datasheet import noise_floor_mae
from predictor.head import LengthBins, LengthHead
from predictor.losses import LossConfig
from predictor.train import Example, FeatureCache, pooled_inputs, train_on_inputs

SPLITS = ("train", "val", "test")
# Fewer test prompts with several samples than this, and the noise floor uses all splits.
MIN_NOISE_FLOOR_PROMPTS = 10


def round_robin(examples: list[Example], scenario: dict[str, str]) -> list[Example]:
    """One prompt of each scenario in turn, each scenario's prompts in their given order."""
    queues = defaultdict(list)
    for e in examples:
        queues[scenario[e.prompt_id]].append(e)
    return [e for row in zip_longest(*(queues[name] for name in sorted(queues))) for e in row if e is not None]


def limit_examples(examples: list[Example], limit: int | None, scenario: dict[str, str]) -> list[Example]:
    """Whole prompts, taken round-robin over scenarios, until `limit` samples: a quick run still
    sees every scenario. None keeps everything."""
    if limit is None:
        return examples
    kept, samples = [], 0
    for e in round_robin(examples, scenario):
        if samples >= limit:
            break
        kept.append(e)
        samples += len(e.lengths)
    return kept


def split_inputs(variant: Variant, splits: dict[str, list[Example]], cache: FeatureCache,
                 proxy: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """[P, d] head inputs per split for this variant."""
    if variant.proxy:
        return proxy
    return {s: pooled_inputs(cache, splits[s], variant.recipe, variant.debias) for s in SPLITS}


def expected_tokens(head: LengthHead, bins: LengthBins, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return bins.expected(head(x).softmax(-1))


def match_quantiles(scores: np.ndarray, reference_scores: np.ndarray, reference_lengths: np.ndarray) -> np.ndarray:
    """Map each score to the training length at the same quantile: keeps a ranker's order and
    gives it the training distribution's scale."""
    ranked = np.sort(reference_scores)
    q = (np.searchsorted(ranked, scores, "left") + np.searchsorted(ranked, scores, "right")) / (2 * len(ranked))
    return np.quantile(reference_lengths, np.clip(q, 0, 1))


def per_sample(values, examples: list[Example]) -> np.ndarray:
    """A per-prompt array repeated once per sampled length."""
    return np.repeat(np.asarray(values), [len(e.lengths) for e in examples])


def evaluate(variant: Variant, x: dict[str, torch.Tensor], splits: dict[str, list[Example]],
             scenario: dict[str, str], max_tokens: int, seeds: int, **fit) -> tuple[dict, dict]:
    """(test metrics per scenario averaged over seeds, val metrics averaged over seeds)."""
    train, test = splits["train"], splits["test"]
    truth = np.array([length for e in test for length in e.lengths], dtype=float)
    scenarios = per_sample([scenario[e.prompt_id] for e in test], test)
    runs, val = [], defaultdict(list)
    for seed in range(seeds):
        head, bins, metrics = train_on_inputs(x["train"], x["val"], train, splits["val"], variant.recipe.bins,
                                              LossConfig(name=variant.recipe.loss), max_tokens, seed=seed, **fit)
        predicted = per_sample(expected_tokens(head, bins, x["test"]).numpy(), test)
        if variant.ranking:
            reference = per_sample(expected_tokens(head, bins, x["train"]).numpy(), train)
            predicted = match_quantiles(predicted, reference, [length for e in train for length in e.lengths])
        runs.append(by_scenario(predicted, truth, scenarios))
        for k, v in metrics.items():
            val[k].append(v)
    return over_seeds(runs), {k: float(np.mean(v)) for k, v in val.items()}


def scenario_median(splits: dict[str, list[Example]], scenario: dict[str, str]) -> dict:
    """Test metrics of predicting each scenario's median training length, without looking at the
    prompt: what a head must beat to have learned anything from the prefill."""
    train, test = splits["train"], splits["test"]
    medians = {name: np.median([x for e in train if scenario[e.prompt_id] == name for x in e.lengths])
               for name in {scenario[e.prompt_id] for e in train}}
    scenarios = per_sample([scenario[e.prompt_id] for e in test], test)
    truth = np.array([length for e in test for length in e.lengths], dtype=float)
    return by_scenario(np.array([medians[s] for s in scenarios]), truth, scenarios)


def score_variants(variants: dict[str, Variant], splits: dict[str, list[Example]], cache: FeatureCache,
                   proxy: dict[str, torch.Tensor] | None, scenario: dict[str, str], max_tokens: int, seeds: int,
                   **fit) -> dict:
    """Test metrics of every variant under its group ("methods", "ablations", "lambda_sweep", the
    sweep keyed by lambda), with table labels and val metrics; identical variants train once."""
    done: dict[str, tuple[dict, dict]] = {}
    result: dict = {"methods": {}, "ablations": {}, "lambda_sweep": {}, "labels": {}, "training": {}}
    for name, v in tqdm(variants.items(), desc="methods"):
        if v.key() not in done:
            done[v.key()] = evaluate(v, split_inputs(v, splits, cache, proxy), splits, scenario, max_tokens, seeds, **fit)
        test, val = done[v.key()]
        slot = f"{v.recipe.pooling.lam:g}" if v.group == "lambda_sweep" else name
        result[v.group][slot] = test
        result["labels"][slot] = v.label
        result["training"][name] = val
    return result


def noise_floors(dataset: Path, scenarios: list[str], first: int | None = None) -> tuple[dict, dict]:
    """Noise floor MAE per scenario from the test split, or from all splits where the test split
    has too few prompts sampled more than once; (values, where each came from)."""
    values, sources = {}, {}
    for name in scenarios:
        for split in ("test", None):
            rows = load_samples(dataset, split=split, scenario=name, first=first)
            counts = defaultdict(int)
            for r in rows:
                counts[r["prompt_id"]] += 1
            multi = sum(c > 1 for c in counts.values())
            if multi >= MIN_NOISE_FLOOR_PROMPTS or split is None:
                break
        values[name] = noise_floor_mae(rows)
        sources[name] = f"{split or 'all splits'}: {multi} prompts sampled more than once"
    return values, sources
