"""One routing decision, made the same way for the HTTP router and the simulator: choose, spill, rank.

`Decider.decide` asks the policy chain for a pool, applies spillover, and says what the request
ranks by in the pool's queue: its work in tokens (router.policies.work_tokens), from the true
length for the oracle and ceiling, from the prediction for the predicted policies, and from the
prior (a typical length) while a prediction is missing, bounded by what the request itself fixes
(a request with max_tokens 4 is short with no prediction at all). Length-blind policies rank
nothing (None): their requests wait in arrival order. `rank_by` picks which
statistic of the predicted distribution stands for a request: the mean, or a quantile (p90 is
tail-aware: a request that might run long waits behind ones that surely will not).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from router.length_bins import PoolBins
from router.policies import KNOWN_LENGTH, POLICIES, Job, PolicyChain, PolicyContext, work_tokens

RankBy = Literal["mean", "p50", "p90"]


@dataclass(frozen=True)
class Decision:
    pool: str  # where it is served (after spillover)
    chosen: str  # what the policy picked
    policy: str  # the policy that decided: the one asked, or the fallback
    fallback: str | None  # why the one asked could not decide
    rank_tokens: float | None  # its work in tokens for the queue; None: length-blind (arrival order)
    on_prior: bool = False  # rank_tokens rest on the prior: its own length is not known (yet)

    @property
    def spilled_from(self) -> str | None:
        return self.chosen if self.pool != self.chosen else None


class Decider:
    def __init__(self, ctx: PolicyContext, policies: Iterable[str], fallback: str, spillover: bool = True,
                 shortest_first: bool = True, rank_by: RankBy = "mean", prior_tokens: float = 256.0):
        self.chain = PolicyChain(ctx, policies, fallback)
        self.load = ctx.load
        self.bins: PoolBins = ctx.output_bins
        self._spillover = spillover
        self._shortest_first = shortest_first
        self._rank_by = rank_by
        self._prior = prior_tokens

    def decide(self, job: Job, policy: str, spill: bool = True) -> Decision:
        pool, decided_by, reason = self.chain.choose(job, policy)
        if floor := job.floor_tokens():  # a request that forces N tokens never lands in a pool for fewer
            pool = max(pool, self.bins.pool_of(floor), key=self.bins.names.index)
        served = self.load.spill(pool) if spill and self._spillover else pool
        return Decision(served, pool, decided_by, reason, *self.ranking(job, decided_by))

    def rank(self, job: Job, policy: str) -> float | None:
        """The request's work in tokens as `policy` sees it; None for length-blind policies."""
        return self.ranking(job, policy)[0]

    def ranking(self, job: Job, policy: str) -> tuple[float | None, bool]:
        """The rank, and whether it rests on the prior (no length of the request's own yet)."""
        if not (self._shortest_first and POLICIES[policy].ranks_queue):
            return None, False
        if policy in KNOWN_LENGTH and job.true_tokens is not None:
            return work_tokens(job, job.true_tokens), False
        if job.prediction is not None:
            p = job.prediction
            return work_tokens(job, p["expected_tokens"] if self._rank_by == "mean" else p["quantiles"][self._rank_by]), False
        return work_tokens(job, self._prior), True

    def engine_priority(self, decision: Decision, max_model_len: int) -> int:
        """vLLM's `priority` inside the pool (lower first): the rank, or the pool's longest for
        length-blind policies, so their requests never jump ahead of predicted short ones."""
        if decision.rank_tokens is not None:
            return round(decision.rank_tokens)
        i = self.bins.names.index(decision.chosen)
        return round(self.bins.edges[i]) if i < len(self.bins.edges) else max_model_len
