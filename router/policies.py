"""Which pool a request goes to, and what it ranks by while it waits. Policies know nothing of HTTP.

Every policy answers `choose(job) -> pool name`. A policy that lacks what it needs (no
prediction because the predictor failed, no oracle header) raises NoDecision, and the router
asks its fallback policy instead, so a missing input never fails a request. Spillover is not a
policy's business: `Decider` applies it to whatever pool the policy picked, and ranks the request
for the pool's queue (router.admission). The ingress and the simulator both decide through a
`Decider`, so the two cannot drift apart.

Two families:
- pool policies (`estp`, `egtp`, `last`, `oracle`, `input_length`): the paper's length-homogeneous pools;
  the predicted ones need the prediction before they can pick a pool (on the critical path);
- work policies (`last_work`, `estp_work`, `egtp_work`, `oracle_work`, `ceiling`): pick a pool as Ray does
  (power of two choices; one pool in the default config) and use the length only to rank waiting
  requests shortest-first, so the prediction can arrive while the request waits.
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
    prediction: dict | None = None  # the predictor's answer, described for the pools (`bin` is a pool name)
    prediction_failure: str | None = None  # why there is no prediction (timeout, error, ...)
    true_tokens: int | None = None  # benchmarks only: the real output length (oracle) or a prompt's median (ceiling)
    # What the request itself fixes about its length (see `sequence_tokens`).
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    outputs: int = 1  # n x prompts: sequences the request generates

    def floor_tokens(self) -> int:
        """Tokens each sequence surely generates whatever the model would say."""
        return (self.max_tokens or 0) if self.ignore_eos else self.min_tokens


def sequence_tokens(job: Job, natural: float) -> float:
    """One sequence's length from its natural (predicted or true) length: at least what the
    request forces (`min_tokens`, or the cap with `ignore_eos`), at most `max_tokens`."""
    tokens = max(natural, job.floor_tokens())
    return min(tokens, job.max_tokens) if job.max_tokens else tokens


def work_tokens(job: Job, natural: float) -> float:
    """What a request costs the engine: every sequence it generates. A client cannot pass for
    short with `ignore_eos` or `min_tokens`, nor for one request with n = 64."""
    return sequence_tokens(job, natural) * max(1, job.outputs)


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

    ranks_queue = False

    def __init__(self, ctx: PolicyContext):
        self._cycle = itertools.cycle(ctx.pools)

    def choose(self, job: Job) -> str:
        return next(self._cycle)


class PowerOfTwoChoices:
    """Ray Serve's default replica choice, lifted over all pools' replicas.

    Ray's router samples two replicas of one deployment and takes the less busy. Pools are
    separate deployments, so this samples two replicas from all pools (a pool with more replicas
    is drawn more often), compares their pools' in-flight requests per replica, and lets the pool's
    replica router pick the replica inside the winning pool. With one pool it is the pool's FIFO
    queue and its replica router (fewest requests; with two replicas the same choice as Ray's
    power of two).
    """

    ranks_queue = False

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

    ranks_queue = False

    def __init__(self, ctx: PolicyContext):
        self._bins = PoolBins(tuple(ctx.pools), tuple(ctx.input_edges))

    def choose(self, job: Job) -> str:
        if job.prompt_tokens is None:
            raise NoDecision("prompt_not_tokenized")
        return self._bins.pool_of(job.prompt_tokens)


class PredictedBin:
    """ESTP or EGTP: the pool the predictor's distribution puts the most mass on."""

    ranks_queue = True

    def __init__(self, ctx: PolicyContext):
        self._bins = ctx.output_bins

    def choose(self, job: Job) -> str:
        if job.prediction is None:
            raise NoDecision(job.prediction_failure or "no_prediction")
        return job.prediction["bin"]


class Oracle:
    """The true output length from the request (benchmarks): the limit of any predictor."""

    ranks_queue = True

    def __init__(self, ctx: PolicyContext):
        self._bins = ctx.output_bins

    def choose(self, job: Job) -> str:
        if job.true_tokens is None:
            raise NoDecision("no_oracle_header")
        return self._bins.pool_of(sequence_tokens(job, job.true_tokens))


class RankedWork(PowerOfTwoChoices):
    """Ray's pool choice; the length only ranks the request while it waits (shortest first).

    It never needs the length to decide, so it never falls back: a request without a prediction
    (not yet arrived, failed) ranks at the queue's prior, a typical length.
    """

    ranks_queue = True


class PolicyChain:
    """The policies a router consults, in order: the one in charge, the configured fallback, then
    round-robin (input_length cannot decide without a tokenized prompt)."""

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


POLICIES = {
    "round_robin": RoundRobin,
    "ray_default": PowerOfTwoChoices,
    "input_length": InputLength,
    "estp": PredictedBin,
    "egtp": PredictedBin,
    "oracle": Oracle,
    "last": PredictedBin,
    "estp_work": RankedWork,
    "egtp_work": RankedWork,
    "last_work": RankedWork,
    "oracle_work": RankedWork,
    "ceiling": RankedWork,
}
# Policies that read the predictor's answer (the head named before "_"); the others may serve as the fallback.
PREDICTED = frozenset({"estp", "egtp", "last", "estp_work", "egtp_work", "last_work"})
# Policies that read the length a benchmark supplies (X-True-Output-Tokens): the true one, or each
# prompt's sample median for the ceiling (the limit of any prompt-only predictor).
KNOWN_LENGTH = frozenset({"oracle", "oracle_work", "ceiling"})
WORK = frozenset({"estp_work", "egtp_work", "last_work", "oracle_work", "ceiling"})


# The predictor's heads: ESTP and EGTP (the paper's), and the last token's state (an ensemble of
# five), which the cross-validated accuracy benchmark found best on the embedded model.
HEADS = frozenset({"estp", "egtp", "last"})
DEFAULT_HEAD = "last"


def head_of(policy: str) -> str | None:
    """The predictor head a policy reads (estp_work reads ESTP's), or None if it reads none."""
    return policy.removesuffix("_work") if policy in PREDICTED else None
