"""Replay traces: which prompt arrives when, with the length its answer really has.

Prompts come from a built ForeLen-style dataset's split (the test split for benchmarks), so every
request carries the output length the serving model produced for it (`true_output_tokens`, capped
at the trace's `max_tokens`). Arrival times come from a Poisson process, or from the real
inter-arrival gaps of the Azure LLM inference trace (2023, conversation) or the Mooncake
conversation trace, rescaled to the target mean rate: those traces carry no prompt text, only the
burstiness of real traffic. Everything is seeded: the same arguments give the same trace, which is
what lets several routing policies be compared on identical arrivals (and the simulator replay it).
"""

from __future__ import annotations

import csv
import json
import random
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel

from benchmarks.forelen.build import DEFAULT_OUT
from benchmarks.forelen.datasheet import leave_one_out_medians
from benchmarks.forelen.sources import DEFAULT_DATA_DIR
from predictor.dataset import load_meta, load_samples
from router.scheduling.budget import Mode

ARRIVALS = ("poisson", "azure", "mooncake")
AZURE_TRACE = "chat/azure_llm_trace_conv_2023.csv"
MOONCAKE_TRACE = "chat/mooncake_conversation_trace.jsonl"


class TraceRequest(BaseModel):
    """One request of a trace; `body()` is what an OpenAI client sends for it."""

    request_id: str
    arrival_s: float  # seconds after the trace starts
    prompt_id: str
    scenario: str
    kind: Literal["chat", "completions"] = "chat"
    messages: list[dict] | None = None  # kind "chat"
    prompt: str | None = None  # kind "completions"
    max_tokens: int
    temperature: float = 0.7
    min_tokens: int | None = None  # vLLM's min_tokens: an answer of a fixed length (the speed probe)
    ignore_eos: bool = False  # vLLM's: the answer runs to max_tokens (a fixed length, for the stock app)
    hint_tokens: int | None = None  # a client's output-length hint
    # An answer of exactly this many tokens that the router is not told (X-Fixed-Output-Tokens):
    # every policy then serves the same workload.
    fixed_tokens: int | None = None
    predictor_budget: Mode | None = None  # X-Predictor-Budget (None: the router's)
    true_output_tokens: int  # what the serving model produced for this prompt in the dataset
    prompt_tokens: int  # with the chat template, as the engine sees it
    # The median length of the prompt's *other* samples (capped like the true length), or None
    # with fewer than two others: what a perfect prompt-only predictor could know (the ceiling).
    ceiling_tokens: int | None = None

    def known_tokens(self, policy: str) -> int | None:
        """The length a known-length policy is told (X-True-Output-Tokens): the prompt's median
        for the ceiling, this sample's own for the oracles."""
        return self.ceiling_tokens if policy == "ceiling" else self.true_output_tokens

    def body(self, model: str) -> dict:
        fields = {"messages": self.messages} if self.kind == "chat" else {"prompt": self.prompt}
        extra = {"min_tokens": self.min_tokens} if self.min_tokens is not None else {}
        if self.ignore_eos:
            extra["ignore_eos"] = True
        if extra:  # vLLM's own parameters: the openai client sends them as extra body
            fields["extra_body"] = extra
        if self.hint_tokens is not None:  # OpenAI's metadata values are strings (router.api.protocol)
            fields["metadata"] = {"expected_output_tokens": str(self.hint_tokens)}
        return {"model": model, "max_tokens": self.max_tokens, "temperature": self.temperature, **fields}


def trace_gaps(name: str, data_dir: Path = DEFAULT_DATA_DIR) -> list[float]:
    """Inter-arrival gaps in seconds of a real trace, in its order."""
    if name == "azure":
        with open(Path(data_dir) / AZURE_TRACE, encoding="utf-8") as fh:
            times = [datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in csv.DictReader(fh)]
    elif name == "mooncake":
        with open(Path(data_dir) / MOONCAKE_TRACE, encoding="utf-8") as fh:
            times = [json.loads(line)["timestamp"] / 1000 for line in fh if line.strip()]
    else:
        raise ValueError(f"unknown trace {name!r}; expected azure or mooncake")
    times.sort()
    return [b - a for a, b in zip(times, times[1:])]


def arrival_times(n: int, arrival: str, rate: float, rng: random.Random, data_dir: Path = DEFAULT_DATA_DIR) -> list[float]:
    """n arrival times starting at 0 with mean rate `rate` requests/s.

    Real traces: a window of n - 1 consecutive gaps from a seeded start (wrapping around to the
    trace's beginning when n is longer than the trace), scaled so its mean gap is 1 / rate; the
    window keeps the trace's bursts and lulls, only faster or slower.
    """
    if n <= 0:
        return []
    if rate <= 0:
        raise ValueError("rate must be > 0 requests/s")
    if arrival == "poisson":
        gaps = [rng.expovariate(rate) for _ in range(n - 1)]
    elif arrival in ("azure", "mooncake"):
        real = trace_gaps(arrival, data_dir)
        start = rng.randrange(len(real))
        gaps = [real[(start + k) % len(real)] for k in range(n - 1)]
        mean = sum(gaps) / len(gaps) if gaps else 0.0
        # A window of simultaneous arrivals (Mooncake logs at 1 ms, often equal) has no time scale.
        gaps = [g / mean / rate for g in gaps] if mean > 0 else [1 / rate] * len(gaps)
    else:
        raise ValueError(f"unknown arrival process {arrival!r}; expected one of {ARRIVALS}")
    times, t = [0.0], 0.0
    for g in gaps:
        t += g
        times.append(t)
    return times


def build_trace(
    dataset_dir: Path = DEFAULT_OUT,
    split: str | tuple[str, ...] = "test",
    n: int = 50,
    arrival: str = "poisson",
    rate: float = 1.0,
    seed: int = 0,
    max_tokens: int | None = None,
    scenarios: list[str] | None = None,
    data_dir: Path = DEFAULT_DATA_DIR,
    max_true_tokens: int | None = None,
) -> list[TraceRequest]:
    """n requests drawn from the split (or splits; without replacement while they last), seeded.

    `max_tokens` caps every answer (default: the dataset's generation cap); `true_output_tokens`
    is the dataset's length under the same cap. Sampling at the dataset's temperature gives
    lengths from the same distribution, not the same numbers: the dataset has one draw per sample.
    `max_true_tokens` keeps only prompts whose dataset answer ended within it: a slow machine's
    small cap then still sees answers of natural, varied lengths instead of mostly cut ones.
    """
    settings = load_meta(dataset_dir)["settings"]
    cap = max_tokens or settings["max_tokens"]
    splits = (split,) if isinstance(split, str) else tuple(split)
    in_splits = [r for r in load_samples(dataset_dir) if r["split"] in splits]
    rows = [
        r for r in in_splits
        if (scenarios is None or r["scenario"] in scenarios)
        and (max_true_tokens is None or r["output_tokens"] <= max_true_tokens)
    ]
    if not rows:
        raise ValueError(f"no {split!r} samples in {dataset_dir} for scenarios {scenarios}")
    rows.sort(key=lambda r: (r["prompt_id"], r["sample_idx"]))  # file order depends on build timing
    lengths: dict[str, dict[int, int]] = {}
    for r in in_splits:
        lengths.setdefault(r["prompt_id"], {})[r["sample_idx"]] = min(r["output_tokens"], cap)
    rng = random.Random(seed)
    picked: list[dict] = []
    while len(picked) < n:
        batch = rows[:]
        rng.shuffle(batch)
        picked.extend(batch[: n - len(picked)])
    times = arrival_times(n, arrival, rate, rng, data_dir)
    return [
        TraceRequest(
            request_id=f"r{i:05d}", arrival_s=t, prompt_id=r["prompt_id"], scenario=r["scenario"], kind="chat",
            messages=[{"role": "user", "content": r["prompt"]}], max_tokens=cap,
            temperature=settings["temperature"], true_output_tokens=min(r["output_tokens"], cap),
            prompt_tokens=r["prompt_tokens"], ceiling_tokens=_median_of_others(lengths[r["prompt_id"]], r["sample_idx"]),
        )
        for i, (r, t) in enumerate(zip(picked, times))
    ]


def _median_of_others(samples: dict[int, int], own: int) -> int | None:
    """Leave-one-out: the sample being replayed must not inform its own ceiling."""
    order = sorted(samples)
    medians = leave_one_out_medians(np.array([samples[k] for k in order]))
    return None if medians is None else round(float(medians[order.index(own)]))


def write_trace(path: Path, trace: list[TraceRequest]) -> None:
    Path(path).write_text("".join(r.model_dump_json() + "\n" for r in trace), encoding="utf-8")


def read_trace(path: Path) -> list[TraceRequest]:
    with open(path, encoding="utf-8") as fh:
        return [TraceRequest.model_validate_json(line) for line in fh if line.strip()]


def held_out_chat(n: int, max_tokens: int = 1024, max_prompt_tokens: int = 3072, seed: int = 0) -> list[TraceRequest]:
    """ShareGPT first turns the dataset never used, as a client would send them (no true length known)."""
    from transformers import AutoTokenizer

    from predictor.model_files import resolve_model_source

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source("embedded"))
    used = {r["prompt_id"].split("/", 2)[-1] for r in load_samples(DEFAULT_OUT, scenario="chat")}
    with open(Path(DEFAULT_DATA_DIR) / "chat" / "sharegpt_firstturn.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    random.Random(seed).shuffle(rows)
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
                                scenario="chat", messages=messages, max_tokens=max_tokens,
                                true_output_tokens=0, prompt_tokens=tokens))
        if len(out) == n:
            break
    return out


def rl_prompts(prompts: int, max_tokens: int) -> list[dict]:
    """The first `prompts` RL test prompts (by id): each one's text, prompt tokens (in the chat
    template, as the engine sees them) and the lengths of its samples in the dataset, in order."""
    by_prompt: dict[str, list[dict]] = {}
    for r in load_samples(DEFAULT_OUT, split="test", scenario="rl"):
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    return [{"prompt": by_prompt[p][0]["prompt"], "prompt_tokens": by_prompt[p][0]["prompt_tokens"],
             "lengths": [min(r["output_tokens"], max_tokens) for r in sorted(by_prompt[p], key=lambda r: r["sample_idx"])]}
            for p in sorted(by_prompt)[:prompts]]
