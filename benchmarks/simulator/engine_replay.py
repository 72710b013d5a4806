"""A small real measurement to validate the simulator on: one vLLM engine replaying a trace.

The engine is the calibration's (the stack's settings, one engine, no Ray), fed in real time:
each request is added at its trace arrival (at the next step boundary, as a serving engine picks
it up), with the priority the router would give it (ESTP's predicted tokens), sampled at the
trace's temperature. Per request it records arrival, first token, finish and the tokens really
generated, so the simulator can replay exactly these requests and be compared one for one.

    python -m benchmarks.simulator measure     # about 3 minutes on 2 CPU cores
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks.replay.trace import build_trace
from benchmarks.simulator.calibrate import REPO, _engine
from benchmarks.simulator.setup import load_setup

MEASURED = REPO / "benchmarks" / "results" / "simulator_engine_replay.json"


def measure(n: int = 40, rate: float = 0.4, max_tokens: int = 384, seed: int = 0, out: Path = MEASURED) -> dict:
    engine, settings = _engine()  # first: it sets the engine's environment (threads) before torch starts
    from tqdm import tqdm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from transformers import AutoTokenizer

    from benchmarks.simulator.predictions import router_ids
    from predictor.model_files import resolve_model_source

    setup = load_setup()
    trace = build_trace(split="test", n=n, arrival="poisson", rate=rate, seed=seed, max_tokens=max_tokens)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(setup.config.model.source))
    predictions, bins = setup.predictions["estp"], setup.head_bins["estp"]
    rows = {}
    try:
        bar = tqdm(total=n, desc="engine replay", unit="req")
        start, nxt = time.perf_counter(), 0
        while nxt < n or any("finish_s" not in r for r in rows.values()):
            now = time.perf_counter() - start
            while nxt < n and trace[nxt].arrival_s <= now:
                req = trace[nxt]
                nxt += 1
                prediction = setup.pool_bins.describe(predictions[req.prompt_id], bins, req.max_tokens)
                priority = round(min(prediction["expected_tokens"], req.max_tokens))
                ids = router_ids(tokenizer, setup.config.model.id, req.messages[0]["content"])
                engine.add_request(req.request_id, TokensPrompt(prompt_token_ids=ids),
                                   SamplingParams(temperature=req.temperature, max_tokens=req.max_tokens),
                                   priority=priority)
                rows[req.request_id] = {"request_id": req.request_id, "arrival_s": req.arrival_s,
                                        "added_s": now, "prompt_tokens": len(ids), "priority": priority,
                                        "true_output_tokens": req.true_output_tokens}
            if all("finish_s" in r for r in rows.values()):
                time.sleep(max(0.0, min(0.05, trace[nxt].arrival_s - now)))
                continue
            outputs = engine.step()
            t = time.perf_counter() - start
            for o in outputs:
                row = rows[o.request_id]
                if "first_token_s" not in row and o.outputs and o.outputs[0].token_ids:
                    row["first_token_s"] = t
                if o.finished:
                    row["finish_s"] = t
                    row["completion_tokens"] = len(o.outputs[0].token_ids)
                    bar.update(1)
        bar.close()
    finally:
        engine.engine_core.shutdown()
    result = {"settings": settings, "trace": {"n": n, "rate_rps": rate, "max_tokens": max_tokens, "seed": seed,
                                              "split": "test", "arrival": "poisson"},
              "requests": sorted(rows.values(), key=lambda r: r["arrival_s"])}
    out.write_text(json.dumps(result, indent=1) + "\n")
    return {"requests": n, "span_s": max(r["finish_s"] for r in rows.values())}
