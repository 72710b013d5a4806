"""Replica choice inside a pool, through Ray Serve's RequestRouter API.

Ray builds this router inside the process that holds the pool's handle (the router ingress) and
asks `choose_replicas` for ranked groups of replicas; the ranking is the scheduling core's
(router.scheduling.replica_choice.rank_replicas, the simulator's too) over the pool's ledger
(router.serving.replica_ledger), which this router also feeds from Ray's hooks: where each request went
(`on_request_routed`) and when its replica finished it (`on_request_completed`).

Every answer sets `should_backoff`: Ray's routing loop retries at once, re-probing the replicas'
queue lengths over actor calls, unless the router says it has offered every replica
(`request_router.py`: `if not ...should_backoff: continue`); Ray's own power of two sets it
once it has. Each ranking here offers every live replica, the pinned one first, so a request
whose replicas are all full waits with Ray's backoff instead of spinning on the cores the engines
need.

Ray pickles this module by value; everything shared lives in router.serving.replica_ledger.
"""

from __future__ import annotations

import random

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter

from router.scheduling.replica_choice import rank_replicas
from router.serving.replica_ledger import ledger


def _request_id(pending_request) -> str | None:
    body = pending_request.args[0] if pending_request is not None and pending_request.args else None
    return getattr(body, "request_id", None)


class LedgerRequestRouter(PowerOfTwoChoicesRequestRouter):
    def initialize_state(self, pool: str = "", choice: str = "least_inflight") -> None:
        self._ledger = ledger(pool)
        self._choice = choice
        self._rng = random.Random()

    def update_replicas(self, replicas) -> None:
        super().update_replicas(replicas)
        self._ledger.set_replicas([r.replica_id.unique_id for r in replicas])

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        request = self._ledger.get(_request_id(pending_request) or "")
        groups = rank_replicas(self._choice, self._ledger.loads(list(by_id)), self._rng,
                               request.pinned if request is not None else None)
        return [[by_id[r] for r in group] for group in groups]

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        if request_id := _request_id(pending_request):
            self._ledger.routed(request_id, replica_id.unique_id)

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self._ledger.completed(internal_request_id)

