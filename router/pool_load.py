"""Requests in flight per pool, as this router sees them, and spillover when a pool is full.

Counting at the router costs nothing per request and needs no call into the replicas. With
several router replicas each one counts only its own requests, so per-pool capacities are
per router replica: divide them when scaling the router out.
"""

from __future__ import annotations


class PoolLoad:
    def __init__(self, names: list[str], capacities: dict[str, int | None]):
        self.names = list(names)
        self._capacity = dict(capacities)
        self._inflight = dict.fromkeys(self.names, 0)

    def inflight(self, pool: str) -> int:
        return self._inflight[pool]

    def saturated(self, pool: str) -> bool:
        capacity = self._capacity.get(pool)
        return capacity is not None and self._inflight[pool] >= capacity

    def acquire(self, pool: str) -> None:
        self._inflight[pool] += 1

    def release(self, pool: str) -> None:
        self._inflight[pool] -= 1

    def spill(self, chosen: str) -> str:
        """`chosen` unless it is full; else the nearest pool with room, the longer one on a tie.

        Longer first because a short request in a long pool costs little, while a long request in
        a short pool holds up every short one there. When every pool is full the request stays
        with its own pool and queues there (bounded by the router's request timeout).
        """
        if not self.saturated(chosen):
            return chosen
        c = self.names.index(chosen)
        by_distance = sorted(range(len(self.names)), key=lambda i: (abs(i - c), -i))
        for i in by_distance[1:]:
            if not self.saturated(self.names[i]):
                return self.names[i]
        return chosen
