"""The router's pool choice for simulated requests, made by the router's own objects.

Policies are the classes of router.policies, built on one PolicyContext whose PoolLoad the
simulator acquires and releases as the ingress does (at routing, at the last token), so
ray_default sees the same in-flight counts and spillover follows PoolLoad.spill; the
shortest-first priority is router.policies.priority, and the fallback chain is the router's own
router.policies.PolicyChain.
"""

from __future__ import annotations

import random

from router.length_bins import PoolBins
from router.policies import Job, PolicyChain, PolicyContext, priority
from router.pool_load import PoolLoad


class SimRouter:
    def __init__(
        self, policy: str, fallback: str, bins: PoolBins, input_edges: list[int], replicas: dict[str, int],
        capacities: dict[str, int | None], spillover: bool, max_model_len: int, seed: int = 0,
    ):
        names = list(bins.names)
        self.load = PoolLoad(names, capacities)
        ctx = PolicyContext(pools=names, output_bins=bins, input_edges=input_edges, replicas=replicas,
                            load=self.load, rng=random.Random(seed))
        self.policy_name, self.fallback_name = policy, fallback
        self._chain = PolicyChain(ctx, [policy], fallback)
        self._bins, self._spillover, self._max_model_len = bins, spillover, max_model_len

    def _choose(self, job: Job) -> tuple[str, str]:
        pool, policy, _ = self._chain.choose(job, self.policy_name)
        return pool, policy

    def route(self, job: Job, cap: int | None) -> tuple[str, int, str]:
        """(pool, priority, deciding policy) for a request arriving now; it counts in flight from here on."""
        chosen, policy = self._choose(job)
        pool = self.load.spill(chosen) if self._spillover else chosen
        self.load.acquire(pool)
        return pool, priority(job, chosen, policy, self._bins, self._max_model_len, cap), policy

    def plan(self, job: Job, cap: int | None) -> tuple[str, int, str]:
        """The pool the policy picks before anything is sent (batch mode's /v1/length planning):
        no spillover, nothing counted in flight."""
        chosen, policy = self._choose(job)
        return chosen, priority(job, chosen, policy, self._bins, self._max_model_len, cap), policy
