"""Which replica of a pool takes a dispatched request: Ray's power of two choices and the rivals it
is measured against (the continuous benchmark keeps only what beats it).

- `pow2`: two replicas with room sampled, the one with fewer requests on it (Ray Serve's default);
- `least_inflight`: the replica with the fewest requests (join-shortest-queue, a full scan);
- `pow2_work`: two sampled, the one with less predicted remaining work: each request's predicted
  distribution conditioned on the tokens it has generated so far (router.length_bins.expected_remaining);
- `pow2_running`: two sampled, the one expected to run fewer sequences `HORIZON` tokens from now
  (router.length_bins.still_running): step time grows with running sequences, not remaining work;
- `least_work`: the replica with the least predicted remaining work (a full scan): with jobs
  taken longest first, the classic LPT rule for a batch's makespan;
- `round_robin`: replicas take turns.

Requests without a distribution (no prediction) count as the head-free prior: one request's worth
of average work, so the scores degrade to counting requests.
"""

from __future__ import annotations

import random
import numpy as np

from router.length_bins import expected_remaining, still_running

HORIZON = 128  # tokens ahead for pow2_running: about 25 s of decode at the calibrated step time
GRID = 16  # generated-token resolution of the precomputed conditional tables


class ReplicaScore:
    """Power of two choices on requests in flight (Ray's)."""

    def __init__(self, workload, rng: random.Random):
        self.workload, self.rng = workload, rng

    def pick(self, pool, now: float) -> int:
        a, b = self.rng.sample(pool.free, 2)
        return a if self.load(pool, a, now) <= self.load(pool, b, now) else b

    def load(self, pool, k: int, now: float) -> float:
        return pool.ongoing[k]


class LeastInflight(ReplicaScore):
    def pick(self, pool, now: float) -> int:
        fewest = min(pool.ongoing[k] for k in pool.free)
        return self.rng.choice([k for k in pool.free if pool.ongoing[k] == fewest])


class RoundRobin(ReplicaScore):
    def pick(self, pool, now: float) -> int:
        turn = getattr(pool, "turn", 0)
        pool.turn = turn + 1
        order = sorted(pool.free)
        return order[turn % len(order)]


class _Conditional(ReplicaScore):
    """Sums a per-sequence function of the tokens generated so far over the replica's requests.

    A distribution is (head bins, probabilities), an int for a known length (the oracle), or None.
    """

    def __init__(self, workload, rng: random.Random):
        super().__init__(workload, rng)
        self._tables: dict[tuple[int, int], np.ndarray] = {}

    def load(self, pool, k: int, now: float) -> float:
        engine = pool.engines[k]
        progress = engine.steps_done(now)
        total = sum(self._score(s.index, s.generated + (progress if s.prefill_left == 0 else 0))
                    for s in engine.running)
        return total + sum(self._score(s.index, 0) for s in engine.waiting())

    def _score(self, i: int, generated: int) -> float:
        dist = self.workload.distributions[i] if self.workload.distributions else None
        if dist is None:
            return 1.0  # unpredicted: one request's worth, as counting requests would
        if isinstance(dist, int):
            return self._known(dist, generated)
        cap = int(self.workload.max_tokens[i])
        key = (id(dist), cap)
        if key not in self._tables:
            self._tables[key] = np.array([self._conditional(dist, g, cap) for g in range(0, cap + GRID, GRID)])
        table = self._tables[key]
        return float(table[min(generated // GRID, len(table) - 1)])


class Pow2Work(_Conditional):
    def _known(self, length: int, generated: int) -> float:
        return max(1.0, length - generated)

    def _conditional(self, dist, generated: int, cap: int) -> float:
        return expected_remaining(*dist, generated, cap)


class Pow2Running(_Conditional):
    def _known(self, length: int, generated: int) -> float:
        return float(length > generated + HORIZON)

    def _conditional(self, dist, generated: int, cap: int) -> float:
        return still_running(*dist, generated, HORIZON)


class LeastWork(Pow2Work):
    def pick(self, pool, now: float) -> int:
        loads = {k: self.load(pool, k, now) for k in pool.free}
        return min(loads, key=loads.get)


REPLICA_CHOICE = {
    "pow2": ReplicaScore,
    "least_inflight": LeastInflight,
    "pow2_work": Pow2Work,
    "pow2_running": Pow2Running,
    "least_work": LeastWork,
    "round_robin": RoundRobin,
}
