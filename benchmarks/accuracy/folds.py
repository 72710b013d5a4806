"""Cross-validation folds by prompt, stratified by scenario.

A 300-sample test split cannot tell methods apart (their MAEs differ by less than its standard
error), so every prompt of the dataset is predicted once, by a head trained without it: k folds
of prompts, each scenario spread evenly over them. A prompt is the unit, never a sample: its
samples share one input, and a head that saw one of them would be scored on its own training
data. Inside the training folds a stratified part is held out again for early stopping and the
temperature calibration, so the scored fold is touched by nothing but the final prediction.
"""

from __future__ import annotations

import numpy as np
from sklearn.model_selection import StratifiedKFold, train_test_split

INNER_VAL_FRACTION = 0.15


def prompt_folds(scenarios: list[str], k: int = 5, seed: int = 0) -> np.ndarray:
    """Fold (0..k-1) of each prompt; every scenario's prompts spread evenly over the folds."""
    folds = np.empty(len(scenarios), dtype=int)
    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    for fold, (_, held_out) in enumerate(splitter.split(np.zeros(len(scenarios)), scenarios)):
        folds[held_out] = fold
    return folds


def fold_split(folds: np.ndarray, fold: int, scenarios: list[str], seed: int = 0,
               val_fraction: float = INNER_VAL_FRACTION) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, inner validation, held-out) prompt indices for one fold. The inner split is
    stratified by scenario where every scenario has prompts enough for both parts (not so in a
    tiny test dataset)."""
    held_out = np.flatnonzero(folds == fold)
    rest = np.flatnonzero(folds != fold)
    labels = np.asarray(scenarios)[rest]
    _, counts = np.unique(labels, return_counts=True)
    n_val = int(np.ceil(val_fraction * len(rest)))
    stratify = labels if counts.min() >= 2 and len(counts) <= min(n_val, len(rest) - n_val) else None
    train, val = train_test_split(rest, test_size=n_val, stratify=stratify, random_state=seed)
    return np.sort(train), np.sort(val), held_out
