"""Measure a real vLLM engine's step times and fit the step-time model to them.

The engine is built with the stack's own settings (ray_config.yaml: dtype, enforce_eager,
max_model_len, priority scheduling, and the per-engine environment the pools get: one OpenMP
thread, 1 GiB of KV cache on CPU), so the simulator's replicas are timed like the replay's.
Each run feeds B random-token prompts of L tokens through the engine loop with ignore_eos and a
fixed output length, adding a prompt only while its prefill fits the step's token budget, so
every step's composition (prefill tokens, decoding sequences, KV tokens) is known exactly.
Steps mix prefills with decodes as they do in serving. On a GPU the same command measures the
GPU: the fit, not the code, is machine specific.

    python -m benchmarks.simulator calibrate     # about 5 minutes on 2 CPU cores
"""

from __future__ import annotations

import json
import os
import platform
import random
import time
from pathlib import Path

import yaml

from benchmarks.simulator.step_time import fit

REPO = Path(__file__).resolve().parents[2]
CALIBRATION = REPO / "benchmarks" / "results" / "step_time_calibration.json"
PROMPT_LENGTHS = (16, 128, 512, 1024)
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
OUTPUT_TOKENS = 48
MAX_PREFILL_PER_RUN = 8192  # prompt tokens per run: prefill on one CPU thread is the slow part


def stack_model(config_path: Path = REPO / "ray_config.yaml"):
    from router.serving.config import StackConfig

    app = yaml.safe_load(config_path.read_text())["applications"][0]
    return StackConfig.model_validate(app["args"]), app.get("runtime_env", {}).get("env_vars", {})


def _engine():
    from deployments.engine_pool import engine_env
    from predictor.model_files import resolve_model_source

    config, app_env = stack_model()
    for key, value in app_env.items():
        os.environ.setdefault(key, str(value))
    env = engine_env(config.model)
    os.environ.update(env)
    # The engine core in this process: engine.step() is then exactly one scheduler step, so each
    # timing belongs to the composition recorded for it (IPC to a core process is not timed).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    import vllm

    if "OMP_NUM_THREADS" in env:  # torch may have started before the variable was set
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))

    kwargs = {"max_model_len": config.model.max_model_len, **config.model.engine_kwargs}
    if config.router.shortest_first:
        kwargs["scheduling_policy"] = "priority"
    llm = vllm.LLM(model=resolve_model_source(config.model.source), seed=0, **kwargs)
    settings = {"engine_kwargs": kwargs, "engine_env": env, "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "vllm_version": vllm.__version__}
    return llm.llm_engine, settings


def _scheduler_limits(engine) -> dict:
    sched = engine.vllm_config.scheduler_config
    cache = engine.vllm_config.cache_config
    blocks = getattr(cache, "num_gpu_blocks", None) or 0
    return {"max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens,
            "kv_cache_tokens": blocks * cache.block_size, "block_size": cache.block_size}


def _run(engine, batch: int, prompt_len: int, budget: int, rng: random.Random, tag: str) -> list[dict]:
    """One workload of `batch` prompts; a row per engine step with its composition and wall time."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    waiting = [[rng.randrange(100, 49_000) for _ in range(prompt_len)] for _ in range(batch)]
    produced: dict[str, int] = {}  # request -> tokens generated so far; absent: not yet prefilled
    pending: dict[str, int] = {}  # added this step, prefill not yet done
    rows = []
    while waiting or produced or pending:
        decoding = len(produced)
        while waiting and decoding + sum(pending.values()) + prompt_len <= budget:
            rid = f"{tag}-{len(waiting)}"
            engine.add_request(rid, TokensPrompt(prompt_token_ids=waiting.pop()), params)
            pending[rid] = prompt_len
        kv = sum(prompt_len + n for n in produced.values()) + sum(pending.values())
        prefill = sum(pending.values())
        start = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - start
        rows.append({"batch": batch, "prompt_len": prompt_len, "decode_seqs": decoding,
                     "prefill_tokens": prefill, "kv_tokens": kv, "seconds": seconds})
        for out in outputs:
            rid = out.request_id
            if rid in pending:
                del pending[rid]
            produced[rid] = len(out.outputs[0].token_ids)
            if out.finished:
                del produced[rid]
    return rows


def calibrate(out: Path = CALIBRATION) -> dict:
    from tqdm import tqdm

    engine, settings = _engine()
    limits = _scheduler_limits(engine)
    rng = random.Random(0)
    try:
        _run(engine, 4, 64, limits["max_num_batched_tokens"], rng, "warmup")
        rows = []
        grid = [(b, l) for l in PROMPT_LENGTHS for b in BATCH_SIZES
                if b * (l + OUTPUT_TOKENS) <= 0.8 * limits["kv_cache_tokens"] and b * l <= MAX_PREFILL_PER_RUN]
        for b, l in tqdm(grid, desc="calibrate", unit="run"):
            rows += _run(engine, b, l, limits["max_num_batched_tokens"], rng, f"b{b}l{l}")
    finally:
        engine.engine_core.shutdown()
    model, errors = fit(rows)
    result = {"model": model.model_dump(), "fit": errors, "limits": limits, "settings": settings,
              "output_tokens_per_run": OUTPUT_TOKENS, "measurements": rows}
    out.write_text(json.dumps(result, indent=1) + "\n")
    return {"model": result["model"], "fit": errors, "limits": limits}
