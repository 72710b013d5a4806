"""One routing decision and how it shows in the response (headers and the JSON extension).

Clients and benchmarks see what the router did with each request (pool, deciding policy,
prediction, spillover, fallback) without access to the server's logs or metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.auth import Keys
from router.errors import APIError


@dataclass(frozen=True)
class Route:
    pool: str
    policy: str  # the policy that decided: the configured one, or the fallback
    prompt_tokens: int | None
    prediction: dict | None
    priority: int  # what vLLM schedules on inside the pool (lower first)
    spilled_from: str | None = None  # the saturated pool the policy chose
    fallback: str | None = None  # why the configured policy could not decide
    routing_ms: float = 0.0  # tokenizing, predicting (pool policies) and choosing: what routing adds
    queued_ms: float = 0.0  # waiting for a free slot in the pool's queue

    def headers(self) -> dict[str, str]:
        headers = {"X-Pool": self.pool, "X-Routing-Policy": self.policy, "X-Routing-Ms": f"{self.routing_ms:.1f}",
                   "X-Queue-Ms": f"{self.queued_ms:.1f}"}
        if self.prediction is not None:
            headers["X-Predicted-Tokens"] = str(round(self.prediction["expected_tokens"]))
            headers["X-Length-Bin"] = self.prediction["bin"]
        if self.spilled_from is not None:
            headers["X-Spilled-From"] = self.spilled_from
        if self.fallback is not None:
            headers["X-Routing-Fallback"] = self.fallback
        return headers

    def extension(self) -> dict:
        """Extra top-level fields of a JSON response; OpenAI clients expose them as extras."""
        prediction = None if self.prediction is None else {**self.prediction, "prompt_tokens": self.prompt_tokens}
        routing = {"pool": self.pool, "policy": self.policy, "spilled_from": self.spilled_from,
                   "fallback": self.fallback, "priority": self.priority, "routing_ms": round(self.routing_ms, 1),
                   "queued_ms": round(self.queued_ms, 1)}
        return {"length_prediction": prediction, "routing": routing}


POLICY_HEADER = "x-routing-policy"
ORACLE_HEADER = "x-true-output-tokens"
POOL_HEADER = "x-target-pool"
PREDICT_HEADER = "x-predict"


@dataclass(frozen=True)
class BenchmarkOverrides:
    """What a benchmark asked of one request (router.benchmark_headers: true only)."""

    policy: str | None = None  # X-Routing-Policy: decide by this policy instead of the configured one
    true_tokens: int | None = None  # X-True-Output-Tokens: the real output length, for the oracle
    pool: str | None = None  # X-Target-Pool: a pool planned beforehand (batch-synchronous replays)
    predict_all: bool | None = None  # X-Predict: all | waiting, for this request (predictor.predict)


def benchmark_overrides(headers, enabled: bool, policies, pools, keys: Keys) -> BenchmarkOverrides:
    """Reads the benchmark headers; raises APIError 400 on a bad value, or on any of them when off,
    and 401 without the benchmark key (router.auth).

    Refusing them when off (rather than ignoring them) keeps a benchmark pointed at a production
    router from silently measuring the configured policy under another policy's name.
    """
    policy, true_tokens, pool, predict = (headers.get(h) for h in (POLICY_HEADER, ORACLE_HEADER, POOL_HEADER,
                                                                    PREDICT_HEADER))
    given = [h for h, v in ((POLICY_HEADER, policy), (ORACLE_HEADER, true_tokens), (POOL_HEADER, pool),
                            (PREDICT_HEADER, predict)) if v is not None]
    if not enabled:
        if given:
            raise APIError(400, f"{', '.join(given)}: benchmark headers are off (router.benchmark_headers: false).")
        return BenchmarkOverrides()
    if given:
        keys.check_benchmark(headers)
    if policy is not None and policy not in policies:
        raise APIError(400, f"Unknown routing policy {policy!r} in {POLICY_HEADER}; one of {sorted(policies)}.")
    if true_tokens is not None and not true_tokens.isdigit():
        raise APIError(400, f"{ORACLE_HEADER} must be a non-negative integer, got {true_tokens!r}.")
    if pool is not None and pool not in pools:
        raise APIError(400, f"Unknown pool {pool!r} in {POOL_HEADER}; one of {list(pools)}.")
    if predict not in (None, "all", "waiting"):
        raise APIError(400, f"{PREDICT_HEADER} must be 'all' or 'waiting', got {predict!r}.")
    return BenchmarkOverrides(policy, None if true_tokens is None else int(true_tokens), pool,
                              None if predict is None else predict == "all")
