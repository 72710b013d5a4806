"""Length pools as ranges of output tokens, and how a predicted length distribution maps onto them.

A request goes to the pool its output most probably falls in: the mass of each pool's range
under the predicted distribution, not the pool that holds the expected length. Expected lengths
regress towards the mean (an uncertain prediction lands in the middle pool whatever the prompt),
while the mass per pool still separates "surely short" from "maybe long".

`max_tokens` caps the real length, so it caps the prediction too: a request limited to 16 tokens
is short whatever the model would like to say. Inside a head bin lengths are taken as spread
uniformly, as `LengthBins.quantile` does.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from predictor.head import LengthBins, LengthPrediction


def _cdf(bins: LengthBins, probs: list[float], x: float) -> float:
    """P(length <= x) under the head's distribution."""
    total = 0.0
    for lo, hi, p in zip(bins.edges, bins.edges[1:], probs):
        if x >= hi:
            total += p
        elif x > lo:
            total += p * (x - lo) / (hi - lo)
    return total


def _capped_mean(bins: LengthBins, probs: list[float], cap: float) -> float:
    """E[min(length, cap)]: the head's bin centres below the cap, the cap above it."""
    total = 0.0
    for lo, hi, centre, p in zip(bins.edges, bins.edges[1:], bins.centres, probs):
        if hi <= cap:
            total += p * centre
        elif lo >= cap:
            total += p * cap
        else:  # the cap cuts this bin: uniform below it, the cap itself above
            below = (cap - lo) / (hi - lo)
            total += p * (below * (lo + cap) / 2 + (1 - below) * cap)
    return total


def training_quantile(bins: LengthBins, q: float) -> float:
    """The q-quantile of the lengths the head was trained on.

    The head's bins are quantile bins of the training lengths (about 1/K of them each), so the
    q-quantile lies a fraction of the way through bin floor(q * K).
    """
    position = q * bins.k
    k = min(int(position), bins.k - 1)
    lo, hi = bins.edges[k], bins.edges[k + 1]
    return lo + (position - k) * (hi - lo)


def survival(bins: LengthBins, probs: list[float], k: float) -> float:
    """P(length > k)."""
    return max(0.0, 1.0 - _cdf(bins, probs, k))


def _excess(lo: float, hi: float, k: float, cap: float) -> float:
    """E[(min(U, cap) - k)+] for U uniform on (lo, hi]."""
    total = 0.0
    a, b = max(lo, k), min(hi, cap)
    if a < b:
        total += ((b - k) ** 2 - (a - k) ** 2) / 2
    if hi > cap and cap > k:
        total += (hi - max(lo, cap)) * (cap - k)
    return total / (hi - lo)


def expected_remaining(bins: LengthBins, probs: list[float], generated: int, cap: float | None = None) -> float:
    """E[min(L, cap) - k | L > k]: what is left of a sequence that has generated k tokens.

    The head's distribution conditioned on the sequence still running, so a request re-estimates
    itself as it streams with no second prefill. A sequence that has outlived every bin (the head
    gave no mass beyond k) counts as one token from its end.
    """
    cap = bins.max_tokens if cap is None else cap
    alive = survival(bins, probs, generated)
    if alive <= 1e-9 or generated >= cap:
        return 1.0
    excess = sum(p * _excess(lo, hi, generated, cap) for lo, hi, p in zip(bins.edges, bins.edges[1:], probs) if p)
    return max(1.0, excess / alive)


def still_running(bins: LengthBins, probs: list[float], generated: int, horizon: float) -> float:
    """P(L > k + horizon | L > k): the chance a sequence is still decoding `horizon` tokens from now."""
    alive = survival(bins, probs, generated)
    return 0.0 if alive <= 1e-9 else min(1.0, survival(bins, probs, generated + horizon) / alive)


@dataclass(frozen=True)
class PoolBins:
    """Pool i takes outputs in (edges[i-1], edges[i]] tokens; the last pool is open-ended."""

    names: tuple[str, ...]
    edges: tuple[float, ...]

    def __post_init__(self):
        if len(self.edges) != len(self.names) - 1:
            raise ValueError(f"{len(self.names)} pools need {len(self.names) - 1} edges, got {list(self.edges)}")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:])) or (self.edges and self.edges[0] <= 0):
            raise ValueError(f"pool edges must be positive and increasing: {list(self.edges)}")

    @classmethod
    def from_quantiles(cls, names: list[str], bins: LengthBins) -> "PoolBins":
        """Equal shares of the training lengths per pool."""
        return cls(tuple(names), tuple(float(round(training_quantile(bins, i / len(names))))
                                       for i in range(1, len(names))))

    def pool_of(self, tokens: float) -> str:
        return self.names[bisect.bisect_left(self.edges, tokens)]

    def masses(self, bins: LengthBins, probs: list[float], cap: float | None = None) -> dict[str, float]:
        """Probability of each pool; with a cap, lengths beyond it count as the cap."""
        def capped_cdf(x: float) -> float:
            return 1.0 if cap is not None and x >= cap else _cdf(bins, probs, x)

        cuts = [0.0, *(capped_cdf(e) for e in self.edges), 1.0]
        return {name: max(0.0, b - a) for name, a, b in zip(self.names, cuts, cuts[1:])}

    def describe(self, prediction: LengthPrediction, bins: LengthBins, cap: int | None) -> dict:
        """The prediction as the API returns it: expected tokens, quantiles, and its pool (`bin`)."""
        probs = prediction.probabilities
        masses = self.masses(bins, probs, cap)
        capped = cap is not None and cap < bins.max_tokens
        return {
            "expected_tokens": round(_capped_mean(bins, probs, cap) if capped else prediction.expected_tokens, 1),
            "quantiles": {q: round(min(v, cap) if cap else v, 1) for q, v in prediction.quantiles.items()},
            "bin": max(masses, key=masses.get),
            "pool_probabilities": {name: round(p, 4) for name, p in masses.items()},
        }
