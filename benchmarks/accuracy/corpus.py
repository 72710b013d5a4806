"""The prompts a run evaluates and each variant's inputs for them, computed once per run.

Inputs of every kind are per prompt: pooled prefill features from the feature cache (shared
with predictor.train, so nothing is extracted twice), the proxy encoder's embedding, or the text
itself. Variants that pool alike (ESTP with other fitting settings) share one computation.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import zip_longest
from typing import Callable

from benchmarks.accuracy.variants import Variant
from predictor.train import Example, FeatureCache, pooled_inputs


def round_robin(examples: list[Example], scenario: dict[str, str]) -> list[Example]:
    """One prompt of each scenario in turn, each scenario's prompts in their given order."""
    queues = defaultdict(list)
    for e in examples:
        queues[scenario[e.prompt_id]].append(e)
    return [e for row in zip_longest(*(queues[name] for name in sorted(queues))) for e in row if e is not None]


def limit_examples(examples: list[Example], limit: int | None, scenario: dict[str, str]) -> list[Example]:
    """Whole prompts, taken round-robin over scenarios, until `limit` samples: a quick run still
    sees every scenario. None keeps everything."""
    if limit is None:
        return examples
    kept, samples = [], 0
    for e in round_robin(examples, scenario):
        if samples >= limit:
            break
        kept.append(e)
        samples += len(e.lengths)
    return kept


class Inputs:
    """Per-prompt inputs of a variant: [P, d] tensors, or the prompt texts for text models."""

    def __init__(self, examples: list[Example], texts: list[str], cache: FeatureCache,
                 proxy_encoder: Callable[[], object]):
        self.examples, self.texts, self.cache = examples, texts, cache
        self._proxy_encoder = proxy_encoder
        self._done: dict[str, object] = {}

    def __call__(self, variant: Variant):
        if variant.inputs == "text":
            return self.texts
        key = "proxy" if variant.inputs == "proxy" else repr((variant.recipe.pooling, variant.recipe.trail, variant.debias))
        if key not in self._done:
            if variant.inputs == "proxy":
                self._done[key] = self._proxy_encoder().encode(self.texts)
            else:
                self._done[key] = pooled_inputs(self.cache, self.examples, variant.recipe, variant.debias)
        return self._done[key]
