"""What each replica of a pool holds: its requests in flight and their predicted remaining work.

Filled from two sides in the router ingress's process: the pool client (router.serving.pool_client)
tracks every request it sends and drops it when its answer is done; Ray's replica router
(router.serving.replica_router) says where each one went and when the replica finished it. Entries are
the requests' own records (router.scheduling.request), keyed by their ids, which are also Ray's internal
request ids of their calls (router.serving.pool_client), so a completion Ray reports always names the
right request, also for the samples of one rollout. Ray runs replica routers on their own event
loop thread, so the ledger takes a lock.

The registry lives in this module, apart from the router class: Ray Serve pickles a custom
router's own module by value, which would give the router a private copy of any registry defined
beside it; this module is imported by reference, so both sides share one ledger per pool.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from router.scheduling.replica_choice import ReplicaLoad
from router.scheduling.request import Request
from router.scheduling.rollout_plans import remaining_tokens


class ReplicaLedger:
    def __init__(self):
        self._lock = threading.Lock()
        self._requests: dict[str, Request] = {}
        self._finished: set[str] = set()  # the replica reported them done; kept until dropped
        self._replicas: list[str] = []  # the pool's live replicas, as Ray's router last saw them

    def set_replicas(self, replicas: list[str]) -> None:
        with self._lock:
            self._replicas = list(replicas)

    def live_replicas(self) -> list[str]:
        with self._lock:
            return list(self._replicas)

    def track(self, request: Request) -> None:
        """A request about to be sent (its pin and estimate count from now)."""
        with self._lock:
            self._requests[request.id] = request

    def get(self, request_id: str) -> Request | None:
        with self._lock:
            return self._requests.get(request_id)

    def routed(self, request_id: str, replica: str) -> None:
        with self._lock:
            if (request := self._requests.get(request_id)) is not None:
                request.replica = replica

    def completed(self, request_id: str) -> None:
        """The replica is done with it: it no longer counts there. The record stays until `drop`,
        because Ray may report a short stream complete before the pool client has read its end."""
        with self._lock:
            if request_id in self._requests:
                self._finished.add(request_id)

    def drop(self, request_id: str) -> None:
        """The pool client is done with a request (answered, failed, or never sent); every
        request it sends ends here, which is what keeps the ledger from growing."""
        with self._lock:
            self._requests.pop(request_id, None)
            self._finished.discard(request_id)

    def loads(self, replicas: list[str] | None = None) -> list[ReplicaLoad]:
        """Per replica (the live ones, or those given): requests on it and their predicted
        remaining work. A request counts on its pinned replica from the moment it is sent,
        before Ray confirms where it went."""
        with self._lock:
            by_replica: dict[str, list[Request]] = defaultdict(list)
            for rid, r in self._requests.items():
                where = r.replica or r.pinned
                if where is not None and rid not in self._finished:
                    by_replica[where].append(r)
            replicas = list(self._replicas) if replicas is None else replicas
        return [ReplicaLoad(replica, len(rs), remaining_tokens(rs, [r.streamed for r in rs]))
                for replica, rs in ((name, by_replica.get(name, [])) for name in replicas)]


_LEDGERS: dict[str, ReplicaLedger] = {}
_REGISTRY_LOCK = threading.Lock()


def ledger(pool: str) -> ReplicaLedger:
    """The ledger of `pool` in this process (created on first use, by the router or the ingress)."""
    with _REGISTRY_LOCK:
        return _LEDGERS.setdefault(pool, ReplicaLedger())
