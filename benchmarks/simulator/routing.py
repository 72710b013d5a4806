"""The router's decisions for simulated requests, made by the router's own objects.

Pool choice, spillover and the rank a request waits with come from router.decision.Decider, and
admission (dispatch now, or wait in the pool's shortest-first queue) from the PoolLoad's
router.admission queues, exactly as the ingress uses them; the simulator only supplies the clock.
"""

from __future__ import annotations

import random

from router.admission import QueueOrder
from router.decision import Decider, Decision, RankBy
from router.length_bins import PoolBins
from router.policies import Job, PolicyContext
from router.pool_load import PoolLoad


class SimRouter:
    def __init__(
        self, policy: str, fallback: str, bins: PoolBins, input_edges: list[int], replicas: dict[str, int],
        capacities: dict[str, int | None], spillover: bool, max_model_len: int, seed: int = 0,
        order: QueueOrder = QueueOrder(), shortest_first: bool = True, rank_by: RankBy = "mean",
        waiting_per_slot: float | None = None,
    ):
        names = list(bins.names)
        self.load = PoolLoad(names, capacities, waiting_per_slot, order)
        ctx = PolicyContext(pools=names, output_bins=bins, input_edges=input_edges, replicas=replicas,
                            load=self.load, rng=random.Random(seed))
        self.policy_name = policy
        self.decider = Decider(ctx, [policy], fallback, spillover, shortest_first, rank_by, order.prior_tokens)
        self._max_model_len = max_model_len

    def route(self, job: Job, plan: bool = False) -> tuple[Decision, int]:
        """The decision for a request arriving now and its vLLM priority. `plan`: batch mode's
        /v1/length planning, before anything is sent (no spillover)."""
        decision = self.decider.decide(job, self.policy_name, spill=not plan)
        return decision, self.decider.engine_priority(decision, self._max_model_len)
