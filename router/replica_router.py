"""Replica choice inside a pool, through Ray Serve's RequestRouter API.

The choice itself is Ray's power of two choices: the continuous benchmark measured least-in-flight
and prediction-informed scores (predicted remaining work, sequences still running after a
horizon) against it in the simulator (benchmarks/results/continuous.md), and the stack keeps only
what beat it. What this router adds are Ray's hooks: `on_request_routed` with the replica it
chose and `on_request_completed` when the request is done, written to the pool's ledger
(router.replica_ledger), which the ingress shows on /health.

Ray builds this router inside the process that holds the pool's handle (the router ingress) and
pickles this module by value; everything shared lives in router.replica_ledger.
"""

from __future__ import annotations

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter

from router.replica_ledger import ledger


class LedgerRequestRouter(PowerOfTwoChoicesRequestRouter):
    """Ray's power of two choices, telling the pool's ledger where each request went; a request
    the router pinned to a replica (a rollout's LPT placement) goes there while it lives."""

    def initialize_state(self, pool: str = "") -> None:
        self._ledger = ledger(pool)

    def update_replicas(self, replicas) -> None:
        super().update_replicas(replicas)
        self._ledger.set_replicas([r.replica_id.unique_id for r in replicas])

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        body = pending_request.args[0] if pending_request is not None and pending_request.args else None
        target = self._ledger.pinned(getattr(body, "request_id", None) or "")
        chosen = [r for r in candidate_replicas if target and r.replica_id.unique_id == target]
        return [chosen] if chosen else await super().choose_replicas(candidate_replicas, pending_request)

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        body = pending_request.args[0] if pending_request.args else None
        request_id = getattr(body, "request_id", None)
        if request_id:
            self._ledger.routed(request_id, pending_request.metadata.internal_request_id, replica_id.unique_id)

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self._ledger.completed(internal_request_id)
