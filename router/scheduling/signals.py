"""A request's length from the cheapest signal that is present and trusted: the one place that picks it.

Knowing a length pays more than predicting it (a held-out burst held to its `max_tokens` cut mean
JCT 9% against Ray Serve LLM's own app, where the live head on two shared cores gained nothing),
and the cheap signals cost no prefill. So a request's estimate is the first of:
1. `told`: the length a benchmark tells (oracle, ceiling), for the policies that read it;
2. `max_tokens`, where it is the length: `ignore_eos` (or `min_tokens` at the cap) runs to it, and
   a cap at or below the head's 10th training percentile (`short_cap_tokens`) stops nine natural
   answers in ten there (a request with `max_tokens: 4` needs no prediction);
3. `hint`: what the client says (`metadata.expected_output_tokens`, router.api.protocol);
4. `history`: the prompt's own past lengths (router.serving.history);
5. `head`: the prediction of the head the deciding policy reads.
A source that live quality distrusts (each is scored on its own, router.serving.live_quality) is
passed over; `told` and `max_tokens` are facts of the request and never distrusted. The scheduler
ranks by the estimate (router.scheduling.scheduler), the predictor budget skips the prediction of
a request that a cheap signal already ranks (router.scheduling.budget), and the simulator runs the
same code on its own records.

Every estimate is a `Prediction` with its `source`, capped at `max_tokens`, so clients see one
shape whatever ranked the request:
- `max_tokens`: every quantile is the cap (the answer ends there nine times in ten, or always);
- `hint`, `told`: one number, the median; p10 and p90 are None (nobody told its spread);
- `history`: the mean, with p10 and p90 from the spread as a normal approximation once it rests
  on two lengths or more;
- `head`: the head's own distribution.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from router.scheduling.pools import Pools
from router.scheduling.request import Prediction, Request, Source

SCORED = ("hint", "history")  # the cheap sources live quality scores, beside each head
_Z90 = 1.2816  # the standard normal's 90th percentile


@dataclass(frozen=True)
class Found:
    """A length and where it comes from; `spread` (a standard deviation) where the source knows
    one, `prediction` where it is the head's own distribution."""

    source: Source
    tokens: float
    spread: float | None = None
    prediction: Prediction | None = None


def first_signal(request: Request, told: bool = True, predicted: bool = True, distrusted: Set[str] = frozenset(),
                 short_cap_tokens: float = 0.0) -> Found | None:
    """The chain: the first present and trusted signal of a request (or a rollout's sample). The
    told length only where the deciding policy reads one (`told`), the head's prediction only where
    it reads a head (`predicted`). Uncapped: the caller caps at what it sends."""
    cap = request.max_tokens
    if told and request.told_tokens is not None:
        return Found("told", float(request.told_tokens))
    if cap is not None and (request.floor_tokens() >= cap or cap <= short_cap_tokens):
        return Found("max_tokens", float(cap), spread=0.0)
    for found in cheap_signals(request):
        if found.source not in distrusted:
            return found
    prediction = request.prediction
    if predicted and prediction is not None and prediction.head not in distrusted:
        return Found("head", prediction.expected_tokens, prediction=prediction)
    return None


def cheap_signals(request: Request) -> list[Found]:
    """The hint and the history, where the request has them, in the chain's order."""
    found = []
    if request.hint_tokens is not None:
        found.append(Found("hint", float(request.hint_tokens)))
    if (history := request.history) is not None:
        found.append(Found("history", history.mean_tokens, history.spread_tokens if history.count > 1 else None))
    return found


@dataclass(frozen=True)
class Signals:
    pools: Pools
    short_cap_tokens: float = 0.0  # a `max_tokens` at or below this is the request's length

    def estimate(self, request: Request, told: bool = False, predicted: bool = True,
                 distrusted: Set[str] = frozenset()) -> Prediction | None:
        """The chain's answer for the scheduler, as the estimate clients see: the head's own
        prediction, or one number described for the pools."""
        found = first_signal(request, told, predicted, distrusted, self.short_cap_tokens)
        if found is None or found.prediction is not None:
            return None if found is None else found.prediction
        return self._point(found, request.max_tokens)

    def scored(self, request: Request) -> list[tuple[str, Prediction]]:
        """What live quality scores when the request ends, by source (a head by its name), trusted
        or not: a distrusted source wins trust back on them."""
        signals = [(found.source, self._point(found, request.max_tokens)) for found in cheap_signals(request)]
        if request.prediction is not None and request.prediction.head is not None:
            signals.append((request.prediction.head, request.prediction))
        return signals

    def _point(self, found: Found, cap: int | None) -> Prediction:
        """One number as an estimate: capped, in the pool it falls in, and its p10 and p90 only
        where a spread is known."""

        def capped(x: float) -> float:
            x = max(0.0, float(x))
            return round(min(x, cap) if cap else x, 1)

        mid, spread = capped(found.tokens), found.spread
        low, high = (None, None) if spread is None else (capped(found.tokens - _Z90 * spread),
                                                          capped(found.tokens + _Z90 * spread))
        return Prediction(None, mid, {"p10": low, "p50": mid, "p90": high}, self.pools.pool_of(mid), None, found.source)
