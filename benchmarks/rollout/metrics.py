"""A batch's figures from its samples' (finish time, tokens, replica, group), simulated or real.

- makespan: the last sample's finish, from the batch's start (a training step waits for it);
- tail share: the part of the makespan after 90% of the samples had finished (the stragglers);
- throughput: tokens over the makespan;
- imbalance: the busiest replica's tokens over the mean replica's, minus one (veRL #658's ~30%);
- padding ratio (DESIGN.md): over the groups decoded together, sum(n * max - sum) / sum;
- mean JCT: with every sample there at t = 0, its finish time (the paper's Table 5 column).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from benchmarks.replay.metrics import padding_ratio


def batch_metrics(finish: list[float], tokens: list[int], replica: list, group: list | None = None) -> dict:
    finish_a, tokens_a = np.asarray(finish, float), np.asarray(tokens, float)
    makespan = float(finish_a.max())
    per_replica = defaultdict(float)
    for r, t in zip(replica, tokens):
        per_replica[r] += t
    loads = np.array(list(per_replica.values()))
    groups = None
    if group is not None and all(g is not None for g in group):
        by_group = defaultdict(list)
        for g, t in zip(group, tokens):
            by_group[g].append(int(t))
        groups = list(by_group.values())
    return {
        "samples": len(finish), "makespan_s": makespan,
        "tail_share": (makespan - float(np.quantile(finish_a, 0.9))) / makespan if makespan > 0 else None,
        "throughput_tok_s": float(tokens_a.sum()) / makespan if makespan > 0 else None,
        "imbalance": float(loads.max() / loads.mean() - 1) if len(loads) else None,
        "padding_ratio": padding_ratio(groups) if groups else None,
        "mean_jct_s": float(finish_a.mean()),
    }
