"""K-fold cross-validation of every variant: each prompt predicted once by a head that never saw it.

Per variant, seed and fold: train on the training folds (early stopping and calibration on their
inner validation part, benchmarks.accuracy.folds), predict the held-out fold, and keep, per
prompt, what a scheduler reads: expected length, p10/p50/p90 and the pool the router would pick
(most predicted mass, router.scheduling.pools). Those out-of-fold predictions are stored per variant
and seed under the cache folder, keyed by the variant and the data, so a stopped run resumes and
a rerun only trains what changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from benchmarks.accuracy import text_baseline
from benchmarks.accuracy.folds import INNER_VAL_FRACTION, fold_split
from benchmarks.accuracy.variants import Variant
from predictor.calibration import central_interval
from predictor.fit import train_on_inputs
from predictor.head import LengthBins
from predictor.losses import LossConfig
from predictor.targets import sample_rows
from predictor.train import Example
from router.scheduling.pools import Pools

FIELDS = ("expected", "p10", "p50", "p90", "pool")


@dataclass
class Corpus:
    """Every prompt of the run with its scenario, text and fold."""

    examples: list[Example]
    scenarios: list[str]
    texts: list[str]
    folds: np.ndarray
    max_tokens: int

    @property
    def lengths(self) -> list[list[int]]:
        return [e.lengths for e in self.examples]

    def samples(self) -> tuple[np.ndarray, np.ndarray]:
        """(prompt index, true length) of every sample."""
        rows, truth = sample_rows(self.lengths)
        return rows.numpy(), truth.numpy().astype(float)

    def fingerprint(self) -> str:
        data = [[e.prompt_id, e.lengths] for e in self.examples], self.folds.tolist(), self.max_tokens, INNER_VAL_FRACTION
        return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


def from_distribution(probs: torch.Tensor, bins: LengthBins, pools: Pools) -> dict[str, np.ndarray]:
    """Per-prompt summary of predicted distributions [n, K]."""
    p10, p90 = central_interval(probs, bins)
    masses = [pools.masses(bins, row) for row in probs.tolist()]
    return {"expected": bins.expected(probs).numpy(), "p10": p10.numpy(), "p50": bins.quantile(probs, 0.5).numpy(),
            "p90": p90.numpy(), "pool": np.array([pools.names.index(max(m, key=m.get)) for m in masses])}


def from_points(points: np.ndarray, pools: Pools) -> dict[str, np.ndarray]:
    """Per-prompt summary of point predictions: no spread, the pool that holds the point."""
    nan = np.full(len(points), np.nan)
    return {"expected": points, "p10": nan, "p50": points, "p90": nan,
            "pool": np.array([pools.names.index(pools.pool_of(p)) for p in points])}


def match_quantiles(scores: np.ndarray, reference_scores: np.ndarray, reference_lengths: np.ndarray) -> np.ndarray:
    """Map each score to the training length at the same quantile: keeps a ranker's order and
    gives it the training distribution's scale."""
    ranked = np.sort(reference_scores)
    q = (np.searchsorted(ranked, scores, "left") + np.searchsorted(ranked, scores, "right")) / (2 * len(ranked))
    return np.quantile(reference_lengths, np.clip(q, 0, 1))


def _predict_fold(variant: Variant, inputs, corpus: Corpus, pools: Pools, split, seed: int):
    """(summary of the held-out prompts, training metrics) for one fold."""
    train, val, held_out = split
    lengths = corpus.lengths
    if variant.model == "logistic":
        log_probs, bins, chosen = text_baseline.logistic_log_probs(inputs, lengths, train, val, variant.recipe.bins,
                                                                   corpus.max_tokens)
        return from_distribution(log_probs[held_out].softmax(-1), bins, pools), chosen
    if variant.model == "ridge":
        points, chosen = text_baseline.ridge_points(inputs, lengths, train, val)
        return from_points(points[held_out], pools), chosen
    fit = variant.recipe.fit.model_copy(update={"seed": seed})
    head, bins, metrics = train_on_inputs(inputs[train], inputs[val], [lengths[i] for i in train],
                                          [lengths[i] for i in val], variant.recipe.bins,
                                          LossConfig(name=variant.recipe.loss), corpus.max_tokens, fit)
    with torch.no_grad():
        probs = head(inputs[held_out]).softmax(-1)
        if not variant.ranking:
            return from_distribution(probs, bins, pools), metrics
        reference = bins.expected(head(inputs[train]).softmax(-1)).numpy()
    _, train_lengths = sample_rows([lengths[i] for i in train])
    reference = np.repeat(reference, [len(lengths[i]) for i in train])
    return from_points(match_quantiles(bins.expected(probs).numpy(), reference, train_lengths.numpy()), pools), metrics


def cross_validate(variant: Variant, inputs_of: Callable[[Variant], object], corpus: Corpus, pools: Pools,
                   seed: int, cache_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Out-of-fold predictions of every prompt ({field: [P]}) and the mean training metrics over
    folds, from the cache when this variant, seed and data were run before (then its inputs are
    not even computed)."""
    key = hashlib.sha256(f"{variant.key()}|{corpus.fingerprint()}|{pools}|{seed}".encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"{key}.npz"
    if path.exists():
        stored = np.load(path)
        return {f: stored[f] for f in FIELDS}, json.loads(str(stored["metrics"]))
    inputs = inputs_of(variant)
    out = {f: np.zeros(len(corpus.examples)) for f in FIELDS}
    metrics: dict[str, list[float]] = {}
    for fold in range(int(corpus.folds.max()) + 1):
        split = fold_split(corpus.folds, fold, corpus.scenarios)
        summary, fold_metrics = _predict_fold(variant, inputs, corpus, pools, split, seed)
        for f in FIELDS:
            out[f][split[2]] = summary[f]
        for k, v in fold_metrics.items():
            metrics.setdefault(k, []).append(float(v))
    mean = {k: float(np.mean(v)) for k, v in metrics.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial.npz")
    np.savez(tmp, **out, metrics=json.dumps(mean))
    tmp.rename(path)
    return out, mean


def run_variants(variants: dict[str, Variant], inputs_of: Callable[[Variant], object], corpus: Corpus,
                 pools: Pools, seeds: int,
                 cache_dir: Path) -> dict[str, tuple[dict[str, np.ndarray], dict[str, float]]]:
    """{name: ({field: [seeds, P]}, mean training metrics)}; identical variants run once, and the
    text models, which draw no random numbers, with one seed."""
    done: dict[str, tuple] = {}
    results = {}
    unique = {v.key(): v for v in variants.values()}.values()
    bar = tqdm(total=sum(seeds if v.model == "head" else 1 for v in unique), desc="cross-validation", unit="run")
    for name, variant in variants.items():
        if variant.key() not in done:
            runs = []
            for seed in range(seeds if variant.model == "head" else 1):
                runs.append(cross_validate(variant, inputs_of, corpus, pools, seed, cache_dir))
                bar.update(1)
            done[variant.key()] = ({f: np.stack([r[0][f] for r in runs]) for f in FIELDS},
                                   {k: float(np.mean([r[1][k] for r in runs])) for k in runs[0][1]})
        results[name] = done[variant.key()]
    bar.close()
    return results
