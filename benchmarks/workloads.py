"""A scenario's workload as the trace each side replays: the same requests for every side.

The dataset's val and test prompts (the heads never trained on them) or ShareGPT first turns the
dataset never used, each with the length the model gave it in the dataset and the median of its
other samples (the ceiling: what a perfect prompt-only predictor could know). A burst sends them
in trace order, 2.5 s for 128; a load re-times them by an arrival process at a share of the
stack's capacity, which depends on the machine (they differ 2-3x between sessions): the first
session of a load scenario keeps the capacity it scaled to (runs/<scenario>/capacity.json) with its
probe, and later sessions stretch the same arrival pattern by their own probe against it, so a
load stays one trace.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.replay.probe import read_probe
from benchmarks.replay import runs
from benchmarks.replay.runs import RunRecord, read_run, run_path, runs_of
from benchmarks.replay.trace import TraceRequest, arrival_times, build_trace, held_out_chat
from benchmarks.scenarios import Side, Workload

# A burst's requests go out this far apart, in trace order. Sent all at once, the two replay
# actors' halves (even and odd positions) raced through the HTTP proxy (0.7 s to take in 128), and
# whichever half won took most of the first 32 slots: a coin flip per run, so the two sides of a
# pair often started different halves. On the fixed-length trace the halves average 383 and 567
# tokens, so the flip alone moved a side's mean JCT by about 10% (the overhead pair of round 4:
# stock's first 32 were 88% odd, ray_default's 12%). Spaced, every side starts the same requests
# in the same order.
BURST_SPACING_S = 0.02

# The fixed-length burst's Ray-default runs: their completions per second against their probed step
# is the stack's capacity on the dataset's mix, for a machine of any speed.
CAPACITY_FROM = "fixed_burst/ray_default"


def trace(workload: Workload, name: str, probe_step_s: Callable[[], float] | None = None) -> list[TraceRequest]:
    """The workload's requests, timed; a load needs the running stack probed (`probe_step_s`)."""
    if workload.trace == "sharegpt":
        requests = held_out_chat(n=workload.requests, max_tokens=workload.max_tokens)
    else:
        requests = build_trace(split=("val", "test"), n=workload.requests, arrival="poisson", rate=1.0,
                               seed=workload.seed, max_tokens=workload.max_tokens)
    if workload.lengths == "fixed":
        requests = [r.model_copy(update={"fixed_tokens": max(1, r.true_output_tokens)}) for r in requests]
    if workload.arrivals == "burst":
        return [r.model_copy(update={"arrival_s": i * BURST_SPACING_S}) for i, r in enumerate(requests)]
    if probe_step_s is None:
        raise ValueError(f"{name}: a load's arrivals need the running stack probed")
    step = probe_step_s()
    kept = kept_capacity(name, workload.requests, step)
    times = arrival_times(len(requests), workload.arrivals, workload.share * kept["capacity_rps"],
                          random.Random(workload.seed))
    stretch = step / kept["probe_step_s"]
    return [r.model_copy(update={"arrival_s": t * stretch}) for r, t in zip(requests, times)]


def for_side(requests: list[TraceRequest], side: Side, seed: int = 0) -> list[TraceRequest]:
    """The trace as `side` sends it: a seeded share of its requests carry the ceiling as a hint
    (the same requests in every repeat), each names the side's predictor budget; the stock app,
    which has no benchmark headers, gets a fixed length as `ignore_eos` with max_tokens at that length."""
    if side.app == "stock":
        return [r.model_copy(update={"max_tokens": r.fixed_tokens, "ignore_eos": True, "fixed_tokens": None})
                if r.fixed_tokens is not None else r for r in requests]
    if side.budget is not None:
        requests = [r.model_copy(update={"predictor_budget": side.budget}) for r in requests]
    if not side.hints:
        return requests
    hinted = set(random.Random(seed).sample(range(len(requests)), round(side.hints * len(requests))))
    return [r.model_copy(update={"hint_tokens": r.ceiling_tokens}) if i in hinted and r.ceiling_tokens else r
            for i, r in enumerate(requests)]


def capacity_rps(records: list[RunRecord]) -> float:
    """Requests/s the stack completes with every slot busy: completions over the middle 80% of a
    burst (the start fills the slots, the tail drains them)."""
    finishes = sorted(r.finish_s for r in records if r.status == "ok")
    lo, hi = len(finishes) // 10, 9 * len(finishes) // 10
    return (hi - lo) / (finishes[hi] - finishes[lo])


def burst_capacity_rps() -> float:
    """The fixed-length burst's capacity on the machines it ran on (median over its Ray-default runs)."""
    runs = runs_of(CAPACITY_FROM)
    if not runs:
        raise FileNotFoundError(f"no {CAPACITY_FROM} run yet: run `python -m benchmarks run fixed_burst` first")
    return float(np.median([capacity_rps(read_run(run)) for run in runs]))


def capacity_per_step() -> float:
    """Requests/s x probed step seconds over the fixed-length burst's Ray-default runs (median): the
    capacity of a machine whose probe steps in 1 s. On this workload a 2-3x slower machine's
    capacity follows its probe to within 15%."""
    values = [capacity_rps(read_run(run)) * probe.step_s for run in runs_of(CAPACITY_FROM)
              if (probe := read_probe(run_path(run)))]
    if not values:
        raise FileNotFoundError(f"no probed {CAPACITY_FROM} run yet: run `python -m benchmarks run fixed_burst` first")
    return float(np.median(values))


def kept_capacity(name: str, requests: int, step_s: float) -> dict:
    """The capacity a load scenario's arrivals were first scaled to, and the probe it was measured
    at: the scenario's first session sets it, and its trace never changes after."""
    path = capacity_path(name)
    if path.exists():
        kept = json.loads(path.read_text())
        if kept["requests"] != requests:
            raise ValueError(f"{name} ran with {kept['requests']} requests, not {requests}: its trace must not change")
        return kept
    kept = {"capacity_rps": capacity_per_step() / step_s, "probe_step_s": step_s, "requests": requests}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept) + "\n")
    return kept


def capacity_path(name: str) -> Path:
    return runs.RUNS / name / "capacity.json"
