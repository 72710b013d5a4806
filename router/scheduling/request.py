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


@dataclass(frozen=True)
class Prediction:
    """What the router knows of a request's length from a predictor head, described for the pools.

    Capped at the request's `max_tokens`: the real length cannot exceed it, so neither can what
    the router expects.
    """

    head: str
    expected_tokens: float
    quantiles: dict[str, float]  # "p10", "p50", "p90"
    pool: str  # the pool its output most probably falls in (router.scheduling.pools)
    pool_probabilities: dict[str, float]

    def tokens(self, statistic: Statistic) -> float:
        return self.expected_tokens if statistic == "mean" else self.quantiles[statistic]


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
    # The prediction, when it lands.
    sent_to_predictor: bool = False  # its prompt went to the predictor (a learning one keeps its features)
    prediction: Prediction | None = None
    prediction_failure: str | None = None  # why there is none (timeout, prompt_too_long, ...)
    predicted_at: float | None = None
    # The decision (router.scheduling.scheduler).
    pool: str | None = None  # where it is served, after spillover
    chosen_pool: str | None = None  # what the deciding policy picked
    decided_by: str | None = None  # the policy asked, or the fallback
    fallback: str | None = None  # why the policy asked could not decide
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
        """(observed length, censored) when the request ended by itself or at its cap, the label a
        learning predictor may use; None when the model was not free to choose its length
        (`ignore_eos`, `min_tokens`), it generated several sequences, or it did not finish.

        A request stopped by its `max_tokens` is censored: its natural length is at least that.
        """
        if (self.ignore_eos or self.min_tokens or self.outputs != 1 or self.error is not None
                or self.completion_tokens is None or self.finish_reason not in ("stop", "length")):
            return None
        return self.completion_tokens, self.finish_reason == "length"
