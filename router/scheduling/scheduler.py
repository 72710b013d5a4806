"""The scheduling decisions of one router: which pool, what a request ranks by, who takes a freed slot.

One object, used the same way by the HTTP router (router.serving.pipeline, through router.serving.gate) and by
the simulator (benchmarks.simulator.cluster), so a simulated figure is the router's own decisions
on a modelled clock. Per request:
- `decide`: the policy chain picks a pool (the fallback when the policy cannot, or when live
  quality has stopped trusting its head), spillover moves it off a saturated pool, and the
  request gets its rank;
- `admit`: dispatch at once while the pool has a free slot, else wait in the pool's queue
  (router.scheduling.admission: shortest-predicted-first with aging), or be refused when it is full;
- `landed`: a prediction that lands while the request waits re-ranks it;
- `worth_predicting`: whether a waiting request's rank is worth its prediction (the predictor
  budget, router.scheduling.budget);
- `release`: a request done with its slot hands it to the next waiting one.

The rank is the request's work in tokens (`Request.work_tokens`) from its estimate, the cheapest
present and trusted signal (router.scheduling.signals: the told length for the oracle and the
ceiling, `max_tokens` where it is the length, the client's hint, the prompt's history, the
prediction), and from the prior (a typical length) while it has none, bounded by what the request
itself fixes. Length-blind policies rank nothing (None): their requests wait in arrival order. A
request whose head failed or is distrusted is decided and ranked by its policy on a cheap signal
when it has one; without one the fallback decides and it waits in arrival order. `rank_by` picks
which statistic of the estimate stands for a request: the mean, or a quantile (p90 is tail-aware:
a request that might run long waits behind ones that surely will not).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from router.scheduling.admission import Admission, AdmissionQueue, QueueOrder
from router.scheduling.budget import Mode, PredictorBudget
from router.scheduling.policies import POLICIES, PolicyChain, PolicyContext, head_of
from router.scheduling.pools import Pools
from router.scheduling.request import BudgetDecision, Prediction, Request, Statistic
from router.scheduling.signals import Signals


@dataclass(frozen=True)
class Ranking:
    """How a request ranks while it waits (and what vLLM's priority says inside the engine)."""

    shortest_first: bool = True  # false: every policy waits in arrival order
    rank_by: Statistic = "mean"
    prior_tokens: float = 256.0  # the rank of a request whose length is not known (yet)
    short_cap_tokens: float = 0.0  # a max_tokens at or below this is the request's length (signals)


class Scheduler:
    def __init__(
        self, pools: Pools, slots: dict[str, int | None], policies: Iterable[str], fallback: str, *,
        ranking: Ranking = Ranking(), order: QueueOrder = QueueOrder(), waiting_per_slot: float | None = None,
        spillover: bool = True, replicas: dict[str, int] | None = None, input_edges: Iterable[int] = (),
        rng: random.Random | None = None, budget: PredictorBudget | None = None,
    ):
        """`slots`: each pool's in-flight limit (max_ongoing_requests x replicas; None: unlimited);
        `waiting_per_slot`: each pool's queue bound as a multiple of its slots (None: unbounded);
        `budget`: the predictor budget (None: every waiting request is worth its prediction)."""
        self.pools = pools
        self.ranking = ranking
        self.signals = Signals(pools, ranking.short_cap_tokens)
        self.distrusted: set[str] = set()  # sources and heads live quality keeps out of the estimate
        self.budget = budget or PredictorBudget(mode="always")
        self.queues: dict[str, AdmissionQueue] = {}
        for name in pools.names:
            n = slots.get(name)
            bound = None if n is None or waiting_per_slot is None else max(1, math.ceil(n * waiting_per_slot))
            self.queues[name] = AdmissionQueue(n, bound, order)
        ctx = PolicyContext(pools, list(input_edges), replicas or dict.fromkeys(pools.names, 1), self.inflight,
                            self.estimate, rng or random.Random())
        self.chain = PolicyChain(ctx, policies, fallback)
        self._spillover = spillover

    def inflight(self, pool: str) -> int:
        return self.queues[pool].inflight

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
        names = self.pools.names
        c = names.index(chosen)
        for i in sorted(range(len(names)), key=lambda i: (abs(i - c), -i))[1:]:
            if not self.saturated(names[i]):
                return names[i]
        return chosen

    def decide(self, request: Request, spill: bool = True) -> None:
        """Pool, deciding policy, fallback and rank, on the record. A head live quality distrusts is
        kept out (the fallback decides, unless a cheaper trusted signal gives the length); `spill`
        False: a plan made before anything is sent (batch mode) stays where the policy put it."""
        if request.target_pool is not None:  # planned by the benchmark: no decision, no spillover
            request.chosen_pool = request.pool = request.target_pool
            request.decided_by = request.policy
        else:
            if self.trusts(request.policy) or self._cheaply_known(request):
                pool, request.decided_by, request.fallback = self.chain.choose(request, request.policy)
            else:
                pool, request.decided_by, request.fallback = self.chain.fall_back(request, "low_live_quality")
            if floor := request.floor_tokens():  # a request that forces N tokens never lands in a pool for fewer
                pool = max(pool, self.pools.pool_of(floor), key=self.pools.names.index)
            request.chosen_pool = pool
            request.pool = self.spill(pool) if spill and self._spillover else pool
        self.rank(request)

    def _cheaply_known(self, request: Request) -> bool:
        """A trusted signal other than the head gives the length: a distrusted head then takes
        nothing from the policy, which pools and ranks by that signal as it would anyway."""
        estimate = self.estimate(request)
        return estimate is not None and estimate.source != "head"

    def trust(self, source: str, trusted: bool) -> None:
        """Live quality's verdict on a source or a head (router.serving.live_quality)."""
        (self.distrusted.discard if trusted else self.distrusted.add)(source)

    def trusts(self, policy: str) -> bool:
        """Whether the policy's head may decide and rank: a length-blind policy has none to distrust."""
        return head_of(policy) not in self.distrusted

    def estimate(self, request: Request) -> Prediction | None:
        """The request's length from the cheapest present and trusted signal (router.scheduling.signals),
        as its deciding policy (else the one asked) reads them."""
        policy = POLICIES[request.decided_by or request.policy]
        return self.signals.estimate(request, policy.told_length, policy.head is not None, self.distrusted)

    def rank(self, request: Request) -> None:
        """The request's estimate and its work in tokens as it waits now (None: length-blind)."""
        request.estimate = self.estimate(request)
        request.rank_tokens, request.on_prior = None, False
        if not (self.ranking.shortest_first and POLICIES[request.policy].ranks_queue):
            return
        if request.estimate is not None:
            request.rank_tokens = request.work_tokens(request.estimate.tokens(self.ranking.rank_by))
        elif POLICIES[request.decided_by].ranks_queue:
            request.rank_tokens, request.on_prior = request.work_tokens(self.ranking.prior_tokens), True

    def worth_predicting(self, request: Request, concordance: float | None,
                         mode: Mode | None = None) -> BudgetDecision:
        """Whether a waiting request's rank is worth its prediction: not when a cheap signal ranks it
        already, else as the predictor budget prices it against its queue and the requests decoding.
        `concordance`: its head's live rank concordance (None: not scored yet); `mode`: the
        request's own budget mode, over the configured one."""
        if request.estimate is not None and request.estimate.source != "head":
            return BudgetDecision("skipped_by_signal")
        queue = self.queues[request.pool]
        decoding = sum(q.inflight for q in self.queues.values())
        return self.budget.decide(request, max(0, len(queue) - 1), queue.slots or 1, decoding, concordance, mode)

    def admit(self, request: Request, now: float) -> Admission:
        """Dispatch now (the request holds a slot), wait (QUEUED), or FULL (refuse it)."""
        verdict = self.queues[request.pool].offer(request, now, request.rank_tokens, request.on_prior)
        request.queued = verdict is Admission.QUEUED
        if verdict is Admission.DISPATCH:
            request.dispatched_at = now
        return verdict

    def landed(self, request: Request, prediction: Prediction, now: float) -> None:
        """A prediction for the request: a waiting request ranks by it from now on. A dispatched
        one keeps the rank it left with (the record says what its dispatch rested on)."""
        request.prediction, request.predicted_at = prediction, now
        if request.decided_by is None or request.dispatched_at is not None:
            return
        self.rank(request)
        self.queues[request.pool].reprioritise(request, request.rank_tokens)  # if it still waits

    def release(self, pool: str, now: float) -> Request | None:
        """A request of `pool` is done with its slot: the next waiting one takes it (returned,
        already holding the slot), or the slot stays free (None)."""
        nxt = self.queues[pool].release(now)
        if nxt is not None:
            nxt.dispatched_at = now
        return nxt

    def withdraw(self, request: Request) -> bool:
        """A waiting request leaves without a slot; False if it was not waiting."""
        return self.queues[request.pool].withdraw(request)

    def priority(self, request: Request, max_model_len: int) -> int:
        """vLLM's `priority` inside the pool (lower first): the rank, or the pool's longest for
        length-blind policies, so their requests never jump ahead of predicted short ones."""
        if request.rank_tokens is not None:
            return round(request.rank_tokens)
        i = self.pools.names.index(request.chosen_pool)
        return round(self.pools.edges[i]) if i < len(self.pools.edges) else max_model_len
