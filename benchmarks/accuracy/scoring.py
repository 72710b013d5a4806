"""Scores of out-of-fold predictions, and the paired test that says whether two methods differ.

Every method is scored twice: by its expected length (what the paper reports) and by its
predicted median p50 (the MAE-optimal point of its distribution). Pool accuracy is the share of
samples routed to the pool their true length falls in (the router's pools), and coverage the
share of true lengths inside the predicted [p10, p90] (predictor.calibration; 80% when the
distribution is calibrated). `_multi` metrics cover only the prompts sampled more than once: the
same samples as the noise floor and the ceiling, so the two can be compared.

Paired test: all methods predict the same samples, so their difference is judged per prompt
(its samples' mean absolute error, averaged over seeds), which removes the between-prompt spread
that makes two unpaired MAEs look alike. The statistic is the difference of the average-over-
scenarios MAE, with a standard error clustered by prompt within each scenario (t-test); the
Wilcoxon signed-rank test on the per-prompt differences is reported beside it as a check that
does not assume normal errors.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from benchmarks.accuracy.crossval import Corpus, from_points
from benchmarks.accuracy.folds import fold_split
from benchmarks.accuracy.metrics import average, clustered_se, scores
from predictor.calibration import interval_coverage
from router.scheduling.pools import Pools


def _metrics(pred: dict[str, np.ndarray], truth: np.ndarray, prompts: np.ndarray, true_pool: np.ndarray,
             multi: np.ndarray) -> dict:
    """Metrics of [seeds, n] predictions of one scenario's n samples."""
    out = scores(pred["expected"], truth, prompts)
    p50_errors = np.abs(pred["p50"] - truth).mean(0)
    hits = pred["pool"] == true_pool
    out.update(mae_p50=float(p50_errors.mean()), mae_p50_se=clustered_se(p50_errors, prompts),
               pool_acc=float(hits.mean()),
               coverage_p10_p90=None if np.isnan(pred["p10"]).any() else float(np.mean(
                   [interval_coverage(lo, hi, truth) for lo, hi in zip(pred["p10"], pred["p90"])])),
               mae_multi=float(np.abs(pred["expected"][:, multi] - truth[multi]).mean()) if multi.any() else None,
               pool_acc_multi=float(hits[:, multi].mean()) if multi.any() else None)
    return out


def score(pred: dict[str, np.ndarray], corpus: Corpus, pools: Pools) -> dict:
    """{scenario: metrics, ..., "avg": their unweighted mean} of per-prompt predictions [seeds, P]."""
    rows, truth = corpus.samples()
    scenarios = np.asarray(corpus.scenarios)[rows]
    true_pool = np.array([pools.names.index(pools.pool_of(t)) for t in truth])
    multi = np.array([len(corpus.examples[p].lengths) > 1 for p in rows])
    per_sample = {f: np.atleast_2d(v)[:, rows] for f, v in pred.items()}
    out = {}
    for name in sorted(set(corpus.scenarios)):
        mask = scenarios == name
        out[name] = _metrics({f: v[:, mask] for f, v in per_sample.items()}, truth[mask], rows[mask],
                             true_pool[mask], multi[mask])
    out["avg"] = average(list(out.values()))
    return out


def sample_errors(pred: dict[str, np.ndarray], corpus: Corpus, field: str = "expected") -> np.ndarray:
    """Per-sample absolute error of `field`, averaged over seeds."""
    rows, truth = corpus.samples()
    return np.abs(np.atleast_2d(pred[field])[:, rows] - truth).mean(0)


def paired_test(errors_a: np.ndarray, errors_b: np.ndarray, corpus: Corpus) -> dict:
    """Is method a's average MAE different from b's? Per-sample absolute errors of both."""
    rows, _ = corpus.samples()
    scenarios = np.asarray(corpus.scenarios)[rows]
    d = errors_a - errors_b
    names = sorted(set(scenarios.tolist()))
    means = [d[scenarios == s].mean() for s in names]
    ses = [clustered_se(d[scenarios == s], rows[scenarios == s]) for s in names]
    difference = float(np.mean(means))
    se = float(np.sqrt(np.sum(np.square(ses))) / len(names))
    n_prompts = len(np.unique(rows))
    t = difference / se if se > 0 else 0.0
    counts = np.bincount(rows)
    per_prompt = np.bincount(rows, weights=d)[counts > 0] / counts[counts > 0]
    wilcoxon = stats.wilcoxon(per_prompt).pvalue if np.any(per_prompt != 0) else 1.0
    return {"mae_difference": difference, "se": se, "t": float(t),
            "p_value": float(2 * stats.t.sf(abs(t), df=n_prompts - len(names))),
            "wilcoxon_p_value": float(wilcoxon), "prompts": n_prompts}


def scenario_median(corpus: Corpus, pools: Pools) -> dict[str, np.ndarray]:
    """Out-of-fold predictions of each scenario's median training length, without reading the
    prompt: what a head must beat to have learned anything from it."""
    points = np.zeros(len(corpus.examples))
    scenarios = np.asarray(corpus.scenarios)
    for fold in range(int(corpus.folds.max()) + 1):
        train, val, held_out = fold_split(corpus.folds, fold, corpus.scenarios)
        seen = np.concatenate([train, val])
        for name in set(scenarios[held_out].tolist()):
            lengths = [x for i in seen[scenarios[seen] == name] for x in corpus.examples[i].lengths]
            points[held_out[scenarios[held_out] == name]] = np.median(lengths)
    return from_points(points, pools)
