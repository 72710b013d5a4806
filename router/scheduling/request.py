"""One request and everything known about it, as it becomes known: the record the serving path shares.

The pipeline (router.serving.pipeline) fills it stage by stage: rendered, predicted, decided, admitted,
dispatched, streamed, finished. The simulator fills the same fields from its own clock, so the
scheduling decisions (router.scheduling.scheduler, router.scheduling.rollout_plans) read one object in both, and
a real run's records can be replayed field for field. It holds no asyncio or HTTP state: whatever
waits on a request (a future, a stream) belongs to the serving layer.

Times are seconds on the clock of whoever runs the request (the router replica's monotonic
clock, or the simulation's).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

Statistic = Literal["mean", "p50", "p90"]
# Where a request's length estimate comes from (router.scheduling.signals), cheapest first.
Source = Literal["told", "max_tokens", "hint", "history", "head"]
# Whether a waiting request was predicted for its rank, or why not (router.scheduling.budget).
Verdict = Literal["predicted", "skipped_by_budget", "skipped_by_signal"]
CUT = "cut"  # finish_reason of a sample a first-k rollout stopped on purpose (router.scheduling.rollout_plans)


@dataclass(frozen=True)
class Prediction:
    """What the router knows of a request's length from one signal, described for the pools: a
    predictor head's distribution, or a cheaper signal's point (router.scheduling.signals).

    Capped at the request's `max_tokens`: the real length cannot exceed it, so neither can what
    the router expects. A quantile the signal cannot tell (a client's hint is one number) is None.
    """

    head: str | None  # the head that predicted it; None for the other sources
    expected_tokens: float
    quantiles: dict[str, float | None]  # "p10", "p50", "p90"
    pool: str  # the pool its output most probably falls in (router.scheduling.pools)
    pool_probabilities: dict[str, float] | None  # None: a point, whose spread the signal does not tell
    source: Source = "head"

    def tokens(self, statistic: Statistic) -> float:
        """The statistic asked for, or the expectation where the signal cannot tell it."""
        value = None if statistic == "mean" else self.quantiles.get(statistic)
        return self.expected_tokens if value is None else value


@dataclass(frozen=True)
class HistoryStats:
    """What a prompt's own earlier samples say about its next length (router.serving.history).

    RL sends the same prompts epoch after epoch, and a prompt's own last lengths predict its next
    ones better than a head reading the prompt (RhymeRL). A censored length (stopped by
    `max_tokens`, cut by a first-k rollout, paused as partial) only says "at least this long", so
    the mean and the spread are Kaplan-Meier estimates (router.scheduling.length_stats), restricted
    to the longest length seen: a prompt whose every sample was cut is at least as long as its
    longest cut, never as short as its average cut.
    """

    mean_tokens: float
    spread_tokens: float  # standard deviation
    count: int  # lengths it rests on, censored ones included


@dataclass(frozen=True)
class BudgetDecision:
    """Whether a waiting request's rank was worth its prediction (router.scheduling.budget), with
    the figures the budget weighed, in seconds of requests' time (None: not priced)."""

    verdict: Verdict
    gain_s: float | None = None  # the waiting the ranking was expected to save
    cost_s: float | None = None  # what its prefill was expected to take from the requests decoding


@dataclass(eq=False)  # identity: two requests are never the same request
class Request:
    id: str
    policy: str  # the policy asked for (the configured one, or a benchmark's)
    arrival: float = 0.0
    client_id: str | None = None  # the client's own name for it (X-Request-Id), echoed back and logged
    # What the request fixes about itself (the body).
    prompt_tokens: int | None = None  # the longest prompt; None when it could not be rendered
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    outputs: int = 1  # n x prompts: the sequences it generates
    # What a benchmark tells (benchmark headers, a rollout's known lengths).
    told_tokens: int | None = None  # the true length (oracle) or the prompt's sample median (ceiling)
    target_pool: str | None = None  # a pool planned beforehand (batch replays): no decision
    family: Hashable | None = None  # the prompt a rollout sample belongs to (its siblings share it)
    # The prompt's own past (router.serving.history), looked up after render.
    prompt_key: str | None = None  # its history key: its length is recorded under it when it ends
    history: HistoryStats | None = None  # None: a prompt not seen before (or history off)
    resumed_tokens: int = 0  # a continued partial sample: tokens it generated before this call
    # What the client says of its length (`metadata.expected_output_tokens`, router.api.protocol).
    hint_tokens: int | None = None
    # The prediction, when it lands.
    sent_to_predictor: bool = False  # its prompt went to the predictor (a learning one keeps its features)
    prediction: Prediction | None = None
    prediction_failure: str | None = None  # why there is none (timeout, prompt_too_long, ...)
    predicted_at: float | None = None
    budget: BudgetDecision | None = None  # a waiting request's: was it worth predicting (None: not asked)
    # The decision (router.scheduling.scheduler).
    pool: str | None = None  # where it is served, after spillover
    chosen_pool: str | None = None  # what the deciding policy picked
    decided_by: str | None = None  # the policy asked, or the fallback
    fallback: str | None = None  # why the policy asked could not decide
    estimate: Prediction | None = None  # the length it ranks by and its source (router.scheduling.signals)
    rank_tokens: float | None = None  # its work in tokens while it waits; None: arrival order
    on_prior: bool = False  # rank_tokens rest on the prior: its own length is not known (yet)
    decided_at: float | None = None
    # A slot and a replica.
    queued: bool = False  # it waited for a slot rather than dispatching at once
    dispatched_at: float | None = None
    pinned: str | None = None  # the replica a rollout plan asked for
    replica: str | None = None  # where Ray's router sent it
    group: int | None = None  # a padding rollout's group
    priority: int | None = None  # what vLLM scheduled it by inside the engine (lower first)
    # Progress and end.
    streamed: int = 0  # output chunks relayed so far
    first_token_at: float | None = None
    finished_at: float | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None  # "stop", "length" (hit max_tokens), ...
    error: str | None = None

    def floor_tokens(self) -> int:
        """Tokens each sequence surely generates whatever the model would say."""
        return (self.max_tokens or 0) if self.ignore_eos else self.min_tokens

    def sequence_tokens(self, natural: float) -> float:
        """One sequence's length from its natural (predicted or true) length: at least what the
        request forces (`min_tokens`, or the cap with `ignore_eos`), at most `max_tokens`."""
        tokens = max(natural, self.floor_tokens())
        return min(tokens, self.max_tokens) if self.max_tokens else tokens

    def work_tokens(self, natural: float) -> float:
        """What the request costs the engine: every sequence it generates. A client cannot pass
        for short with `ignore_eos` or `min_tokens`, nor for one request with n = 64."""
        return self.sequence_tokens(natural) * max(1, self.outputs)

    @property
    def spilled_from(self) -> str | None:
        return self.chosen_pool if self.pool != self.chosen_pool else None

    def natural_length(self) -> tuple[int, bool] | None:
        """(observed length, censored) when the request ended by itself, at its cap or was cut on
        purpose, the label a learning predictor and the history may use; None when the model was
        not free to choose its length (`ignore_eos`, `min_tokens`), it generated several
        sequences, or it failed.

        Only a request that stopped by itself gives an exact length. One stopped by its
        `max_tokens` (or a rollout's token budget) or cut by a first-k rollout (`finish_reason`
        "cut") is censored: its natural length is at least what it generated. A continued partial
        sample's length counts what it generated before (`resumed_tokens`).
        """
        if (self.ignore_eos or self.min_tokens or self.outputs != 1 or self.error is not None
                or self.completion_tokens is None or self.finish_reason not in ("stop", "length", CUT)):
            return None
        return self.resumed_tokens + self.completion_tokens, self.finish_reason != "stop"
