"""The real half: the stack from ray_config.yaml on this machine, beside a bare vLLM server.

Three measurements, each on a trace every side replays identically, through the project's replay
actors (Ray actors, the official `openai` client, streaming):
- queueing: a burst over the replicas' slots, so requests wait in the router's queue; the work
  policy against Ray's default, repeated, with the spread;
- burst: held-out ShareGPT prompts (not in the dataset), a fixed number in flight, the way the
  issue was found: how many requests had to go without a prediction, and time to first token;
- bare vLLM: the burst against `python -m vllm.entrypoints.openai.api_server` with the engine
  settings of ray_config.yaml, for the throughput and TTFT ratios of everything the stack adds.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import ray
import yaml

from benchmarks.forelen.build import DEFAULT_OUT
from benchmarks.forelen.sources import DEFAULT_DATA_DIR
from benchmarks.replay.actors import account, replay
from benchmarks.replay.metrics import summarise
from benchmarks.replay.records import RequestRecord
from benchmarks.replay.stack import REPO, free_port
from benchmarks.replay.trace import TraceRequest, build_trace
from predictor.dataset import load_samples

BURST_PROMPTS = 60
BURST_INFLIGHT = 24
BURST_MAX_TOKENS = 1024


def queueing_trace(n: int, rate: float, max_tokens: int, seed: int = 0) -> list[TraceRequest]:
    """Test-split requests arriving faster than the replicas drain them (Poisson at `rate`)."""
    return build_trace(DEFAULT_OUT, "test", n=n, arrival="poisson", rate=rate, seed=seed, max_tokens=max_tokens)


def held_out_chat(tokenizer, n: int = BURST_PROMPTS, max_prompt_tokens: int = 3072, seed: int = 0) -> list[TraceRequest]:
    """ShareGPT first turns the dataset never used, as a client would send them (no true length known)."""
    used = {r["prompt_id"].split("/", 2)[-1] for r in load_samples(DEFAULT_OUT, scenario="chat")}
    with open(Path(DEFAULT_DATA_DIR) / "chat" / "sharegpt_firstturn.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    rng = random.Random(seed)
    rng.shuffle(rows)
    out = []
    for r in rows:
        if r["id"] in used or not r["prompt"].strip():
            continue
        messages = [{"role": "user", "content": r["prompt"]}]
        tokens = len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=False))
        if tokens > max_prompt_tokens:
            continue
        out.append(TraceRequest(request_id=f"b{len(out):04d}", arrival_s=0.0, prompt_id=f"chat/sharegpt/{r['id']}",
                                scenario="chat", messages=messages, max_tokens=BURST_MAX_TOKENS,
                                true_output_tokens=0, prompt_tokens=tokens))
        if len(out) == n:
            break
    return out


def closed_loop(base_url: str, trace: list[TraceRequest], actors: list, concurrency: int, label: str,
                policy: str | None = None, extra_headers: dict | None = None,
                timeout_s: float = 1800) -> list[RequestRecord]:
    """`concurrency` in flight in all, split over the actors; lost requests raise."""
    t0 = time.time() + 2.0
    per_actor = max(1, concurrency // len(actors))
    shards = [trace[i::len(actors)] for i in range(len(actors))]
    refs = [a.closed_loop.remote([r.model_dump() for r in shard], per_actor, t0, t0 + timeout_s, policy, label,
                                 extra_headers) for a, shard in zip(actors, shards) if shard]
    records = [RequestRecord.model_validate(r) for ref in refs for r in ray.get(ref)]
    if account(trace, records).lost:
        raise RuntimeError(f"lost requests: {account(trace, records)}")
    return records


def burst_summary(records: list[RequestRecord]) -> dict:
    """The burst's serving metrics plus how the router treated the predictions."""
    ok = [r for r in records if r.status == "ok"]
    waited = [r for r in ok if (r.queued_s or 0) > 0]
    unpredicted = [r for r in waited if r.predicted_tokens is None]
    ttft = sorted(r.ttft_s for r in ok)
    return {
        **{k: v for k, v in summarise(records, 8).items() if k not in ("pools",)},
        "p50_ttft_s": ttft[len(ttft) // 2] if ttft else None,
        "waited": len(waited), "waited_without_prediction": len(unpredicted),
        # A request that waited and left the queue unranked, or whose policy fell back.
        "fallback_rate": (len(unpredicted) + sum(r.fallback is not None for r in ok)) / len(ok) if ok else None,
        "predicted_share": sum(r.predicted_tokens is not None for r in ok) / len(ok) if ok else None,
    }


@contextlib.contextmanager
def bare_vllm(workdir: Path):
    """A bare vLLM OpenAI server with ray_config.yaml's engine settings, on a free port."""
    from router.serving.config import StackConfig
    from deployments.engine_pool import engine_env
    from predictor.model_files import resolve_model_source

    args = yaml.safe_load((REPO / "ray_config.yaml").read_text())["applications"][0]["args"]
    config = StackConfig.model_validate(args)
    model, kwargs = config.model, config.model.engine_kwargs
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", resolve_model_source(model.source),
           "--served-model-name", model.id, "--port", str(port), "--max-model-len", str(model.max_model_len),
           "--dtype", kwargs.get("dtype", "auto")]
    if kwargs.get("enforce_eager"):
        cmd.append("--enforce-eager")
    log = open(workdir / "bare_vllm.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **engine_env(model)},
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"bare vLLM exited early; see {workdir / 'bare_vllm.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            time.sleep(3)
        else:
            raise TimeoutError("bare vLLM did not answer within 600 s")
        yield url
    finally:
        os.killpg(proc.pid, 15)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def queueing_runs(base_url: str, actors: list, trace: list[TraceRequest], policies: list[str], repeats: int,
                  drain) -> dict:
    """{"repeats": [{policy: metrics}], "lost_requests": n}: policies interleaved within each repeat,
    so a slow spell of the machine hits every policy alike."""
    out, lost = [], 0
    for _ in range(repeats):
        by_policy = {}
        for policy in policies:
            drain(base_url)
            records = replay(base_url, trace, policy=policy, mode="open", timeout_s=1800, actors=actors)
            lost += account(trace, records).lost
            summary = summarise(records, 8)
            summary["queued_share"] = sum((r.queued_s or 0) > 0 for r in records) / len(records)
            by_policy[policy] = summary
        out.append(by_policy)
    return {"repeats": out, "lost_requests": lost}
