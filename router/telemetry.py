"""Prometheus metrics of the routing decisions (exported by Ray on each node's metrics port).

Prediction error is measured on live traffic because the checkpoint's validation MAE says
nothing about drift in what users ask; fallbacks are counted because a predictor that silently
times out turns length-aware routing into input-length routing without anyone noticing.
"""

from __future__ import annotations

import logging

from ray.serve.metrics import Counter, Gauge, Histogram

log = logging.getLogger("ray.serve")

_ERROR_BOUNDARIES = [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
_LATENCY_BOUNDARIES_MS = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]


class RoutingMetrics:
    def __init__(self, policy: str):
        self._policy = policy
        self._requests = Counter(
            "lengthserve_pool_requests", "Requests sent to each pool",
            tag_keys=("pool", "policy", "spilled"),
        )
        self._inflight = Gauge(
            "lengthserve_pool_inflight", "Requests in flight per pool (queue depth as the router sees it)",
            tag_keys=("pool",),
        )
        self._abs_error = Histogram(
            "lengthserve_prediction_abs_error_tokens", "|predicted - real| completion tokens",
            boundaries=_ERROR_BOUNDARIES, tag_keys=("pool", "predictor"),
        )
        self._fallbacks = Counter(
            "lengthserve_predictor_fallbacks", "Requests routed by the fallback policy, by reason",
            tag_keys=("reason",),
        )
        self._predictor_ms = Histogram(
            "lengthserve_predictor_latency_ms", "Router-side wait for a prediction",
            boundaries=_LATENCY_BOUNDARIES_MS, tag_keys=("predictor",),
        )

    def routed(self, pool: str, spilled: bool) -> None:
        self._requests.inc(1, {"pool": pool, "policy": self._policy, "spilled": str(spilled).lower()})

    def inflight(self, pool: str, count: int) -> None:
        self._inflight.set(count, {"pool": pool})

    def completed(self, pool: str, predictor: str, predicted: float, real: int) -> None:
        self._abs_error.observe(abs(predicted - real), {"pool": pool, "predictor": predictor})

    def fallback(self, reason: str, detail: str) -> None:
        log.warning("routing by the fallback policy (%s): %s", reason, detail)
        self._fallbacks.inc(1, {"reason": reason})

    def predictor_latency(self, predictor: str, seconds: float) -> None:
        self._predictor_ms.observe(seconds * 1000, {"predictor": predictor})
