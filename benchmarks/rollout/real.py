"""Rollouts through the real stack: POST /v1/rollout on ray_config.yaml's application, repeated.

The batch is the test split's RL prompts, each sampled n times, as an RL step asks. Policies are
the rollout's schedules with where their lengths come from: `ray_default` (fifo: the batch's order,
Ray's replica choice), `estp` (makespan on the ESTP head's predictions), `ceiling` (makespan on
each prompt's median length over the dataset's samples), `oracle` (makespan on the dataset's own
sample lengths: on the real stack every generation is a fresh draw, so this "oracle" knows one
earlier draw per sample, not the length about to be generated).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import httpx
import numpy as np

from benchmarks.forelen.build import DEFAULT_OUT
from benchmarks.rollout.metrics import batch_metrics
from predictor.dataset import load_samples


def _rl_prompts(prompts: int) -> tuple[list[str], dict[str, list[dict]]]:
    """The first `prompts` RL test prompts (by id) and their samples."""
    by_prompt: dict[str, list[dict]] = defaultdict(list)
    for r in load_samples(DEFAULT_OUT, split="test", scenario="rl"):
        by_prompt[r["prompt_id"]].append(r)
    return sorted(by_prompt)[:prompts], by_prompt


def rl_prompt_tokens(prompts: int) -> list[int]:
    """The batch's prompts as the engine sees them (a user message in the chat template), in tokens."""
    chosen, by_prompt = _rl_prompts(prompts)
    return [by_prompt[p][0]["prompt_tokens"] for p in chosen]


def rl_batch(prompts: int, n: int, max_tokens: int) -> tuple[list[str], dict[str, list[list[int]]]]:
    """The first `prompts` RL test prompts (by id), and per policy the lengths it is told."""
    chosen, by_prompt = _rl_prompts(prompts)
    texts = [by_prompt[p][0]["prompt"] for p in chosen]
    lengths = [[min(r["output_tokens"], max_tokens) for r in sorted(by_prompt[p], key=lambda r: r["sample_idx"])]
               for p in chosen]
    oracle = [(ls * n)[:n] for ls in lengths]
    ceiling = [[round(statistics.median(ls))] * n for ls in lengths]
    return texts, {"oracle": oracle, "ceiling": ceiling}


SCHEDULES = {"ray_default": "fifo", "estp": "makespan", "last": "makespan", "ceiling": "makespan",
            "oracle": "makespan"}
HEAD = {"estp": "estp", "last": "last"}  # the predictor head a policy's predictions come from


def run_once(base_url: str, model: str, texts: list[str], known: dict, policy: str, n: int, max_tokens: int,
             headers: dict, timeout_s: float = 3600) -> tuple[dict, list[dict]]:
    """The batch's figures, and its samples (the per-request records, text left out)."""
    body = {"model": model, "prompts": texts, "n": n, "max_tokens": max_tokens, "schedule": SCHEDULES[policy],
            "known_tokens": known.get(policy), "head": HEAD.get(policy)}
    r = httpx.post(f"{base_url}/v1/rollout", json=body, headers=headers, timeout=timeout_s)
    r.raise_for_status()
    samples = [{k: v for k, v in s.items() if k != "text"} for s in r.json()["samples"]]
    ok = [s for s in samples if s["error"] is None]
    metrics = batch_metrics([s["finished_s"] for s in ok], [s["completion_tokens"] for s in ok],
                            [s["replica"] for s in ok])
    # From taking a slot to the first token: prefill, plus any wait for the replica the schedule
    # pinned it to (a schedule that leaves slots idle shows here).
    waits = [s["first_token_s"] - s["dispatched_s"] for s in ok if s["first_token_s"] is not None]
    return {**metrics, "mean_slot_to_first_token_s": statistics.fmean(waits) if waits else None,
            "concurrency": concurrency(ok), "requested": len(texts) * n, "returned": len(samples),
            "failed": len(samples) - len(ok), "lost": len(texts) * n - len(samples)}, samples


def concurrency(samples: list[dict], step_s: float = 1.0) -> dict:
    """Requests in flight on each replica, sampled every `step_s` from the rollout's start."""
    end = max(s["finished_s"] for s in samples)
    ticks = np.arange(0.0, end + step_s, step_s)
    replicas = sorted({s["replica"] for s in samples if s["replica"]})
    names = {r: f"replica {i + 1}" for i, r in enumerate(replicas)}
    by_replica = {names[r]: [int(sum(s["replica"] == r and s["dispatched_s"] <= t < s["finished_s"] for s in samples))
                             for t in ticks] for r in replicas}
    return {"step_s": step_s, "by_replica": by_replica}


HEADLINE = ("padding_ratio", "makespan_s", "tail_share", "throughput_tok_s", "imbalance", "mean_jct_s",
            "mean_slot_to_first_token_s")


def headline(real_part: dict) -> dict:
    """The real runs' top-level figures: per policy the mean over repeats, the repeats, lost."""
    repeats = real_part["repeats"]

    def mean(p, k):
        values = [rep[p][k] for rep in repeats if rep[p].get(k) is not None]
        return statistics.fmean(values) if values else None

    return {"policies": {p: {k: mean(p, k) for k in HEADLINE} for p in repeats[0]},
            "lost_requests": real_part["lost_requests"], "repeats": repeats}
