"""Prometheus metrics of the routing decisions (exported by Ray on each node's metrics port).

Prediction error is measured on live traffic because the checkpoint's validation MAE says
nothing about drift in what users ask; fallbacks are counted because a predictor that silently
times out turns length-aware routing into input-length routing without anyone noticing; the
predictor budget's decisions are counted because a budget that skips every prediction looks,
from outside, like a router that ranks by nothing.
"""

from __future__ import annotations

import logging
from typing import get_args

from ray.serve.metrics import Counter, Gauge, Histogram

from router.scheduling.request import Verdict

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


class QueueMetrics:
    """The admission queues: how long requests wait, how often the order differs from arrival's,
    and how many were turned away."""

    def __init__(self):
        self._waiting = Gauge("lengthserve_queue_waiting", "Requests waiting for a slot, per pool", tag_keys=("pool",))
        self._wait_ms = Histogram(
            "lengthserve_queue_wait_ms", "Time a request waited for a slot (0 when dispatched at once)",
            boundaries=_LATENCY_BOUNDARIES_MS + [30000, 60000, 120000], tag_keys=("pool",),
        )
        self._reordered = Counter(
            "lengthserve_queue_reordered", "Requests handed a slot while an earlier arrival still waited",
            tag_keys=("pool",),
        )
        self._rejected = Counter("lengthserve_queue_rejected", "Requests refused with 429: queue full",
                                 tag_keys=("pool",))
        self._reported_reorders: dict[str, int] = {}

    def waiting(self, pool: str, count: int) -> None:
        self._waiting.set(count, {"pool": pool})

    def waited(self, pool: str, seconds: float) -> None:
        self._wait_ms.observe(seconds * 1000, {"pool": pool})

    def reordered(self, pool: str, total: int) -> None:
        """The queue's running count of reorders; the counter gets what is new since the last call."""
        new = total - self._reported_reorders.get(pool, 0)
        self._reported_reorders[pool] = total
        if new > 0:
            self._reordered.inc(new, {"pool": pool})

    def rejected(self, pool: str) -> None:
        self._rejected.inc(1, {"pool": pool})


class BudgetMetrics:
    """What the predictor budget (router.scheduling.budget) decided for the requests that waited:
    predicted, skipped by the budget, or skipped because a cheap signal ranked them already."""

    def __init__(self):
        self._decisions = Counter("lengthserve_predictor_budget_decisions", "Waiting requests predicted for their "
                                  "rank, skipped by the budget, or skipped by a cheaper signal", tag_keys=("decision",))
        self.counts: dict[Verdict, int] = dict.fromkeys(get_args(Verdict), 0)  # this replica's, for /health

    def decided(self, verdict: Verdict) -> None:
        self._decisions.inc(1, {"decision": verdict})
        self.counts[verdict] += 1


class QualityMetrics:
    """Live quality per source (router.serving.live_quality): each head (the `head` tag), the
    client's hints (`hint`) and the prompts' history (`history`), and whether the router trusts it."""

    FIELDS = ("mae_tokens", "signed_error_tokens", "pool_accuracy", "concordance")

    def __init__(self):
        self._gauges = {f: Gauge(f"lengthserve_live_{f}", f"Live prediction {f.replace('_', ' ')} over the "
                                 "sliding window", tag_keys=("head",)) for f in self.FIELDS}
        self._trusted = Gauge("lengthserve_predictions_trusted", "1 while the router ranks and routes on the "
                              "head's predictions, 0 while live quality keeps it length-blind", tag_keys=("head",))

    def update(self, head: str, report: dict) -> None:
        for f in self.FIELDS:
            if report.get(f) is not None:
                self._gauges[f].set(report[f], {"head": head})
        self._trusted.set(1 if report["trusted"] else 0, {"head": head})
