"""What a response says about its request's routing, and the benchmark headers a request may carry.

Clients and benchmarks see what the router did with each request (pool, deciding policy,
the length it ranked by and where that came from, spillover, fallback, time spent routing and
waiting) without access to the server's logs or metrics: as `X-` headers on every answer, and in a
JSON answer's `length_prediction` and `routing` fields (OpenAI clients expose unknown fields as
extras). All of it is read off the request's record (router.scheduling.request).

`length_prediction` is the request's estimate (router.scheduling.signals) whatever its source
(`max_tokens`, a client's `hint`, the prompt's `history`, the `head`, a benchmark's `told`
length), one shape for all: a source that tells no spread has None for p10 and p90 and for
`pool_probabilities`. `X-Length-Source` names the source beside `X-Predicted-Tokens`.
"""

from __future__ import annotations

from typing import get_args

from router.scheduling.budget import Mode
from router.scheduling.request import Prediction, Request
from router.serving.errors import APIError
from router.serving.pipeline import Overrides

from router.api.auth import Keys

POLICY_HEADER = "x-routing-policy"
ORACLE_HEADER = "x-true-output-tokens"
POOL_HEADER = "x-target-pool"
PREDICT_HEADER = "x-predict"
FIXED_HEADER = "x-fixed-output-tokens"
BUDGET_HEADER = "x-predictor-budget"


def _ms(start: float | None, end: float | None) -> float:
    return 0.0 if start is None or end is None else (end - start) * 1000


def routing_ms(request: Request) -> float:
    """Rendering, predicting (pool policies) and deciding: what routing adds."""
    return _ms(request.arrival, request.decided_at)


def queued_ms(request: Request) -> float:
    """Waiting for a free slot in the pool's queue."""
    return _ms(request.decided_at, request.dispatched_at) if request.queued else 0.0


def prediction_json(prediction: Prediction, prompt_tokens: int | None) -> dict:
    """An estimate on the wire; `bin` is the pool's name (kept for clients of earlier releases)."""
    return {"source": prediction.source, "expected_tokens": prediction.expected_tokens,
            "quantiles": prediction.quantiles, "pool": prediction.pool, "bin": prediction.pool,
            "pool_probabilities": prediction.pool_probabilities, "prompt_tokens": prompt_tokens}


def routing_headers(request: Request) -> dict[str, str]:
    headers = {"X-Pool": request.pool, "X-Routing-Policy": request.decided_by,
               "X-Routing-Ms": f"{routing_ms(request):.1f}", "X-Queue-Ms": f"{queued_ms(request):.1f}"}
    if request.estimate is not None:
        headers["X-Predicted-Tokens"] = str(round(request.estimate.expected_tokens))
        headers["X-Length-Source"] = request.estimate.source
        headers["X-Length-Bin"] = request.estimate.pool
    if request.spilled_from is not None:
        headers["X-Spilled-From"] = request.spilled_from
    if request.fallback is not None:
        headers["X-Routing-Fallback"] = request.fallback
    if request.client_id is not None:
        headers["X-Request-Id"] = request.client_id
    return headers


def routing_extension(request: Request) -> dict:
    """Extra top-level fields of a JSON response."""
    prediction = None if request.estimate is None else prediction_json(request.estimate, request.prompt_tokens)
    routing = {"pool": request.pool, "policy": request.decided_by, "spilled_from": request.spilled_from,
               "fallback": request.fallback, "priority": request.priority, "routing_ms": round(routing_ms(request), 1),
               "queued_ms": round(queued_ms(request), 1)}
    return {"length_prediction": prediction, "routing": routing}


def benchmark_overrides(headers, enabled: bool, policies, pools, keys: Keys) -> Overrides:
    """Reads the benchmark headers; raises APIError 400 on a bad value, or on any of them when off,
    and 401 without the benchmark key (router.api.auth).

    Refusing them when off (rather than ignoring them) keeps a benchmark pointed at a production
    router from silently measuring the configured policy under another policy's name.
    """
    policy, told, pool, predict, fixed, budget = (headers.get(h) for h in (
        POLICY_HEADER, ORACLE_HEADER, POOL_HEADER, PREDICT_HEADER, FIXED_HEADER, BUDGET_HEADER))
    given = [h for h, v in ((POLICY_HEADER, policy), (ORACLE_HEADER, told), (POOL_HEADER, pool),
                            (PREDICT_HEADER, predict), (FIXED_HEADER, fixed), (BUDGET_HEADER, budget)) if v is not None]
    if not enabled:
        if given:
            raise APIError(400, f"{', '.join(given)}: benchmark headers are off (router.benchmark_headers: false).")
        return Overrides()
    if given:
        keys.check_benchmark(headers)
    if policy is not None and policy not in policies:
        raise APIError(400, f"Unknown routing policy {policy!r} in {POLICY_HEADER}; one of {sorted(policies)}.")
    if told is not None and not told.isdigit():
        raise APIError(400, f"{ORACLE_HEADER} must be a non-negative integer, got {told!r}.")
    if pool is not None and pool not in pools:
        raise APIError(400, f"Unknown pool {pool!r} in {POOL_HEADER}; one of {list(pools)}.")
    if predict not in (None, "all", "waiting"):
        raise APIError(400, f"{PREDICT_HEADER} must be 'all' or 'waiting', got {predict!r}.")
    if fixed is not None and not (fixed.isdigit() and int(fixed) > 0):
        raise APIError(400, f"{FIXED_HEADER} must be a positive integer, got {fixed!r}.")
    if budget not in (None, *get_args(Mode)):
        raise APIError(400, f"{BUDGET_HEADER} must be one of {list(get_args(Mode))}, got {budget!r}.")
    return Overrides(policy, None if told is None else int(told), pool, None if predict is None else predict == "all",
                     None if fixed is None else int(fixed), budget)
