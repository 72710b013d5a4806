"""Prediction metrics, defined once: MAE, RMSE and Short/Medium/Long accuracy, per scenario.

Every sample is one row: a prompt sampled 8 times (RL) contributes 8 errors against the same
prediction, as in training. A prediction's class comes from its expected tokens, the number a
scheduler acts on. "avg" is the unweighted mean over scenarios (the paper's Avg column), so the
RL scenario's many samples do not swamp the others.
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


def scores(predicted, true) -> dict:
    """n, MAE, RMSE, 3-class accuracy, and per-class accuracy (recall of each true class, None if absent)."""
    p, t = np.asarray(predicted, dtype=float), np.asarray(true, dtype=float)
    if p.shape != t.shape or p.size == 0:
        raise ValueError(f"need equally many predictions and lengths, at least one: {p.shape} vs {t.shape}")
    err = p - t
    hit = length_class(p) == length_class(t)
    out = {"n": int(t.size), "mae": float(np.abs(err).mean()), "rmse": float(np.sqrt((err ** 2).mean())),
           "acc": float(hit.mean()),
           # Standard error of the MAE over test samples: how far apart two MAEs must be to mean much.
           "mae_se": float(np.abs(err).std(ddof=1) / np.sqrt(t.size)) if t.size > 1 else None}
    for k, name in enumerate(CLASSES):
        of_class = length_class(t) == k
        out[f"acc_{name}"] = float(hit[of_class].mean()) if of_class.any() else None
    return out


def by_scenario(predicted, true, scenarios) -> dict:
    """{scenario: scores, ..., "avg": mean of each metric over the scenarios that have it}."""
    p, t, s = np.asarray(predicted, dtype=float), np.asarray(true, dtype=float), np.asarray(scenarios)
    out = {name: scores(p[s == name], t[s == name]) for name in sorted(set(s.tolist()))}
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
        elif key == "mae_se":
            out[key] = float(np.sqrt((values ** 2).sum()) / values.size)
        else:
            out[key] = float(values.mean())
    return out


def over_seeds(runs: list[dict]) -> dict:
    """Per-scenario metrics averaged over training seeds, with the seeds' spread of MAE (mae_std).
    Every seed scores the same test samples: n and the sampling error are the first seed's."""
    out = {}
    for scenario in runs[0]:
        rows = [r[scenario] for r in runs]
        out[scenario] = {**average(rows), "n": rows[0]["n"], "mae_se": rows[0]["mae_se"]}
        if len(runs) > 1:
            out[scenario]["mae_std"] = float(np.std([r["mae"] for r in rows]))
    return out
