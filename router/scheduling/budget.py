"""Whether a waiting request's prediction can pay for its prefill: the predictor budget.

A prediction made while a request waits only reorders the queue, and its prefill runs where the
engines decode: on two CPU cores the default head's live ranking cost about what it bought. So a
waiting request is predicted only when what ranking it is expected to save exceeds what its
prefill is expected to take, both in seconds of requests' time:

    cost = prompt tokens read x prefill s/token x share of the engines' compute x requests decoding
    gain = others waiting / slots x (2 concordance - 1) x spread / 2 x slot s/token

- cost: the predictor's prefill of the prompt's tail it reads (`predictor.truncate_prompt_tokens`)
  at its measured speed, times the share of the engines' compute it takes (1 on a CPU, where it
  shares their cores; 0 with a GPU share of its own, `predictor.gpus > 0`: every waiting request
  is then predicted), times each request decoding meanwhile, all slowed by it.
- gain: served shortest first, the shorter of two requests goes ahead, which saves half their
  difference in length against a blind order; a head whose live rank concordance is c orders a
  pair right c of the time and wrong 1 - c, so it saves (2c - 1) of that. The request pairs with
  each other request waiting in its queue, each delay shared out over the pool's slots. The
  spread is the mean difference between two lengths the cheap signals leave unexplained (the
  head's training lengths, capped at the request's `max_tokens`, times its outputs; a request a
  cheap signal ranks is not predicted at all, router.scheduling.signals), turned into seconds at
  the rate a slot serves a token.

Both speeds are measured, so the budget follows the machine: the predictor times a prefill at
its start and reports each batch's since (the router keeps a `MovingRate` of them), and finished
requests give a slot's seconds per token. Until both are known a prediction cannot be priced and
is made. `always` predicts every waiting request, `never` none (the cheap signals alone rank).
The router and the simulator (with its own clock and speeds) decide with this same object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from router.scheduling.request import BudgetDecision, Request

Mode = Literal["auto", "always", "never"]


@dataclass
class MovingRate:
    """Seconds per token as a moving estimate weighted by tokens: a one-token sample hardly moves it."""

    weight: float = 0.2  # of each new sample
    seconds: float = 0.0
    tokens: float = 0.0

    def observe(self, seconds: float, tokens: float) -> None:
        if tokens <= 0:
            return
        if self.tokens == 0:
            self.seconds, self.tokens = seconds, tokens
            return
        self.seconds += self.weight * (seconds - self.seconds)
        self.tokens += self.weight * (tokens - self.tokens)

    @property
    def per_token(self) -> float | None:
        return self.seconds / self.tokens if self.tokens else None


@dataclass(frozen=True)
class LengthSpread:
    """How far apart two requests' lengths are expected to be, from evenly spaced quantiles of the
    lengths (the head's training lengths)."""

    quantiles: tuple[float, ...] = ()

    def mean_difference(self, cap: float | None = None) -> float:
        """E|X - X'| of two lengths drawn from the quantiles, each capped at `cap`."""
        xs = sorted(min(q, cap) if cap else q for q in self.quantiles)
        n = len(xs)
        return 2.0 * sum((2 * i - n + 1) * x for i, x in enumerate(xs)) / (n * n) if n > 1 else 0.0


@dataclass
class PredictorBudget:
    mode: Mode = "auto"
    share: float = 1.0  # of the engines' compute a prefill takes: 1 on shared CPU cores, 0 on a GPU share of its own
    read_tokens: int | None = None  # the predictor reads a prompt's last N tokens (None: all of it)
    spread: LengthSpread = LengthSpread()
    unscored_concordance: float = 0.58  # a head's before live quality has scored it (the trust switch's floor + margin)
    prefill: MovingRate = field(default_factory=MovingRate)  # the predictor's seconds per prompt token
    slot: MovingRate = field(default_factory=MovingRate)  # a slot's seconds per output token

    def served(self, request: Request) -> None:
        """A finished request: how long it held its slot per token it generated."""
        if (request.dispatched_at is not None and request.finished_at is not None and request.completion_tokens
                and request.outputs == 1 and request.error is None):
            self.slot.observe(request.finished_at - request.dispatched_at, request.completion_tokens)

    def report(self) -> dict:
        per_token = {"prefill_s_per_token": self.prefill.per_token, "slot_s_per_token": self.slot.per_token}
        return {"mode": self.mode, "share": self.share,
                **{k: None if v is None else round(v, 6) for k, v in per_token.items()}}

    def decide(self, request: Request, waiting: int, slots: int, decoding: int, concordance: float | None,
               mode: Mode | None = None) -> BudgetDecision:
        """Predict `request` (waiting with `waiting` others for `slots` slots while `decoding`
        requests decode) or skip it; `concordance`: its head's live one (None: not scored yet);
        `mode`: this request's, over the configured one."""
        mode = mode or self.mode
        if mode != "auto":
            return BudgetDecision("predicted" if mode == "always" else "skipped_by_budget")
        if self.share == 0:
            return BudgetDecision("predicted", cost_s=0.0)
        prefill, slot = self.prefill.per_token, self.slot.per_token
        if prefill is None or slot is None:
            return BudgetDecision("predicted")
        tokens = min(request.prompt_tokens or 0, self.read_tokens or request.prompt_tokens or 0)
        cost = tokens * prefill * self.share * decoding
        c = self.unscored_concordance if concordance is None else concordance
        spread = self.spread.mean_difference(request.max_tokens) * max(1, request.outputs)
        gain = waiting / max(1, slots) * max(0.0, 2 * c - 1) * spread / 2 * slot
        return BudgetDecision("skipped_by_budget" if cost > gain else "predicted", round(gain, 4), round(cost, 4))
