"""Which pool a request goes to. Policies know nothing of HTTP, asyncio or Ray.

Every policy answers `choose(request) -> pool name`. A policy that lacks what it needs (no
prediction because the predictor failed, no told length) raises NoDecision, and the scheduler
asks its fallback policy instead, so a missing input never fails a request. Spillover and the
rank a request waits with are the scheduler's business (router.scheduling.scheduler), not a policy's.

Two families, one table (`POLICIES`):
- pool policies (`estp`, `egtp`, `last`, `oracle`, `input_length`): the paper's length-homogeneous
  pools; the predicted ones pick the pool of the request's estimate, the cheapest present and
  trusted signal (router.scheduling.signals), so they need the prediction before they can pick a
  pool (on the critical path) only where no cheaper signal gives the length;
- work policies (`last_work`, `estp_work`, `egtp_work`, `oracle_work`, `ceiling`): pick a pool as
  Ray does (one pool in the default config) and use the length only to rank waiting requests
  shortest-first, so the prediction can land while the request waits.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from router.scheduling.pools import Pools
from router.scheduling.request import Prediction, Request


class NoDecision(Exception):
    """The policy cannot decide for this request; the reason becomes the fallback's label."""


@dataclass
class PolicyContext:
    pools: Pools  # predicted / told output tokens -> pool
    input_edges: list[int]  # prompt tokens -> pool (input_length)
    replicas: dict[str, int]  # replicas per pool, for ray_default
    inflight: Callable[[str], int]  # requests a pool holds now (the scheduler's count)
    estimate: Callable[[Request], Prediction | None]  # the signal chain's length, as the scheduler trusts it
    rng: random.Random = field(default_factory=random.Random)


class RoundRobin:
    """Length-blind baseline: pools take turns."""

    def __init__(self, ctx: PolicyContext):
        self._cycle = itertools.cycle(ctx.pools.names)

    def choose(self, request: Request) -> str:
        return next(self._cycle)


class PowerOfTwoChoices:
    """Ray Serve's default replica choice, lifted over all pools' replicas.

    Ray's router samples two replicas of one deployment and takes the less busy. Pools are
    separate deployments, so this samples two replicas from all pools (a pool with more replicas
    is drawn more often), compares their pools' in-flight requests per replica, and lets the pool's
    replica router pick the replica inside the winning pool. With one pool it is that pool.
    """

    def __init__(self, ctx: PolicyContext):
        self._slots = [pool for pool in ctx.pools.names for _ in range(max(1, ctx.replicas.get(pool, 1)))]
        self._replicas = ctx.replicas
        self._inflight = ctx.inflight
        self._rng = ctx.rng

    def choose(self, request: Request) -> str:
        if len(set(self._slots)) == 1:
            return self._slots[0]
        a, b = self._rng.sample(self._slots, 2)
        return min((a, b), key=lambda p: self._inflight(p) / max(1, self._replicas.get(p, 1)))


class InputLength:
    """Prompt-length buckets, as SGLang's router offers: no predictor needed."""

    def __init__(self, ctx: PolicyContext):
        self._buckets = Pools(ctx.pools.names, tuple(ctx.input_edges))

    def choose(self, request: Request) -> str:
        if request.prompt_tokens is None:
            raise NoDecision("prompt_not_tokenized")
        return self._buckets.pool_of(request.prompt_tokens)


class PredictedPool:
    """ESTP, EGTP or the last-token head: the pool of the request's estimate. That is the head's
    (the pool its distribution puts the most mass on) unless a cheaper signal gives the length: a
    request whose `max_tokens` is its length, or whose client hints one, is pooled by that, as it
    is ranked, and needs no prefill before it can go."""

    def __init__(self, ctx: PolicyContext):
        self._estimate = ctx.estimate

    def choose(self, request: Request) -> str:
        estimate = self._estimate(request)
        if estimate is None:
            raise NoDecision(request.prediction_failure or "no_prediction")
        return estimate.pool


class Oracle:
    """The length a benchmark tells (the true one): the limit of any predictor."""

    def __init__(self, ctx: PolicyContext):
        self._pools = ctx.pools

    def choose(self, request: Request) -> str:
        if request.told_tokens is None:
            raise NoDecision("no_oracle_header")
        return self._pools.pool_of(request.sequence_tokens(request.told_tokens))


Family = Literal["blind", "pool", "work"]


@dataclass(frozen=True)
class Policy:
    """One routing policy: how it picks a pool, and what length it reads.

    `blind` policies read no length; `pool` policies pick a pool by the length; `work` policies
    pick a pool as Ray does and rank waiting requests by the length. Every policy that reads a
    length also ranks its waiting requests by it.
    """

    chooser: Callable[[PolicyContext], object]
    family: Family = "blind"
    head: str | None = None  # the predictor head it reads
    told_length: bool = False  # it reads the length a benchmark tells (X-True-Output-Tokens)

    @property
    def ranks_queue(self) -> bool:
        return self.family != "blind"

    @property
    def predicts_pool(self) -> bool:
        """It needs the prediction before it can pick a pool."""
        return self.family == "pool" and self.head is not None


POLICIES: dict[str, Policy] = {
    "round_robin": Policy(RoundRobin),
    "ray_default": Policy(PowerOfTwoChoices),
    "input_length": Policy(InputLength),
    "estp": Policy(PredictedPool, "pool", head="estp"),
    "egtp": Policy(PredictedPool, "pool", head="egtp"),
    "last": Policy(PredictedPool, "pool", head="last"),
    "oracle": Policy(Oracle, "pool", told_length=True),
    "estp_work": Policy(PowerOfTwoChoices, "work", head="estp"),
    "egtp_work": Policy(PowerOfTwoChoices, "work", head="egtp"),
    "last_work": Policy(PowerOfTwoChoices, "work", head="last"),
    "early_work": Policy(PowerOfTwoChoices, "work", head="early"),
    "oracle_work": Policy(PowerOfTwoChoices, "work", told_length=True),
    "ceiling": Policy(PowerOfTwoChoices, "work", told_length=True),
}
# Length-blind policies that may stand in when the one asked cannot decide.
FALLBACKS = ("input_length", "round_robin", "ray_default")
# The predictor's heads: ESTP and EGTP (the paper's), the last token's state (an ensemble of five),
# which the cross-validated accuracy benchmark found best on the embedded model, and the same at
# layer 4 of 30 (`early`), whose prefill stops there: a seventh of the cost, for CPUs.
HEADS = frozenset(p.head for p in POLICIES.values() if p.head)
DEFAULT_HEAD = "last"


def head_of(policy: str) -> str | None:
    """The predictor head a policy reads (estp_work reads ESTP's), or None if it reads none."""
    return POLICIES[policy].head


class PolicyChain:
    """The policies a scheduler consults, in order: the one asked, the configured fallback, then
    round-robin (input_length cannot decide without a tokenized prompt)."""

    def __init__(self, ctx: PolicyContext, names: Iterable[str], fallback: str):
        self.policies = {name: POLICIES[name].chooser(ctx) for name in names}
        self.fallback_name = fallback
        self._fallback = POLICIES[fallback].chooser(ctx)
        self._last_resort = RoundRobin(ctx)

    def choose(self, request: Request, policy: str) -> tuple[str, str, str | None]:
        """(pool, deciding policy, why `policy` could not decide or None)."""
        try:
            return self.policies[policy].choose(request), policy, None
        except NoDecision as e:
            reason = str(e)
        return self.fall_back(request, reason)

    def fall_back(self, request: Request, reason: str) -> tuple[str, str, str]:
        try:
            return self._fallback.choose(request), self.fallback_name, reason
        except NoDecision:
            return self._last_resort.choose(request), "round_robin", reason

