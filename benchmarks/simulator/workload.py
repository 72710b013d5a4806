"""Replay traces turned into simulator workloads, with what the router would know of each request.

The trace (benchmarks.replay.trace) gives arrivals, prompts and true lengths; the prediction
caches give the predictor's answer for each prompt, described (pool masses, capped expected
length, `bin`) exactly as the router describes it. Prompts longer than the predictor's
`max_prompt_tokens` get no prediction, as in the router, and the policy falls back. Known-length
policies are told the true length (the oracles) or the prompt's median over its other samples
(the ceiling). The oracle can be given noise (`noise` = sigma of a log-normal factor on each true
length) to stand for a predictor of any accuracy between perfect and useless.
"""

from __future__ import annotations

import numpy as np

from benchmarks.replay.trace import TraceRequest
from benchmarks.simulator.cluster import Workload
from predictor.head import LengthBins, LengthPrediction
from router.length_bins import PoolBins
from router.policies import DEFAULT_HEAD, KNOWN_LENGTH, Job, head_of


def head_for(policy: str) -> str:
    """The head a policy reads; length-blind ones run beside the default head, as the stack does."""
    return head_of(policy) or DEFAULT_HEAD


def oracle_tokens(trace: list[TraceRequest], noise: float = 0.0, seed: int = 0) -> list[int]:
    """What the oracle routes on: the true lengths, times a seeded log-normal factor of width `noise`."""
    true = [r.true_output_tokens for r in trace]
    if not noise:
        return true
    factor = np.exp(np.random.default_rng(seed).normal(0.0, noise, len(true)))
    return [max(1, round(t * float(f))) for t, f in zip(true, factor)]


def known_lengths(trace: list[TraceRequest], policy: str, noise: float = 0.0, seed: int = 0) -> list[int | None] | None:
    """What a known-length policy is told about each request (X-True-Output-Tokens), else None."""
    if policy not in KNOWN_LENGTH:
        return None
    if policy == "ceiling":
        return [r.ceiling_tokens for r in trace]
    return oracle_tokens(trace, noise, seed)


def build_workload(
    trace: list[TraceRequest], predictions: dict[str, LengthPrediction], head_bins: LengthBins, pools: PoolBins,
    max_prompt_tokens: int, known: list[int | None] | None = None,
) -> Workload:
    """`trace` sorted by arrival; `known` (known_lengths of the same order) for known-length policies."""
    jobs, described, distributions = [], {}, []  # resampled traces repeat prompts: describe each (prompt, cap) once
    for i, r in enumerate(trace):
        prediction, failure = None, None
        if r.prompt_tokens > max_prompt_tokens:
            failure = "prompt_too_long"
        elif r.prompt_id not in predictions:
            failure = "no_prediction"
        else:
            key = (r.prompt_id, r.max_tokens)
            if key not in described:
                described[key] = pools.describe(predictions[r.prompt_id], head_bins, r.max_tokens)
            prediction = described[key]
        true_tokens = None if known is None else known[i]
        jobs.append(Job(prompt_tokens=r.prompt_tokens, prediction=prediction, prediction_failure=failure,
                        true_tokens=true_tokens, max_tokens=r.max_tokens))
        if true_tokens is not None:
            distributions.append(int(true_tokens))
        else:
            distributions.append(None if prediction is None else (head_bins, predictions[r.prompt_id].probabilities))
    return Workload(
        arrival=np.array([r.arrival_s for r in trace], dtype=float),
        prompt_tokens=np.array([r.prompt_tokens for r in trace], dtype=np.int64),
        output_tokens=np.array([max(1, r.true_output_tokens) for r in trace], dtype=np.int64),
        max_tokens=np.array([r.max_tokens for r in trace], dtype=np.int64),
        jobs=jobs, distributions=distributions, prompt_ids=[r.prompt_id for r in trace],
    )
