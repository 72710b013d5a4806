"""Rollout sides: POST /v1/rollout with the scenario's RL batch, and a batch's figures from its samples.

The batch is the dataset's RL test prompts, each sampled n times, as an RL step asks. A side is a
schedule with where its lengths come from: the batch's order (`fifo`), or longest-first
(`makespan`) on the head's predictions, on each prompt's median over its dataset samples (the
ceiling), or on the prompt's own history (the side first runs the batch once as an epoch 1, not
recorded); `k` takes the first k of each prompt's n samples (the engines' in-flight count is
then watched until it is back to 0); a token budget stops samples as partial, and a second call
continues them. Each run's samples (text left out, each with the call it came from) are its
per-request records, which the report and the simulator's validation read; the machine's speed
probe (benchmarks.replay.probe) just before the measured call lies beside them, so the simulator
times a rollout on the machine it ran on, as it does a burst.

A batch's figures (benchmarks.report reads them):
- makespan: the last sample's finish, from the batch's start (a training step waits for it); for a
  partial side, the sum of both calls';
- tail share: the part of the makespan after 90% of the samples had finished (the stragglers);
- throughput: tokens over the makespan; mean JCT: each sample's finish (all there at t = 0);
- imbalance: the busiest replica's tokens over the mean replica's, minus one (veRL #658's ~30%).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict

import httpx
import numpy as np

from benchmarks.replay.actors import START_LEAD_S
from benchmarks.replay.probe import measure, probe_path
from benchmarks.replay.runs import run_path
from benchmarks.replay.stack import RunningStack
from benchmarks.replay.trace import rl_prompts
from benchmarks.scenarios import Rollout, Scenario, Side

INFLIGHT_POLL_S = 0.1


def rl_prompt_tokens(prompts: int) -> list[int]:
    return [p["prompt_tokens"] for p in rl_prompts(prompts, 1)]


def budget_tokens(batch: Rollout, quantile: float) -> int:
    """The budget at `quantile` of the batch's lengths in the dataset (at its max_tokens)."""
    lengths = [n for p in rl_prompts(batch.prompts, batch.max_tokens) for n in p["lengths"]]
    return max(1, round(float(np.quantile(lengths, quantile))))


def body(batch: Rollout, side: Side, model: str, schedule: str | None = None) -> dict:
    prompts = rl_prompts(batch.prompts, batch.max_tokens)
    known = None
    if side.lengths_from == "ceiling":
        known = [[round(statistics.median(p["lengths"]))] * batch.n for p in prompts]
    out = {"model": model, "prompts": [p["prompt"] for p in prompts], "n": batch.n, "max_tokens": batch.max_tokens,
           "schedule": schedule or side.schedule, "known_tokens": known,
           "head": "estp" if side.lengths_from == "head" else None, "k": side.k}
    if side.budget_quantile is not None:
        out["budget_tokens"] = budget_tokens(batch, side.budget_quantile)
    return out


def _post(stack: RunningStack, payload: dict, timeout_s: float) -> dict:
    r = httpx.post(f"{stack.base_url}/v1/rollout", json=payload, headers=stack.client_headers, timeout=timeout_s)
    r.raise_for_status()
    return r.json()


def inflight_zero_after_s(stack: RunningStack, answered: float, timeout_s: float = 60.0) -> float | None:
    """Seconds from the rollout's answer until every engine reports no unfinished request (None:
    not within `timeout_s`, or an engine that does not answer)."""
    while time.time() < answered + timeout_s:
        counts = [n for replicas in httpx.get(f"{stack.base_url}/health", timeout=30).json()["engine_requests"].values()
                  for n in replicas.values()]
        if counts and all(n == 0 for n in counts):
            return time.time() - answered
        time.sleep(INFLIGHT_POLL_S)
    return None


def execute(name: str, stack: RunningStack, actors: list, scenario: Scenario, side: Side,
            timeout_s: float = 3600) -> list[dict]:
    """One measured rollout of the scenario's batch (after its epoch 1, for a history side); its
    samples written as the run's records, with the machine's probe and a first-k run's drain time
    beside them."""
    batch = scenario.workload
    path = run_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if side.lengths_from == "history":
        _post(stack, body(batch, side, stack.model, schedule="fifo"), timeout_s)  # epoch 1: the lengths to rank by
    probe_path(path).write_text(json.dumps(measure(stack.base_url, actors, name, START_LEAD_S)) + "\n")
    first = _post(stack, body(batch, side, stack.model), timeout_s)
    answered = time.time()
    meta = {"inflight_zero_after_s": inflight_zero_after_s(stack, answered)} if side.k else {}
    samples = [{**s, "call": 1} for s in first["samples"]]
    partial = [s for s in first["samples"] if s.get("continuation_id")]
    if partial:
        second = _post(stack, {"model": stack.model, "continuations": [s["continuation_id"] for s in partial],
                               "max_tokens": batch.max_tokens, "schedule": "fifo"}, timeout_s)
        # A continued sample is the sample it continues (the answer numbers it in the continuations' order).
        samples += [{**s, "call": 2, "prompt_index": partial[s["continues"]]["prompt_index"],
                     "sample_index": partial[s["continues"]]["sample_index"]} for s in second["samples"]]
    samples = [{k: v for k, v in s.items() if k not in ("text", "continuation_id")} for s in samples]
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    if meta:
        path.with_suffix(".meta.json").write_text(json.dumps(meta) + "\n")
    return samples


def _one_call(samples: list[dict]) -> dict:
    """A sample cut before it started (first-k) never ran: it has no finish to count."""
    ok = [s for s in samples if s["error"] is None and s["finished_s"] is not None]
    finish = np.array([s["finished_s"] for s in ok], float)
    tokens = np.array([s["completion_tokens"] for s in ok], float)
    makespan = float(finish.max())
    per_replica = defaultdict(float)
    for s in ok:
        per_replica[s["replica"]] += s["completion_tokens"]
    loads = np.array(list(per_replica.values()))
    return {"makespan_s": makespan, "output_tokens": int(tokens.sum()),
            "tail_share": (makespan - float(np.quantile(finish, 0.9))) / makespan if makespan > 0 else None,
            "imbalance": float(loads.max() / loads.mean() - 1) if len(loads) else None,
            "mean_jct_s": float(finish.mean())}


def batch_metrics(samples: list[dict]) -> dict:
    """The batch's figures; a partial side's two calls add their makespans and tokens."""
    calls = [_one_call([s for s in samples if s.get("call", 1) == c]) for c in sorted({s.get("call", 1) for s in samples})]
    first = calls[0]
    makespan = sum(c["makespan_s"] for c in calls)
    tokens = sum(c["output_tokens"] for c in calls)
    status = defaultdict(int)
    for s in samples:
        status[s.get("status", "failed" if s["error"] else "done")] += 1
    return {**first, "makespan_s": makespan, "output_tokens": tokens, "calls": [c["makespan_s"] for c in calls],
            "throughput_tok_s": tokens / makespan if makespan > 0 else None,
            "failed": sum(s["error"] is not None for s in samples), **{f"{k}_samples": v for k, v in status.items()}}
