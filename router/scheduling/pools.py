"""Pools as ranges of output tokens, and how a head's predicted distribution maps onto them.

A request belongs in the pool its output most probably falls in: the mass of each pool's range
under the predicted distribution, not the pool that holds the expected length. Expected lengths
regress towards the mean (an uncertain prediction lands in the middle pool whatever the prompt),
while the mass per pool still separates "surely short" from "maybe long".

`max_tokens` caps the real length, so it caps the prediction too: a request limited to 16 tokens
is short whatever the model would like to say. The distribution maths (CDF, capped mean) is the
head's own (predictor.head.LengthBins), so training and serving read one copy.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from predictor.head import LengthBins, LengthPrediction
from router.scheduling.request import Prediction


@dataclass(frozen=True)
class Pools:
    """Pool i takes outputs in (edges[i-1], edges[i]] tokens; the last pool is open-ended."""

    names: tuple[str, ...]
    edges: tuple[float, ...]

    def __post_init__(self):
        if len(self.edges) != len(self.names) - 1:
            raise ValueError(f"{len(self.names)} pools need {len(self.names) - 1} edges, got {list(self.edges)}")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:])) or (self.edges and self.edges[0] <= 0):
            raise ValueError(f"pool edges must be positive and increasing: {list(self.edges)}")

    @classmethod
    def from_quantiles(cls, names: list[str], bins: LengthBins) -> "Pools":
        """Equal shares of the training lengths per pool."""
        return cls(tuple(names), tuple(float(round(bins.training_quantile(i / len(names))))
                                       for i in range(1, len(names))))

    def pool_of(self, tokens: float) -> str:
        return self.names[bisect.bisect_left(self.edges, tokens)]

    def masses(self, bins: LengthBins, probs: list[float], cap: float | None = None) -> dict[str, float]:
        """Probability of each pool; with a cap, lengths beyond it count as the cap."""
        if not self.edges:
            return {self.names[0]: 1.0}
        row = torch.tensor([probs], dtype=torch.float32).expand(len(self.edges), -1)
        cdf = bins.cdf(row, torch.tensor(self.edges)).tolist()
        cuts = [0.0, *(1.0 if cap is not None and e >= cap else c for e, c in zip(self.edges, cdf)), 1.0]
        return {name: max(0.0, b - a) for name, a, b in zip(self.names, cuts, cuts[1:])}

    def describe(self, head: str, prediction: LengthPrediction, bins: LengthBins, cap: int | None) -> Prediction:
        """A head's answer as the router uses it: capped expectation and quantiles, and its pool."""
        probs = prediction.probabilities
        masses = self.masses(bins, probs, cap)
        capped = cap is not None and cap < bins.max_tokens
        expected = bins.capped_mean(torch.tensor([probs]), cap).item() if capped else prediction.expected_tokens
        return Prediction(
            head=head, expected_tokens=round(expected, 1),
            quantiles={q: round(min(v, cap) if cap else v, 1) for q, v in prediction.quantiles.items()},
            pool=max(masses, key=masses.get), pool_probabilities={name: round(p, 4) for name, p in masses.items()},
        )
