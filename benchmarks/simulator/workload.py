"""Replay traces turned into simulator workloads: one request record each, as the router would know it.

The trace (benchmarks.replay.trace) gives arrivals, prompts and true lengths; the prediction
caches give the predictor's answer for each prompt, described for the pools exactly as the
router describes it (router.scheduling.pools). Prompts longer than the predictor's `max_prompt_tokens`
get no prediction, as in the router, and the policy falls back. Known-length policies are told
the true length (the oracles) or the prompt's median over its other samples (the ceiling). The
oracle can be given noise (`noise` = sigma of a log-normal factor on each true length) to stand
for a predictor of any accuracy between perfect and useless.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.replay.trace import TraceRequest
from predictor.head import LengthBins, LengthPrediction
from router.scheduling.policies import DEFAULT_HEAD, POLICIES, head_of
from router.scheduling.pools import Pools
from router.scheduling.request import Request


@dataclass
class Workload:
    """Requests sorted by arrival, as records (what the scheduler reads) and their true lengths
    (what the engines generate, which no decision may read)."""

    requests: list[Request]
    output_tokens: np.ndarray  # true lengths, >= 1

    def __len__(self) -> int:
        return len(self.requests)


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
    if not POLICIES[policy].told_length:
        return None
    if policy == "ceiling":
        return [r.ceiling_tokens for r in trace]
    return oracle_tokens(trace, noise, seed)


def build_workload(
    trace: list[TraceRequest], policy: str, predictions: dict[str, LengthPrediction], head_bins: LengthBins,
    pools: Pools, max_prompt_tokens: int, known: list[int | None] | None = None,
) -> Workload:
    """`trace` sorted by arrival; `known` (known_lengths of the same order) for known-length policies.
    Every request carries its prediction from the start: the simulator's predictor is never late."""
    head = head_for(policy)
    described: dict[tuple, object] = {}  # resampled traces repeat prompts: describe each (prompt, cap) once
    requests = []
    for i, r in enumerate(trace):
        prediction, failure = None, None
        if r.prompt_tokens > max_prompt_tokens:
            failure = "prompt_too_long"
        elif r.prompt_id not in predictions:
            failure = "no_prediction"
        else:
            key = (r.prompt_id, r.max_tokens)
            if key not in described:
                described[key] = pools.describe(head, predictions[r.prompt_id], head_bins, r.max_tokens)
            prediction = described[key]
        requests.append(Request(
            id=r.request_id, policy=policy, arrival=r.arrival_s, prompt_tokens=r.prompt_tokens,
            max_tokens=r.max_tokens, told_tokens=None if known is None else known[i], family=r.prompt_id,
            prediction=prediction, prediction_failure=failure,
        ))
    return Workload(requests, np.array([max(1, r.true_output_tokens) for r in trace], dtype=np.int64))
