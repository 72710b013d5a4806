"""What each replica of a pool holds: its requests and their predicted remaining work.

Filled from two sides in the router ingress's process: the replica router (router.replica_router)
says where each request went and when it completed; the ingress adds predictions (also ones that
land after dispatch) and the tokens streamed so far. Ray runs replica routers on their own event
loop thread, so the ledger takes a lock.

The registry lives in this module, apart from the router class: Ray Serve pickles a custom
router's own module by value, which would give the router a private copy of any registry defined
beside it; this module is imported by reference, so both sides share one ledger per pool.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from predictor.head import LengthBins
from router.length_bins import expected_remaining


@dataclass
class _Work:
    replica: str | None = None
    distribution: tuple[LengthBins, list[float]] | None = None
    cap: int | None = None
    estimate: float | None = None  # a length told rather than predicted (a rollout's known lengths)
    streamed: int = 0  # tokens relayed so far (streams)
    pinned: str | None = None  # the replica the router chose for it (rollouts)
    done: bool = False  # the replica has finished it; kept until the ingress drops it, for its answer

    def remaining(self) -> float | None:
        if self.distribution is not None:
            return expected_remaining(*self.distribution, self.streamed, self.cap)
        if self.estimate is not None:
            return max(1.0, self.estimate - self.streamed)
        return None


class ReplicaLedger:
    """Requests in flight by replica, keyed by the router's request id (the body's request_id)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._work: dict[str, _Work] = {}
        self._ours: dict[str, str] = {}  # Ray's internal request id -> ours
        self._replicas: list[str] = []  # the pool's live replicas, as Ray's router last saw them

    def set_replicas(self, replicas: list[str]) -> None:
        with self._lock:
            self._replicas = list(replicas)

    def live_replicas(self) -> list[str]:
        with self._lock:
            return list(self._replicas)

    def pin(self, request_id: str, replica: str) -> None:
        """Send this request to `replica` (Ray's router honours it while the replica lives)."""
        with self._lock:
            self._work.setdefault(request_id, _Work()).pinned = replica

    def pinned(self, request_id: str) -> str | None:
        with self._lock:
            work = self._work.get(request_id)
            return None if work is None else work.pinned

    def replica_of(self, request_id: str) -> str | None:
        with self._lock:
            work = self._work.get(request_id)
            return None if work is None else work.replica

    def estimated(self, request_id: str, tokens: float) -> None:
        with self._lock:
            self._work.setdefault(request_id, _Work()).estimate = tokens

    def routed(self, request_id: str, internal_id: str, replica: str) -> None:
        with self._lock:
            self._work.setdefault(request_id, _Work()).replica = replica
            self._ours[internal_id] = request_id

    def completed(self, internal_id: str) -> None:
        """No longer counts on its replica; the record stays until `drop`, because Ray may report
        a short stream complete before the ingress has read its last chunk and asked where it ran."""
        with self._lock:
            request_id = self._ours.pop(internal_id, None)
            if request_id is not None and (work := self._work.get(request_id)) is not None:
                work.done = True

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
        """The ingress is done with a request (answered, failed, or it never reached a replica); every
        request the ingress sends ends here, which is what keeps the ledger from growing."""
        with self._lock:
            self._work.pop(request_id, None)

    def snapshot(self) -> dict[str, dict]:
        """Per replica: requests, how many have a prediction, their predicted remaining tokens."""
        with self._lock:
            # A pinned request counts on its replica from the moment it is sent, before Ray confirms.
            work = [w for w in self._work.values() if not w.done and (w.replica or w.pinned) is not None]
            out: dict[str, dict] = {}
            for w in work:
                entry = out.setdefault(w.replica or w.pinned,
                                       {"requests": 0, "predicted": 0, "predicted_remaining_tokens": 0.0})
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
