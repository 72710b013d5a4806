"""A bag-of-words floor: TF-IDF of the prompt text, then a linear model.

It reads no model at all, costs milliseconds, and on this dataset it already picks the right
length pool about as often as the prefill heads; a head that runs the serving model's prefill has
to clear it to justify itself. Two variants: multinomial logistic regression over the same length
bins the heads use (so it has a distribution, expected length and quantiles like them, calibrated
the same way), and ridge regression on the length (a point prediction only). Their
regularisation strength is picked on the inner validation prompts, as the heads' epochs are.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression, Ridge

from predictor.calibration import fit_temperature
from predictor.head import LengthBins
from predictor.targets import sample_rows

LOGISTIC_C = (0.3, 1.0, 3.0, 10.0)
RIDGE_ALPHA = (0.3, 1.0, 3.0, 10.0)


def _vectors(texts: list[str], train: np.ndarray):
    """TF-IDF fitted on the training prompts only, applied to every prompt."""
    vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2, max_features=50_000)
    vectorizer.fit([texts[i] for i in train])
    return vectorizer.transform(texts)


def _sample_matrix(x, prompts: np.ndarray, lengths: list[list[int]]):
    """One row per sampled length of the given prompts."""
    rows, y = sample_rows([lengths[i] for i in prompts])
    return x[prompts[rows.numpy()]], y


def logistic_log_probs(texts: list[str], lengths: list[list[int]], train: np.ndarray, val: np.ndarray,
                       num_bins: int, max_tokens: int) -> tuple[torch.Tensor, LengthBins, dict]:
    """Calibrated log-probabilities [P, K] over length bins for every prompt, the bins, and the
    chosen settings."""
    x = _vectors(texts, train)
    x_train, y_train = _sample_matrix(x, train, lengths)
    x_val, y_val = _sample_matrix(x, val, lengths)
    bins = LengthBins.from_lengths(y_train, k=num_bins, max_tokens=max_tokens)
    classes = bins.index(y_train).numpy()

    def log_probs(model, rows) -> torch.Tensor:
        out = torch.full((rows.shape[0], bins.k), -1e4)  # bins absent from training get ~0 probability
        out[:, model.classes_] = torch.as_tensor(model.predict_log_proba(rows), dtype=torch.float32)
        return out

    def val_mae(model) -> float:
        return (bins.expected(log_probs(model, x_val).softmax(-1)) - y_val).abs().mean().item()

    models = {c: LogisticRegression(C=c, max_iter=2000).fit(x_train, classes) for c in LOGISTIC_C}
    c = min(models, key=lambda k: val_mae(models[k]))
    temperature = fit_temperature(log_probs(models[c], x_val), y_val, bins)
    return log_probs(models[c], x) / temperature, bins, {"C": c, "temperature": temperature}


def ridge_points(texts: list[str], lengths: list[list[int]], train: np.ndarray, val: np.ndarray
                 ) -> tuple[np.ndarray, dict]:
    """Predicted length of every prompt and the chosen settings."""
    x = _vectors(texts, train)
    x_train, y_train = _sample_matrix(x, train, lengths)
    x_val, y_val = _sample_matrix(x, val, lengths)
    models = {a: Ridge(alpha=a).fit(x_train, y_train.numpy()) for a in RIDGE_ALPHA}
    alpha = min(models, key=lambda a: np.abs(models[a].predict(x_val) - y_val.numpy()).mean())
    return models[alpha].predict(x), {"alpha": alpha}
