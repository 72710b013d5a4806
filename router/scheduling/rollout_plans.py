"""Rollout schedules as pure plans: which waiting sample takes a freed slot, and where it asks to run.

A training step waits for its slowest sample, so a rollout is judged by its makespan, not its
mean latency. The router's rollout runner (router.serving.rollout) and the simulator
(benchmarks.simulator.cluster) drive the same plans, each with its own clock and its own slots:
- `fifo`: samples in prompt order, the replica left to the router's replica choice (the
  length-blind baseline);
- `makespan`: the longest estimate still waiting first, on the replica with the least predicted
  remaining work (LPT, router.scheduling.replica_choice.least_work);
- `padding` (`padding_groups`): samples sorted by estimate and cut into groups of `batch_size`,
  the groups a batch-synchronous engine would decode together, as similar in length as the
  estimates allow.

A sample's estimate is the length a benchmark told (oracle, ceiling) or the predicted one; a
sample with neither goes last. With `siblings`, a finished sample updates the estimates of its
prompt's samples still waiting (`SiblingEstimates`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

from router.scheduling.replica_choice import ReplicaLoad, least_work
from router.scheduling.request import Request

Schedule = Literal["makespan", "padding", "fifo"]


def estimate(sample: Request) -> float | None:
    """The length a plan orders a sample by: told, else predicted, else unknown."""
    if sample.told_tokens is not None:
        return float(sample.told_tokens)
    return None if sample.prediction is None else sample.prediction.expected_tokens


class SiblingEstimates:
    """What finished samples say about their siblings, the other samples of the same prompt.

    They share the prompt, not the length (within one prompt of the embedded model, most of the
    length variance is sampling noise), so a finished sibling is a noisy observation of the
    prompt's typical length. Each waiting sibling's estimate is the prediction shrunk towards
    the lengths seen so far:

        estimate = (prior_weight * predicted + sum(finished lengths)) / (prior_weight + finished count)

    `prior_weight` is how many samples the prediction is worth.
    """

    def __init__(self, prior_weight: float = 2.0):
        self.prior_weight = prior_weight
        self._seen: dict[Hashable, list[int]] = defaultdict(list)

    def estimate(self, family: Hashable, predicted: float) -> float:
        seen = self._seen[family]
        return (self.prior_weight * predicted + sum(seen)) / (self.prior_weight + len(seen))

    def finished(self, family: Hashable, tokens: int) -> None:
        self._seen[family].append(tokens)


class RolloutPlan:
    """The order of a rollout's samples and where they ask to run (`fifo` or `makespan`)."""

    def __init__(self, samples: Sequence[Request], schedule: Schedule, siblings: bool = False):
        if schedule not in ("fifo", "makespan"):
            raise ValueError(f"a slot-by-slot plan is fifo or makespan, not {schedule!r}")
        self.schedule = schedule
        self.waiting = list(samples)
        self._siblings = SiblingEstimates() if siblings and schedule == "makespan" else None

    def __len__(self) -> int:
        return len(self.waiting)

    def current_estimate(self, sample: Request) -> float | None:
        e = estimate(sample)
        if e is None or self._siblings is None:
            return e
        return self._siblings.estimate(sample.family, e)

    def next(self) -> Request:
        """The sample that takes the slot just freed (the plan must not be empty)."""
        if self.schedule == "makespan":
            sample = max(self.waiting, key=lambda s: self.current_estimate(s) or 0.0)
        else:
            sample = self.waiting[0]
        self.waiting.remove(sample)
        return sample

    def place(self, sample: Request, loads: Sequence[ReplicaLoad]) -> str | None:
        """The replica the sample asks for among `loads` (those with room), or None: the router's
        replica choice decides."""
        if self.schedule != "makespan" or estimate(sample) is None:
            return None
        return least_work(loads)

    def finished(self, sample: Request, tokens: int) -> None:
        if self._siblings is not None and sample.family is not None:
            self._siblings.finished(sample.family, tokens)


def padding_groups(samples: Sequence[Request], batch_size: int) -> list[list[Request]]:
    """Samples sorted by estimate (unknown last) in groups of `batch_size`, each numbered on its samples."""
    ordered = sorted(samples, key=lambda s: (estimate(s) is None, estimate(s) or 0.0))
    groups = [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]
    for g, group in enumerate(groups):
        for sample in group:
            sample.group = g
    return groups


def remaining_tokens(samples: Sequence[Request], generated: Sequence[int]) -> float:
    """Predicted work left of samples that generated `generated` tokens so far: each its estimate
    less what it generated (at least one token), one token where no estimate is known."""
    return sum(max(1.0, (estimate(s) or 1.0) - g) for s, g in zip(samples, generated))
