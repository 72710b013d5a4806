"""Serving metrics of one replay (docs/DESIGN.md), from its per-request records.

Choices the design leaves open, made here once:
- Throughput (output tokens/s, requests/s) counts completed requests over the run's span, from
  the first arrival to the last finish.
- Short requests are those whose true output length (the dataset's) is at or below the trace's
  25th percentile: the same requests under every policy and application, whatever was generated.
- Padding ratio, over groups of requests decoded together: sum(n * max_len - sum(len)) /
  sum(len) over all groups, with the real completion lengths (a ratio of sums, so a few tiny
  groups cannot dominate). Batch mode: its groups. Open loop (continuous batching pads nothing):
  each pool's requests in arrival order, cut into consecutive groups of the batch size: the
  padding a static batcher of that size would pay on what the policy sent to each pool, i.e.
  how length-homogeneous the policy makes its pools.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from benchmarks.replay.records import RequestRecord


def padding_ratio(groups: list[list[int]]) -> float | None:
    useful = sum(sum(g) for g in groups)
    if useful == 0:
        return None
    return sum(len(g) * max(g) - sum(g) for g in groups if g) / useful


def decode_groups(records: list[RequestRecord], batch_size: int) -> list[list[int]]:
    """Completion lengths of the groups decoded together (see the module docstring)."""
    done = [r for r in records if r.status == "ok"]
    if any(r.mode == "batch" for r in done):
        by_group: dict[int, list[int]] = defaultdict(list)
        for r in done:
            by_group[r.group].append(r.completion_tokens)
        return list(by_group.values())
    by_pool: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in sorted(done, key=lambda r: r.arrival_s):
        by_pool[r.pool].append(r)
    return [[r.completion_tokens for r in reqs[i:i + batch_size]]
            for reqs in by_pool.values() for i in range(0, len(reqs), batch_size)]


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def short_ids(records: list[RequestRecord]) -> set[str]:
    """The requests at or below the 25th percentile of true output length."""
    lengths = {r.request_id: r.true_output_tokens for r in records}
    if not lengths:
        return set()
    edge = np.percentile(list(lengths.values()), 25)
    return {rid for rid, n in lengths.items() if n <= edge}


def short_answer_jcts(done: list[RequestRecord]) -> list[float]:
    """The JCTs of the answers that came out short (at or below the run's 25th percentile of
    generated length). At natural lengths a request's "true" length is the dataset's sample, one
    draw, and the run draws its own: a request short there may run long here, so `short_p99_jct_s`
    mixes long answers in. These are the short jobs the run actually served."""
    if not done:
        return []
    edge = np.percentile([r.completion_tokens for r in done], 25)
    return [r.jct_s for r in done if r.completion_tokens <= edge]


def summarise(records: list[RequestRecord], batch_size: int) -> dict:
    done = [r for r in records if r.status == "ok"]
    jct = [r.jct_s for r in done]
    ttft = [r.ttft_s for r in done]
    short = short_ids(records)
    span = (max(r.finish_s for r in done) - min(r.arrival_s for r in records)) if done else 0.0
    tokens = sum(r.completion_tokens for r in done)
    pools: dict[str, int] = defaultdict(int)
    for r in done:
        pools[r.pool] += 1
    predicted = [(r.predicted_tokens, r.completion_tokens) for r in done if r.predicted_tokens is not None]
    return {
        "requests": len(records), "completed": len(done), "failed": len(records) - len(done),
        "throughput_tok_s": tokens / span if span > 0 else None,
        "throughput_req_s": len(done) / span if span > 0 else None,
        "mean_jct_s": _mean(jct), "p50_jct_s": _pct(jct, 50), "p99_jct_s": _pct(jct, 99),
        "short_p99_jct_s": _pct([r.jct_s for r in done if r.request_id in short], 99),
        "short_answer_mean_jct_s": _mean(short_answer_jcts(done)),
        "mean_ttft_s": _mean(ttft), "p99_ttft_s": _pct(ttft, 99),
        "padding_ratio": padding_ratio(decode_groups(records, batch_size)),
        "prediction_mae": _mean([abs(p - c) for p, c in predicted]),
        "pools": dict(sorted(pools.items())),
        "span_s": span, "output_tokens": tokens,
    }
