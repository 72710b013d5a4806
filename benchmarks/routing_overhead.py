"""What length-aware routing costs: the predictor against a plain prefill, and the routing hop
against end-to-end latency.

    python -m benchmarks.routing_overhead                 # starts the stack from ray_config.yaml
    python -m benchmarks.routing_overhead --url http://127.0.0.1:8000

1. Offline, one thread: `LengthEstimator.predict` (prefill + entropy + attention + head) against
   the serving model's plain prefill (logits of the last token only, as an engine computes them)
   on the same token ids: the predictor's price relative to work the engine does anyway.
2. Live, sequential streaming requests: the router's `X-Routing-Ms` (tokenize + predictor hop +
   pool choice) as a share of the time to first token and of the end-to-end latency.

Writes benchmarks/results/routing_overhead.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.forelen.build import DEFAULT_OUT
from predictor.dataset import load_samples
from router.serving.config import DEFAULT_CHECKPOINTS
from predictor.model_files import DEFAULT_MODEL_DIR

RESULTS = Path(__file__).resolve().parent / "results"


def _prompts(n: int, max_prompt_tokens: int) -> list[str]:
    """Distinct test-split prompts, spread over the prompt lengths up to `max_prompt_tokens`."""
    unique = {r["prompt_id"]: r for r in load_samples(DEFAULT_OUT, split="test") if r["prompt_tokens"] <= max_prompt_tokens}
    rows = sorted(unique.values(), key=lambda r: r["prompt_tokens"])
    step = max(1, len(rows) // n)
    return [r["prompt"] for r in rows[::step][:n]]


def _median_ms(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def offline(prompts: list[str], reps: int) -> dict:
    import torch

    from predictor.estimator import LengthEstimator

    torch.set_num_threads(1)
    est = LengthEstimator.load(DEFAULT_MODEL_DIR, DEFAULT_CHECKPOINTS / "estp" / "head")
    rows = []
    with torch.no_grad():
        for prompt in prompts:
            ids = est.encode(prompt)
            x = torch.tensor([ids])
            prefill = _median_ms(lambda: est.model(input_ids=x, logits_to_keep=1), reps)
            predict = _median_ms(lambda: est.predict([ids]), reps)
            rows.append({"prompt_tokens": len(ids), "prefill_ms": prefill, "predictor_ms": predict,
                         "ratio": predict / prefill})
    return {"rows": rows, "median_ratio": statistics.median(r["ratio"] for r in rows)}


def live(url: str, model: str, prompts: list[str], max_tokens: int) -> dict:
    rows = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for prompt in prompts:
            body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "stream": True}
            start = time.perf_counter()
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                first = None
                for line in r.iter_lines():
                    if first is None and line.startswith("data: "):
                        first = time.perf_counter()
                routing = float(r.headers["x-routing-ms"])
                policy = r.headers["x-routing-policy"]
            total = (time.perf_counter() - start) * 1000
            ttft = (first - start) * 1000
            rows.append({"routing_ms": routing, "ttft_ms": ttft, "e2e_ms": total, "policy": policy,
                         "share_of_ttft": routing / ttft, "share_of_e2e": routing / total})
    return {
        "rows": rows, "max_tokens": max_tokens,
        "median_routing_ms": statistics.median(r["routing_ms"] for r in rows),
        "median_share_of_ttft": statistics.median(r["share_of_ttft"] for r in rows),
        "median_share_of_e2e": statistics.median(r["share_of_e2e"] for r in rows),
        "fallbacks": sum(r["policy"] != "estp" for r in rows),
    }


def _markdown(result: dict) -> str:
    off, on = result["offline"], result.get("live")
    lines = [
        "# Routing overhead", "",
        f"Machine: {result['machine']}. Prompts: {len(off['rows'])} distinct test-split prompts.", "",
        "## Predictor vs a plain prefill (offline, 1 thread)", "",
        "| prompt tokens | plain prefill ms | predictor ms | ratio |", "|---:|---:|---:|---:|",
        *(f"| {r['prompt_tokens']} | {r['prefill_ms']:.0f} | {r['predictor_ms']:.0f} | {r['ratio']:.2f} |"
          for r in off["rows"]),
        "", f"Median ratio predictor / plain prefill: **{off['median_ratio']:.2f}**", "",
    ]
    if on is None:
        return "\n".join(lines)
    lines += [
        f"## Routing hop vs end-to-end latency (live stack, sequential streams, max_tokens {on['max_tokens']})", "",
        "| routing ms | TTFT ms | end-to-end ms | share of TTFT | share of e2e |", "|---:|---:|---:|---:|---:|",
        *(f"| {r['routing_ms']:.0f} | {r['ttft_ms']:.0f} | {r['e2e_ms']:.0f} | {r['share_of_ttft']:.0%} | "
          f"{r['share_of_e2e']:.0%} |" for r in on["rows"]),
        "", f"Median routing hop {on['median_routing_ms']:.0f} ms: **{on['median_share_of_ttft']:.0%}** of TTFT, "
        f"**{on['median_share_of_e2e']:.0%}** of end-to-end latency; {on['fallbacks']} fallbacks.", "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running stack; default: start one from ray_config.yaml")
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer prompts are left out (CPU time)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--machine", default=f"{os.cpu_count()} CPU cores, shared")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    prompts = _prompts(args.prompts, args.max_prompt_tokens)
    result = {"machine": args.machine, "offline": offline(prompts, args.reps)}
    _write(result)  # the offline half survives a stack that fails to start
    if args.url:
        result["live"] = live(args.url, args.model, prompts, args.max_tokens)
    else:
        from tests.stack import RunningStack

        stack = RunningStack(Path(tempfile.mkdtemp(prefix="routing_overhead_"))).start()
        try:
            result["live"] = live(stack.base_url, stack.model, prompts, args.max_tokens)
        finally:
            stack.stop()
    _write(result)
    print(_markdown(result))
    return result


def _write(result: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "routing_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "routing_overhead.md").write_text(_markdown(result))


if __name__ == "__main__":
    main()
