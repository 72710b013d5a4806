"""A cold start on the real stack: no head at all, held-out ShareGPT traffic, the head learned live.

The stack starts with `predictor.checkpoint: online` and an empty state directory, and a trace of
held-out ShareGPT prompts (the dataset never used them) arrives at a calm share of its capacity.
While it runs, /health is polled for the learner's head version and whether the router trusts
the learned head; afterwards the router's request log gives, per 100 finished requests, the live
MAE and rank concordance of the predictions made for them (shadow predictions while untrusted).
The same trace then runs on the stack with learning off (the offline head, no learner), for what
learning costs in throughput and time to first token. Memory: the router's and the predictor's
RSS from after the warm-up to the end.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.replay.trace import TraceRequest

MAX_TOKENS = 512  # answers cut here are censored labels, which the learner takes as such
LAST_HEAD = {"router": {"policy": "last_work"}}  # the learner learns final-layer heads: both sides read one
BLOCK = 100


def _poll(base_url: str, stop: threading.Event, out: list[dict], every_s: float = 10.0) -> None:
    from benchmarks.reliability.overload import rss

    while not stop.is_set():
        try:
            h = httpx.get(f"{base_url}/health", timeout=10).json()
            quality = next(iter(h["live_quality"].values()), {})
            out.append({"t": time.time(), "learner": h.get("learner"), "trusted": quality.get("trusted"),
                        "scored": quality.get("scored"), "concordance": quality.get("concordance"), "rss": rss()})
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        stop.wait(every_s)


def rss_growth(polls: list[dict], warmup_s: float = 120.0) -> dict[str, float | None]:
    """Each process's RSS at the end over its RSS once warm (`warmup_s` into the run), minus one."""
    if not polls:
        return {}
    warm = next((p for p in polls if p["t"] >= polls[0]["t"] + warmup_s), polls[0])["rss"]
    end = polls[-1]["rss"]
    return {k: (end[k] / warm[k] - 1) if warm.get(k) and end.get(k) else None for k in end}


def _concordance(predicted: list[float], actual: list[int]) -> float | None:
    credit = pairs = 0.0
    for i in range(len(actual)):
        for j in range(i + 1, len(actual)):
            if actual[i] == actual[j]:
                continue
            pairs += 1
            if predicted[i] == predicted[j]:
                credit += 0.5
            elif (predicted[i] < predicted[j]) == (actual[i] < actual[j]):
                credit += 1
    return credit / pairs if pairs else None


def live_blocks(log: list[dict]) -> list[dict]:
    """Per BLOCK finished requests (in finishing order): how many had a prediction, its MAE and
    concordance on those whose length is exact (censored ones are left out of both)."""
    done = sorted((e for e in log if e["finished_at"] is not None), key=lambda e: e["finished_at"])
    out = []
    for start in range(0, len(done), BLOCK):
        block = done[start:start + BLOCK]
        scored = [e for e in block if e["prediction"] is not None and e["completion_tokens"] is not None
                  and e["finish_reason"] == "stop"]
        predicted = [e["prediction"]["expected_tokens"] for e in scored]
        actual = [e["completion_tokens"] for e in scored]
        out.append({"requests": start + len(block), "predicted": len([e for e in block if e["prediction"]]),
                    "mae": float(np.mean(np.abs(np.array(predicted) - actual))) if scored else None,
                    "concordance": _concordance(predicted, actual)})
    return out


def trusted_after(polls: list[dict], log: list[dict]) -> int | None:
    """Requests finished when the router first trusted the learned head (None: never)."""
    first = next((p["t"] for p in polls if p["trusted"]), None)
    if first is None:
        return None
    return sum(e["finished_at"] is not None and e["finished_at"] <= first for e in log)


def run_stack(run: str, trace: list[TraceRequest], overrides: dict, actors_n: int = 2) -> dict:
    """Replay `trace` on a stack with `overrides`: the run's per-request records (also written to
    benchmarks/results/runs/<run>.jsonl, ids prefixed with the run), the router's log, the polls, RSS."""
    import ray

    from benchmarks.replay.actors import connect, spawn_actors
    from benchmarks.replay.metrics import summarise
    from benchmarks.replay.runs import execute
    from benchmarks.replay.stack import RunningStack

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "requests.jsonl"
        merged = {**overrides, "router": {**overrides.get("router", {}), "request_log": str(log)}}
        with RunningStack(Path(tmp), merged) as stack:
            os.environ["RAY_ADDRESS"] = "auto"
            connect()
            actors = spawn_actors(stack.base_url, actors_n, 7200)
            polls, stop = [], threading.Event()
            poller = threading.Thread(target=_poll, args=(stack.base_url, stop, polls), daemon=True)
            poller.start()
            records = execute(run, stack.base_url, actors, trace, None, log, timeout_s=7200)
            stop.set()
            poller.join()
            ray.shutdown()
            entries = [json.loads(line) for line in log.read_text().splitlines()]
    records = [r.model_copy(update={"request_id": r.request_id.removeprefix(f"{run}:")}) for r in records]
    return {"records": records, "failed": summarise(records, 8)["failed"], "polls": polls, "log": entries,
            "rss_growth": rss_growth(polls)}


def serving_figures(records: list, ids: set[str]) -> dict:
    """Throughput, p50 TTFT, mean JCT and p50 time per output token over the requests in `ids`.

    At a calm load throughput follows the arrivals and the sampled lengths (temperature 0.7: the
    two runs generate different tokens for the same prompts); the time per output token is what
    learning's CPU would slow, whatever the lengths."""
    from benchmarks.replay.metrics import summarise

    chosen = [r for r in records if r.request_id in ids]
    summary = summarise(chosen, 8)
    ok = [r for r in chosen if r.status == "ok"]
    ttft = [r.ttft_s for r in ok]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    return {"requests": len(chosen), "throughput_tok_s": summary["throughput_tok_s"],
            "completion_tokens": sum(r.completion_tokens or 0 for r in ok),
            "p50_ttft_s": float(np.percentile(ttft, 50)) if ttft else None, "mean_jct_s": summary["mean_jct_s"],
            "p50_tpot_s": float(np.percentile(tpot, 50)) if tpot else None}


def cold_start(n: int, rate: float, share: float, compare: int | None = None, seed: int = 0) -> dict:
    """The learning stack from nothing, then the trace's first `compare` requests (default: all)
    with learning off, compared on those same requests; online.json's "real"."""
    import random

    from benchmarks.replay import trace as traces

    prompts = traces.held_out_chat(n=n, seed=seed)
    times = traces.arrival_times(n, "poisson", rate, random.Random(seed))
    trace = [r.model_copy(update={"arrival_s": t, "max_tokens": MAX_TOKENS}) for r, t in zip(prompts, times)]
    with tempfile.TemporaryDirectory() as state:
        on = run_stack("online_cold_start/learning_on/r0", trace, {**LAST_HEAD, "predictor": {
            "checkpoint": "online", "online": {"state_dir": state, "dispatched_share": share, "min_new_labels": 50,
                                               "min_interval_s": 60}}})
    compared = trace[:compare or n]
    off = run_stack("online_cold_start/learning_off/r0", compared, LAST_HEAD)
    ids = {r.request_id for r in compared}
    on_side, off_side = serving_figures(on["records"], ids), serving_figures(off["records"], ids)
    versions = [(p["t"], (p["learner"] or {}).get("version")) for p in on["polls"]]
    ratio = lambda a, b: None if not a or not b else a / b  # noqa: E731
    return {
        "requests": n, "rate_rps": rate, "max_tokens": MAX_TOKENS, "dispatched_share": share,
        "compared_requests": len(compared),
        "trusted_after_requests": trusted_after(on["polls"], on["log"]),
        "first_head_after_s": next((t - versions[0][0] for t, v in versions if v), None) if versions else None,
        "throughput_ratio_vs_off": ratio(on_side["throughput_tok_s"], off_side["throughput_tok_s"]),
        "p50_ttft_ratio_vs_off": ratio(on_side["p50_ttft_s"], off_side["p50_ttft_s"]),
        "p50_tpot_ratio_vs_off": ratio(on_side["p50_tpot_s"], off_side["p50_tpot_s"]),
        "failed": on["failed"] + off["failed"], "failed_on": on["failed"], "failed_off": off["failed"],
        "rss_growth": on["rss_growth"], "live": live_blocks(on["log"]),
        "on": on_side, "off": off_side,
        "learner_final": next((p["learner"] for p in reversed(on["polls"]) if p["learner"]), None),
    }
