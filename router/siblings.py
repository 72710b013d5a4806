"""What a finished sample says about its siblings: the other samples of the same prompt in a rollout.

An RL rollout asks for n samples of each prompt. They share the prompt, not the length (within one
prompt of the embedded model, most of the length variance is sampling noise), so a finished
sibling is a noisy observation of the prompt's typical length. Each waiting sibling's estimate is
the prediction shrunk towards the lengths seen so far:

    estimate = (prior_weight * predicted + sum(finished lengths)) / (prior_weight + finished count)

`prior_weight` is how many samples the prediction is worth. The router's rollout and the
simulator update through this one class; the rollout benchmark measures whether it pays.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable


class SiblingEstimates:
    def __init__(self, prior_weight: float = 2.0):
        self.prior_weight = prior_weight
        self._prompt: dict[Hashable, Hashable] = {}
        self._predicted: dict[Hashable, float] = {}
        self._waiting: dict[Hashable, set] = defaultdict(set)
        self._seen: dict[Hashable, list[int]] = defaultdict(list)

    def add(self, item: Hashable, prompt: Hashable, predicted_tokens: float) -> None:
        self._prompt[item], self._predicted[item] = prompt, predicted_tokens
        self._waiting[prompt].add(item)

    def started(self, item: Hashable) -> None:
        """It left the queue: its estimate no longer changes anything."""
        self._waiting[self._prompt[item]].discard(item)

    def estimate(self, item: Hashable) -> float:
        seen = self._seen[self._prompt[item]]
        return (self.prior_weight * self._predicted[item] + sum(seen)) / (self.prior_weight + len(seen))

    def finished(self, item: Hashable, tokens: int) -> list[tuple[Hashable, float]]:
        """Record a finished sample; the new estimates of its siblings still waiting."""
        prompt = self._prompt[item]
        self._waiting[prompt].discard(item)
        self._seen[prompt].append(tokens)
        return [(sibling, self.estimate(sibling)) for sibling in self._waiting[prompt]]
