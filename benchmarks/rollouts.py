"""Rollout sides: POST /v1/rollout with the scenario's RL batch, and a batch's figures from its samples.

The batch is the dataset's RL test prompts, each sampled n times, as an RL step asks. A side is a
schedule with where its lengths come from: the batch's order (`fifo`), or longest-first
(`makespan`) on the head's predictions, on each prompt's median over its dataset samples (the
ceiling), or on the prompt's own history. Each run's samples (text left out) are its per-request
records, which the report and the simulator's validation read.

A batch's figures (benchmarks.report reads them):
- makespan: the last sample's finish, from the batch's start (a training step waits for it);
- tail share: the part of the makespan after 90% of the samples had finished (the stragglers);
- throughput: tokens over the makespan; mean JCT: each sample's finish (all there at t = 0);
- imbalance: the busiest replica's tokens over the mean replica's, minus one (veRL #658's ~30%).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

import httpx
import numpy as np

from benchmarks.replay.runs import run_path
from benchmarks.replay.stack import RunningStack
from benchmarks.replay.trace import rl_prompts
from benchmarks.scenarios import Rollout, Scenario, Side


def rl_prompt_tokens(prompts: int) -> list[int]:
    return [p["prompt_tokens"] for p in rl_prompts(prompts, 1)]


def body(batch: Rollout, side: Side, model: str) -> dict:
    prompts = rl_prompts(batch.prompts, batch.max_tokens)
    known = None
    if side.lengths_from == "ceiling":
        known = [[round(statistics.median(p["lengths"]))] * batch.n for p in prompts]
    return {"model": model, "prompts": [p["prompt"] for p in prompts], "n": batch.n, "max_tokens": batch.max_tokens,
            "schedule": side.schedule, "known_tokens": known,
            "head": "estp" if side.lengths_from == "head" else None}


def execute(name: str, stack: RunningStack, scenario: Scenario, side: Side, timeout_s: float = 3600) -> list[dict]:
    """One rollout of the scenario's batch; its samples written as the run's records."""
    r = httpx.post(f"{stack.base_url}/v1/rollout", json=body(scenario.workload, side, stack.model),
                   headers=stack.client_headers, timeout=timeout_s)
    r.raise_for_status()
    samples = [{k: v for k, v in s.items() if k != "text"} for s in r.json()["samples"]]
    path = run_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return samples


def batch_metrics(samples: list[dict]) -> dict:
    ok = [s for s in samples if s["error"] is None]
    finish = np.array([s["finished_s"] for s in ok], float)
    tokens = np.array([s["completion_tokens"] for s in ok], float)
    makespan = float(finish.max())
    per_replica = defaultdict(float)
    for s in ok:
        per_replica[s["replica"]] += s["completion_tokens"]
    loads = np.array(list(per_replica.values()))
    return {"samples": len(ok), "failed": len(samples) - len(ok), "makespan_s": makespan,
            "tail_share": (makespan - float(np.quantile(finish, 0.9))) / makespan if makespan > 0 else None,
            "throughput_tok_s": float(tokens.sum()) / makespan if makespan > 0 else None,
            "imbalance": float(loads.max() / loads.mean() - 1) if len(loads) else None,
            "mean_jct_s": float(finish.mean())}
