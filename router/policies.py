"""Which pool a request goes to. The router asks a policy; policies know nothing of HTTP.

Every policy answers `choose(job) -> pool name`. A policy that lacks what it needs (no
prediction because the predictor failed, no oracle header) raises NoDecision, and the router
asks its fallback policy instead, so a missing input never fails a request. Spillover is not a
policy's business: the router applies it to whatever pool the policy picked.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from router.length_bins import PoolBins
from router.pool_load import PoolLoad


class NoDecision(Exception):
    """The policy cannot decide for this request; the reason becomes the fallback's label."""


@dataclass(frozen=True)
class Job:
    """What policies may look at: lengths, never the HTTP request."""

    prompt_tokens: int | None = None  # None when the prompt could not be tokenized
    prediction: dict | None = None  # the predictor's answer; its `bin` is a pool name
    prediction_failure: str | None = None  # why there is no prediction (timeout, error, ...)
    true_tokens: int | None = None  # benchmarks only: the real output length (oracle)


@dataclass
class PolicyContext:
    pools: list[str]
    output_bins: PoolBins  # predicted / true output tokens -> pool
    input_edges: list[int]  # prompt tokens -> pool (input_length)
    replicas: dict[str, int]  # replicas per pool, for ray_default
    load: PoolLoad
    rng: random.Random = field(default_factory=random.Random)


class RoundRobin:
    """Length-blind baseline: pools take turns."""

    def __init__(self, ctx: PolicyContext):
        self._cycle = itertools.cycle(ctx.pools)

    def choose(self, job: Job) -> str:
        return next(self._cycle)


class PowerOfTwoChoices:
    """Ray Serve's default replica choice, lifted over all pools' replicas.

    Ray's router samples two replicas of one deployment and takes the less busy. Pools are
    separate deployments, so this samples two replicas from all pools (a pool with more replicas
    is drawn more often), compares their pools' in-flight requests per replica, and lets Ray's own
    power-of-two router pick the replica inside the winning pool.
    """

    def __init__(self, ctx: PolicyContext):
        self._slots = [pool for pool in ctx.pools for _ in range(max(1, ctx.replicas.get(pool, 1)))]
        self._replicas = ctx.replicas
        self._load = ctx.load
        self._rng = ctx.rng

    def choose(self, job: Job) -> str:
        if len(self._slots) == 1:
            return self._slots[0]
        a, b = self._rng.sample(self._slots, 2)
        return min((a, b), key=lambda p: self._load.inflight(p) / max(1, self._replicas.get(p, 1)))


class InputLength:
    """Prompt-length buckets, as SGLang's router offers: no predictor needed."""

    def __init__(self, ctx: PolicyContext):
        self._bins = PoolBins(tuple(ctx.pools), tuple(ctx.input_edges))

    def choose(self, job: Job) -> str:
        if job.prompt_tokens is None:
            raise NoDecision("prompt_not_tokenized")
        return self._bins.pool_of(job.prompt_tokens)


class PredictedBin:
    """ESTP or EGTP: the pool the predictor's distribution puts the most mass on."""

    def __init__(self, ctx: PolicyContext):
        pass

    def choose(self, job: Job) -> str:
        if job.prediction is None:
            raise NoDecision(job.prediction_failure or "no_prediction")
        return job.prediction["bin"]


class Oracle:
    """The true output length from the request (benchmarks): the limit of any predictor."""

    def __init__(self, ctx: PolicyContext):
        self._bins = ctx.output_bins

    def choose(self, job: Job) -> str:
        if job.true_tokens is None:
            raise NoDecision("no_oracle_header")
        return self._bins.pool_of(job.true_tokens)


class PolicyChain:
    """The policies a router consults, in order: the one in charge, the configured fallback, then
    round-robin (input_length cannot decide without a tokenized prompt). The router and the
    simulator decide through this one object, so they cannot drift apart."""

    def __init__(self, ctx: PolicyContext, names: Iterable[str], fallback: str):
        self.policies = {name: POLICIES[name](ctx) for name in names}
        self.fallback_name = fallback
        self._fallback = POLICIES[fallback](ctx)
        self._last_resort = RoundRobin(ctx)

    def choose(self, job: Job, policy: str) -> tuple[str, str, str | None]:
        """(pool, deciding policy, why `policy` could not decide or None)."""
        try:
            return self.policies[policy].choose(job), policy, None
        except NoDecision as e:
            reason = str(e)
        try:
            return self._fallback.choose(job), self.fallback_name, reason
        except NoDecision:
            return self._last_resort.choose(job), "round_robin", reason


def priority(job: Job, pool: str, policy: str, bins: PoolBins, max_model_len: int, cap: int | None) -> int:
    """What vLLM schedules on inside a pool (lower first): predicted tokens (the true ones for the
    oracle); unpredicted requests count as their pool's longest, so they never jump ahead of
    predicted short ones."""
    if policy == "oracle" and job.true_tokens is not None:
        tokens = job.true_tokens
    elif job.prediction is not None:
        tokens = job.prediction["expected_tokens"]
    else:
        i = bins.names.index(pool)
        tokens = bins.edges[i] if i < len(bins.edges) else max_model_len
    return round(min(tokens, cap) if cap else tokens)


POLICIES = {
    "round_robin": RoundRobin,
    "ray_default": PowerOfTwoChoices,
    "input_length": InputLength,
    "estp": PredictedBin,
    "egtp": PredictedBin,
    "oracle": Oracle,
}
# Policies that route on the predictor's answer; the others may serve as the fallback.
PREDICTED = frozenset({"estp", "egtp"})
