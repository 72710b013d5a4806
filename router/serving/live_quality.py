"""How good the predictions are on live traffic, and whether the router should still trust them.

A checkpoint's validation MAE says nothing about what users ask today. So every completed
request is scored against its real length for each signal it had, one LiveQuality per source (each
head, the clients' hints, the prompts' history: router.scheduling.signals): signed error
(bias), MAE, pool accuracy, and rank concordance, the share of request pairs the prediction
orders the same way as their real lengths (0.5: a coin toss). Concordance is what a shortest-
first queue lives on, so it is what the trust switch reads: when it stays below `floor` over a
full window the router stops using that source (a head's policy routes length-blind, by its
fallback; a distrusted hint or history no longer ranks), logs it and says so on /health; when it
recovers to `floor + margin` the source is trusted again. The hysteresis keeps a window hovering
at the floor from flapping. The predictor budget (router.scheduling.budget) reads a head's
concordance too, once it is `settled`: what ranking by the head is worth.

Concordance is kept incrementally: each new sample is compared with the window's others (O(window)),
and a sample leaving takes its pairs with it, so scoring costs no O(window^2) pass per request.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class _Sample:
    predicted: float
    actual: int
    pool_hit: bool


def _pair(a: _Sample, b: _Sample) -> tuple[float, int]:
    """(concordant credit, counted) of one pair: ties in the real length say nothing about order."""
    if a.actual == b.actual:
        return 0.0, 0
    if a.predicted == b.predicted:
        return 0.5, 1
    return float((a.predicted < b.predicted) == (a.actual < b.actual)), 1


class LiveQuality:
    def __init__(self, window: int = 200, floor: float = 0.55, margin: float = 0.03, min_samples: int = 50,
                 trusted: bool = True):
        """`trusted` False: the head must earn trust first (a cold start's learned head)."""
        self.window, self.floor, self.margin, self.min_samples = window, floor, margin, min_samples
        self.trusted = trusted
        self.switches = 0
        self.scored = 0
        self._samples: deque[_Sample] = deque()
        self._credit = 0.0
        self._pairs = 0

    def observe(self, predicted: float, actual: int, pool_hit: bool) -> bool:
        """Score one completed request; True when this flips the trust switch."""
        new = _Sample(predicted, actual, pool_hit)
        if len(self._samples) == self.window:
            old = self._samples.popleft()
            for other in self._samples:
                credit, counted = _pair(old, other)
                self._credit -= credit
                self._pairs -= counted
        for other in self._samples:
            credit, counted = _pair(new, other)
            self._credit += credit
            self._pairs += counted
        self._samples.append(new)
        self.scored += 1
        return self._update_trust()

    def concordance(self) -> float | None:
        return self._credit / self._pairs if self._pairs else None

    @property
    def settled(self) -> bool:
        """Scored on enough requests (`min_samples`) for its concordance to count."""
        return len(self._samples) >= self.min_samples

    def _update_trust(self) -> bool:
        c = self.concordance()
        if c is None or not self.settled:
            return False
        was = self.trusted
        if self.trusted and c < self.floor:
            self.trusted = False
        elif not self.trusted and c >= self.floor + self.margin:
            self.trusted = True
        if was != self.trusted:
            self.switches += 1
            return True
        return False

    def report(self) -> dict:
        s = self._samples
        n = len(s)
        return {
            "window": n, "scored": self.scored, "trusted": self.trusted, "switches": self.switches,
            "floor": self.floor,
            "concordance": None if self.concordance() is None else round(self.concordance(), 4),
            "mae_tokens": round(sum(abs(x.predicted - x.actual) for x in s) / n, 1) if n else None,
            "signed_error_tokens": round(sum(x.predicted - x.actual for x in s) / n, 1) if n else None,
            "pool_accuracy": round(sum(x.pool_hit for x in s) / n, 4) if n else None,
        }
