"""Replica choice inside a pool, through Ray Serve's RequestRouter API, and a ledger of what each
replica holds.

The choice itself is Ray's power of two choices: the continuous benchmark measured least-in-flight
and prediction-informed scores (predicted remaining work, sequences still running after a
horizon) against it in the simulator, and none beat it (benchmarks/results/continuous.md), so
the stack keeps it. What this router adds are the hooks: Ray calls `on_request_routed` with the
replica it chose and `on_request_completed` when the request is done, so the ingress can know
each replica's requests and their predicted remaining work, including predictions that arrive
after the request was dispatched, and show them on /health and as metrics.

Ray builds this router inside the process that holds the pool's handle (the router ingress), so
the ledger is shared with the ingress through a per-process registry, as Ray Serve LLM's
KV-aware router shares its token tracker. Ray runs routers on their own event loop thread: the
ledger takes a lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter

from predictor.head import LengthBins
from router.length_bins import expected_remaining


@dataclass
class _Work:
    replica: str | None = None
    distribution: tuple[LengthBins, list[float]] | None = None
    cap: int | None = None
    streamed: int = 0  # tokens relayed so far (streams)

    def remaining(self) -> float | None:
        if self.distribution is None:
            return None
        return expected_remaining(*self.distribution, self.streamed, self.cap)


class ReplicaLedger:
    """Requests in flight by replica, keyed by the router's request id (the body's request_id)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._work: dict[str, _Work] = {}
        self._ours: dict[str, str] = {}  # Ray's internal request id -> ours

    def routed(self, request_id: str, internal_id: str, replica: str) -> None:
        with self._lock:
            self._work.setdefault(request_id, _Work()).replica = replica
            self._ours[internal_id] = request_id

    def completed(self, internal_id: str) -> None:
        with self._lock:
            request_id = self._ours.pop(internal_id, None)
            if request_id is not None:
                self._work.pop(request_id, None)

    def predicted(self, request_id: str, distribution: tuple[LengthBins, list[float]], cap: int | None) -> None:
        """A prediction for a request, whenever it arrives (also after dispatch)."""
        with self._lock:
            work = self._work.setdefault(request_id, _Work())
            work.distribution, work.cap = distribution, cap

    def streamed(self, request_id: str, tokens: int = 1) -> None:
        with self._lock:
            if (work := self._work.get(request_id)) is not None:
                work.streamed += tokens

    def drop(self, request_id: str) -> None:
        """The ingress is done with a request (answered, failed, or it never reached a replica)."""
        with self._lock:
            self._work.pop(request_id, None)

    def snapshot(self) -> dict[str, dict]:
        """Per replica: requests, how many have a prediction, their predicted remaining tokens."""
        with self._lock:
            work = [w for w in self._work.values() if w.replica is not None]
            out: dict[str, dict] = {}
            for w in work:
                entry = out.setdefault(w.replica, {"requests": 0, "predicted": 0, "predicted_remaining_tokens": 0.0})
                entry["requests"] += 1
                if (left := w.remaining()) is not None:
                    entry["predicted"] += 1
                    entry["predicted_remaining_tokens"] += left
        for entry in out.values():
            entry["predicted_remaining_tokens"] = round(entry["predicted_remaining_tokens"], 1)
        return out


_LEDGERS: dict[str, ReplicaLedger] = {}
_REGISTRY_LOCK = threading.Lock()


def ledger(pool: str) -> ReplicaLedger:
    """The ledger of `pool` in this process (created on first use, by the router or the ingress)."""
    with _REGISTRY_LOCK:
        return _LEDGERS.setdefault(pool, ReplicaLedger())


class LedgerRequestRouter(PowerOfTwoChoicesRequestRouter):
    """Ray's power of two choices, telling the pool's ledger where each request went."""

    def initialize_state(self, pool: str = "") -> None:
        self._ledger = ledger(pool)

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        body = pending_request.args[0] if pending_request.args else None
        request_id = getattr(body, "request_id", None)
        if request_id:
            self._ledger.routed(request_id, pending_request.metadata.internal_request_id, replica_id.unique_id)

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self._ledger.completed(internal_request_id)
