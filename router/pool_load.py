"""Requests in flight per pool, as this router sees them, their queues, and spillover when a pool is full.

Counting at the router costs nothing per request and needs no call into the replicas. Each pool
has `capacity` slots (max_ongoing_requests x replicas) and an admission queue in front of them
(router.admission): a request dispatches while a slot is free and waits in the queue otherwise.
With several router replicas each one counts only its own requests, so per-pool capacities are
per router replica: divide them when scaling the router out.
"""

from __future__ import annotations

import math

from router.admission import AdmissionQueue, QueueOrder


class PoolLoad:
    def __init__(self, names: list[str], capacities: dict[str, int | None], waiting_per_slot: float | None = None,
                 order: QueueOrder = QueueOrder()):
        """`waiting_per_slot`: each pool's queue bound as a multiple of its slots (None: unbounded)."""
        self.names = list(names)
        self.queues: dict[str, AdmissionQueue] = {}
        for name in self.names:
            slots = capacities.get(name)
            bound = None if slots is None or waiting_per_slot is None else max(1, math.ceil(slots * waiting_per_slot))
            self.queues[name] = AdmissionQueue(slots, bound, order)

    def inflight(self, pool: str) -> int:
        return self.queues[pool].inflight

    def waiting(self, pool: str) -> int:
        return len(self.queues[pool])

    def saturated(self, pool: str) -> bool:
        return not self.queues[pool].has_room()

    def spill(self, chosen: str) -> str:
        """`chosen` unless it is full; else the nearest pool with room, the longer one on a tie.

        Longer first because a short request in a long pool costs little, while a long request in
        a short pool holds up every short one there. When every pool is full the request stays
        with its own pool and waits in its queue.
        """
        if not self.saturated(chosen):
            return chosen
        c = self.names.index(chosen)
        by_distance = sorted(range(len(self.names)), key=lambda i: (abs(i - c), -i))
        for i in by_distance[1:]:
            if not self.saturated(self.names[i]):
                return self.names[i]
        return chosen
