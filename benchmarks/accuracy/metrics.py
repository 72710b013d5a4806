"""Prediction metrics, defined once: MAE, RMSE and Short/Medium/Long accuracy, per scenario.

Every sample is one row: a prompt sampled 8 times (RL) contributes 8 errors against the same
prediction, as in training. A prediction's class comes from its expected tokens, the number a
scheduler acts on. "avg" is the unweighted mean over scenarios (the paper's Avg column), so the
RL scenario's many samples do not swamp the others.

Predictions may come from several training seeds ([seeds, N]): MAE is their mean, `mae_std`
their spread, and the standard error `mae_se` is that of the seed-averaged errors. The samples
of one prompt share a prediction, so their errors are not independent: given the prompt of each
sample, the standard error is clustered by prompt.
"""

from __future__ import annotations

import numpy as np

# The paper's length classes: Short < 200 tokens, Medium 200-500, Long > 500.
SHORT_BELOW = 200
LONG_ABOVE = 500
CLASSES = ("short", "medium", "long")


def length_class(tokens) -> np.ndarray:
    """0 short, 1 medium, 2 long; 200 and 500 themselves are medium."""
    t = np.asarray(tokens, dtype=float)
    return np.where(t < SHORT_BELOW, 0, np.where(t > LONG_ABOVE, 2, 1))


def clustered_se(values, groups=None) -> float | None:
    """Standard error of the mean of `values`, treating each group (prompt) as one independent
    draw (cluster-robust); without groups, every value is one. None below two groups."""
    v = np.asarray(values, dtype=float)
    groups = np.arange(v.size) if groups is None else np.asarray(groups)
    _, index = np.unique(groups, return_inverse=True)
    g = index.max() + 1 if v.size else 0
    if g < 2:
        return None
    residual_sums = np.bincount(index, weights=v - v.mean(), minlength=g)
    return float(np.sqrt(g / (g - 1) * (residual_sums ** 2).sum()) / v.size)


def scores(predicted, true, groups=None) -> dict:
    """n, MAE (+ its standard error and, over several seeds, their spread), RMSE, 3-class accuracy,
    and per-class accuracy (recall of each true class, None if absent). `predicted` is [N] or
    [seeds, N]."""
    p, t = np.atleast_2d(np.asarray(predicted, dtype=float)), np.asarray(true, dtype=float)
    if p.shape[1:] != t.shape or t.size == 0:
        raise ValueError(f"need equally many predictions and lengths, at least one: {p.shape} vs {t.shape}")
    err = p - t
    hit = length_class(p) == length_class(t)
    out = {"n": int(t.size), "mae": float(np.abs(err).mean()),
           "mae_se": clustered_se(np.abs(err).mean(0), groups),
           "rmse": float(np.sqrt((err ** 2).mean(1)).mean()), "acc": float(hit.mean())}
    if p.shape[0] > 1:
        out["mae_std"] = float(np.abs(err).mean(1).std())
    for k, name in enumerate(CLASSES):
        of_class = length_class(t) == k
        out[f"acc_{name}"] = float(hit[:, of_class].mean()) if of_class.any() else None
    return out


def by_scenario(predicted, true, scenarios, groups=None, score=scores) -> dict:
    """{scenario: score(...), ..., "avg": mean of each metric over the scenarios that have it}.
    `predicted` is [N] or [seeds, N]; `score` maps (predicted, true, groups) to a dict of metrics."""
    p = np.atleast_2d(np.asarray(predicted, dtype=float))
    t, s = np.asarray(true, dtype=float), np.asarray(scenarios)
    g = np.arange(t.size) if groups is None else np.asarray(groups)
    out = {name: score(p[:, s == name], t[s == name], g[s == name]) for name in sorted(set(s.tolist()))}
    out["avg"] = average(list(out.values()))
    return out


def average(rows: list[dict]) -> dict:
    """Mean of every metric over independent groups (scenarios), skipping None; n is summed and
    the standard error of a mean of independent MAEs is sqrt(sum se^2) / count."""
    out = {}
    for key in rows[0]:
        values = np.array([r[key] for r in rows if r.get(key) is not None], dtype=float)
        if key == "n":
            out[key] = int(values.sum())
        elif not values.size:
            out[key] = None
        elif key.endswith("_se"):
            out[key] = float(np.sqrt((values ** 2).sum()) / values.size)
        else:
            out[key] = float(values.mean())
    return out
