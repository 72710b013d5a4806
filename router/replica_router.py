"""Replica choice inside a pool, through Ray Serve's RequestRouter API.

The continuous benchmark measured Ray's power of two choices against least-in-flight and
prediction-informed scores (predicted remaining work, sequences still running after a horizon)
in the simulator (benchmarks/results/continuous.md, "How the defaults were chosen"): only
least-in-flight beat it (mean JCT -3%, p99 -6% at 80% load on 100 replicas; step time grows with
the sequences a replica runs, not with their remaining work), so this router ranks the replicas
by the requests the ledger counts on them; with two replicas that is what power of two choices
does anyway. It also feeds the ledger from Ray's hooks: `on_request_routed` with the replica
chosen and `on_request_completed` when the request is done (router.replica_ledger), which the
ingress shows on /health and a rollout's placement reads.

Ray builds this router inside the process that holds the pool's handle (the router ingress) and
pickles this module by value; everything shared lives in router.replica_ledger.
"""

from __future__ import annotations

import random

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter

from router.replica_ledger import ledger


class LedgerRequestRouter(PowerOfTwoChoicesRequestRouter):
    """The replica with the fewest requests, telling the pool's ledger where each request went; a
    request the router pinned to a replica (a rollout's LPT placement) goes there while it lives."""

    def initialize_state(self, pool: str = "") -> None:
        self._ledger = ledger(pool)

    def update_replicas(self, replicas) -> None:
        super().update_replicas(replicas)
        self._ledger.set_replicas([r.replica_id.unique_id for r in replicas])

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        body = pending_request.args[0] if pending_request is not None and pending_request.args else None
        target = self._ledger.pinned(getattr(body, "request_id", None) or "")
        chosen = [r for r in candidate_replicas if target and r.replica_id.unique_id == target]
        if chosen:
            return [chosen]
        if len(candidate_replicas) < 2:
            return await super().choose_replicas(candidate_replicas, pending_request)
        return self._least_inflight(candidate_replicas)

    def _least_inflight(self, candidates) -> list[list]:
        """Ranked groups, fewest requests first (ties in random order): a full replica is skipped
        by Ray, which then tries the next group."""
        counts = self._ledger.snapshot()
        shuffled = random.sample(list(candidates), len(candidates))
        ranked = sorted(shuffled, key=lambda r: counts.get(r.replica_id.unique_id, {}).get("requests", 0))
        return [[r] for r in ranked]

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        body = pending_request.args[0] if pending_request.args else None
        request_id = getattr(body, "request_id", None)
        if request_id:
            self._ledger.routed(request_id, pending_request.metadata.internal_request_id, replica_id.unique_id)

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self._ledger.completed(internal_request_id)
