"""A bounded sample of served requests that no single kind of traffic can take over.

Live traffic comes in bursts: an RL job can send thousands of similar rollouts in a minute. A
plain FIFO or reservoir sample would then hold little else, and the head refitted on it would
forget every other kind of request. So observations are grouped into strata by what the serving
stack knows without a scenario label, the prompt's length and the observed output length (both
log-spaced, a censored output its own bucket, since its length is unknown), and when the
reservoir is full the new observation goes in and one is evicted at random from the largest
stratum. A burst then only thins out its own stratum; small strata keep everything they have.

The price is that a full reservoir is flatter than the traffic (large strata are under-sampled);
the head trades a little accuracy on the commonest requests for not losing the rare ones.
Randomness is seeded from (seed, observations offered so far), so a run replays exactly, also
after a restart from saved observations.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from torch import Tensor

# Buckets double from these lengths: prompts <= 64, (64, 128], ..., > 4,096 tokens; outputs <= 32,
# (32, 64], ..., > 1,024 tokens. Below them lengths are too few to split further.
PROMPT_BASE, PROMPT_LAST = 64, 7
OUTPUT_BASE, OUTPUT_LAST = 32, 6


@dataclass(frozen=True)
class Observation:
    """A served request whose length is known: `tokens` generated, `censored` if it was stopped by
    its max_tokens (then `tokens` is a lower bound). `key` decides the held-out split, `seq` is its
    place in the order of arrival (how recent it is)."""

    key: str
    vector: Tensor  # [d] float32 head input
    tokens: int
    censored: bool
    prompt_tokens: int
    seq: int = 0


def _bucket(n: int, base: int, last: int) -> int:
    return min(max(0, (n - 1) // base).bit_length(), last)


def stratum(obs: Observation) -> str:
    output = "cut" if obs.censored else f"o{_bucket(obs.tokens, OUTPUT_BASE, OUTPUT_LAST)}"
    return f"p{_bucket(obs.prompt_tokens, PROMPT_BASE, PROMPT_LAST)}/{output}"


class StratifiedReservoir:
    def __init__(self, capacity: int, seed: int = 0):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.seed = seed
        self.offered = 0
        self._strata: dict[str, list[Observation]] = {}

    def __len__(self) -> int:
        return sum(len(rows) for rows in self._strata.values())

    def add(self, obs: Observation) -> Observation | None:
        """Keep `obs`; returns the observation evicted to make room, if any."""
        self._strata.setdefault(stratum(obs), []).append(obs)
        self.offered += 1
        if len(self) <= self.capacity:
            return None
        rng = random.Random(f"{self.seed}:{self.offered}")
        largest = max(len(rows) for rows in self._strata.values())
        key = rng.choice(sorted(k for k, rows in self._strata.items() if len(rows) == largest))
        rows = self._strata[key]
        i = rng.randrange(len(rows))
        rows[i], rows[-1] = rows[-1], rows[i]
        evicted = rows.pop()
        if not rows:
            del self._strata[key]
        return evicted

    def counts(self) -> dict[str, int]:
        return {k: len(self._strata[k]) for k in sorted(self._strata)}

    def observations(self) -> list[Observation]:
        """Every kept observation, in an order that `restore` rebuilds the same reservoir from."""
        return [obs for k in sorted(self._strata) for obs in self._strata[k]]

    @classmethod
    def restore(cls, capacity: int, seed: int, offered: int, observations: list[Observation]) -> "StratifiedReservoir":
        if len(observations) > capacity:
            raise ValueError(f"{len(observations)} observations saved, capacity {capacity}")
        reservoir = cls(capacity, seed)
        for obs in observations:
            reservoir._strata.setdefault(stratum(obs), []).append(obs)
        reservoir.offered = offered
        return reservoir
