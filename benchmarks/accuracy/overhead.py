"""Predictor cost against a plain prefill of the same prompts (the paper's Figure 5).

Both sides run the same micro-batches of the same token ids on the same model, interleaved
repeat by repeat so that load from other processes hits both alike; medians over repeats.
"Plain prefill" is what a serving engine computes before the first token: the forward pass with
logits for the last position only. A predictor is the real serving path, `LengthEstimator.predict`:
its own forward with the features its head reads (for ESTP full-vocabulary entropy and final-layer
attention; for a last-token head none beyond the hidden states), pooling and the head.

Peak memory is the process's peak resident size above its size before the call (Linux: the
high-water mark is reset through /proc/self/clear_refs). glibc would otherwise keep freed
buffers in its heap and hide a second call's peak, so large allocations are switched to mmap
(returned to the system on free) after the timings, for the rest of the process.
"""

from __future__ import annotations

import ctypes
import re
import statistics
import time
from typing import Callable

import torch

from predictor.estimator import LengthEstimator
from predictor.features import micro_batches, pad_left

_M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)


def plain_prefill(estimator: LengthEstimator, ids: list[list[int]]) -> None:
    """The serving engine's prefill of the same micro-batches the estimator forms."""
    for group in micro_batches([len(s) for s in ids], estimator.max_batch_tokens, estimator.max_batch_size):
        input_ids, mask = pad_left([ids[i] for i in group], estimator.pad_id)
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            estimator.model(input_ids=input_ids, attention_mask=mask.long(), position_ids=position_ids,
                            use_cache=False, logits_to_keep=1)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.M).group(1)) * 1024


def peak_memory_bytes(fn: Callable[[], object]) -> int:
    """Peak resident memory that `fn` adds on top of what the process holds before it."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = _status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current resident size
    fn()
    return max(0, _status_bytes("VmHWM") - before)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(predictors: dict[str, LengthEstimator], prompts: list[list[int]], batch_sizes=(1, 8),
            repeats: int = 5) -> dict:
    """Latency per request and peak memory of each predictor (heads on one model) vs a plain
    prefill, for each batch size (the first prompts of `prompts`); all sides interleaved in one
    timing loop, since the memory probe afterwards changes the allocator for good."""
    first = next(iter(predictors.values()))
    sides = {"prefill": lambda ids: plain_prefill(first, ids), **{n: e.predict for n, e in predictors.items()}}
    batches = {b: prompts[:b] for b in dict.fromkeys(batch_sizes) if b <= len(prompts)}
    for fn in sides.values():  # warm-up: first calls pay one-off allocations and kernel selection
        fn(prompts[:1])
    seconds = {(b, side): [] for b in batches for side in sides}
    for _ in range(repeats):
        for b, ids in batches.items():
            for side, fn in sides.items():
                seconds[(b, side)].append(_timed(lambda: fn(ids)))
    ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 1 << 16)
    out: dict = {"predictors": list(predictors)}
    for b, ids in batches.items():
        row = {"prompt_tokens": [len(s) for s in ids]}
        for side, fn in sides.items():
            row[f"{side}_ms_per_request"] = 1e3 * statistics.median(seconds[(b, side)]) / b
            row[f"{side}_peak_mib"] = peak_memory_bytes(lambda: fn(ids)) / 2 ** 20
        for name in predictors:
            row[f"{name}_latency_ratio"] = row[f"{name}_ms_per_request"] / row["prefill_ms_per_request"]
            row[f"{name}_memory_ratio"] = row[f"{name}_peak_mib"] / max(row["prefill_peak_mib"], 1e-9)
        out[f"batch_{b}"] = row
    for name in predictors:
        out[f"{name}_over_prefill"] = out[f"batch_{min(batches)}"][f"{name}_latency_ratio"]
    # The peaks above leave out the weights, the same for both sides: the scale to read them against.
    weights = sum(p.numel() * p.element_size() for p in first.model.parameters())
    out.update(repeats=repeats, threads=torch.get_num_threads(), model_weights_mib=weights / 2 ** 20)
    return out
