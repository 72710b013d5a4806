"""Rollout schedules as pure plans: which waiting sample takes a freed slot, where it asks to run,
when the rollout has enough, and what is cut.

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

A sample's estimate is the length a benchmark told (oracle, ceiling), else its prompt's own
history (router.serving.history: RL re-sends its prompts every epoch), else the predicted one; a
sample with none goes last. With `siblings`, a finished sample updates the estimates of its
prompt's samples still waiting (`SiblingEstimates`, as Seer's probes do).

The tail is cut by not waiting for it:
- first-k-of-n (`FirstK`, RollPacker): the rollout has enough once `k` samples of every prompt
  (or a share of all its samples) are done; the others are cut, running or not;
- a token budget (`call_tokens`, APRIL's partial rollouts): a sample still running at the budget
  stops there as partial, to be continued by a later rollout from where it stopped.

How a driver runs a rollout, the same on the stack and in the simulator:
    plan = RolloutPlan(samples, schedule, siblings, budget)   # or padding_groups(samples, batch_size)
    enough = FirstK(samples, k, share)
    while len(plan) and a slot is free:            # padding: each replica's next group instead,
        sample = plan.next()                       #   skipping samples `enough.wanted` refuses
        ask for plan.place(sample, loads); send it with max_tokens = call_tokens(sample, budget)
        enough.started(sample)
    when a sample ends, its record filled (completion_tokens, finish_reason, error):
        plan.finished(sample)
        for running in enough.ended(sample): abort it (its record already says finish_reason "cut");
            when its abort lands, fill completion_tokens with what it generated and call
            plan.finished(running) and enough.ended(running) for it too
        once `enough.unstarted` is 0, stop waiting for slots
    the rollout is over when every started sample has ended; each sample's `outcome` is its status.
A sample the budget stopped ends with finish_reason "length" short of its own `max_tokens`
(`outcome` "partial"). A continued sample is a record with `resumed_tokens` (what it generated
before), `max_tokens` (what remains of its own) and `pinned` (the replica whose prefix cache holds
it, which `place` keeps while it has room).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence, Set
from typing import Literal

from router.scheduling.length_stats import censored_stats
from router.scheduling.replica_choice import ReplicaLoad, least_work
from router.scheduling.signals import first_signal
from router.scheduling.request import CUT, HistoryStats, Request, Source

Schedule = Literal["makespan", "padding", "fifo"]
Outcome = Literal["done", "cut", "partial", "failed"]
PREDICTION_WEIGHT = 2.0  # how many finished siblings a prediction is worth


def signal(sample: Request) -> tuple[float, Source] | None:
    """A sample's whole length as the plans see it, and where it comes from: the router's own chain
    (router.scheduling.signals: told, a cap that fixes it, the prompt's history, the head)."""
    found = first_signal(sample)
    return None if found is None else (found.tokens, found.source)


def estimate(sample: Request) -> float | None:
    """The tokens a plan orders a sample by, at most its `max_tokens`; None: unknown.

    A continued partial sample has generated `resumed_tokens` already: what is left of its length,
    or, once it has outlived its estimate, as many again as it has generated (the mean residual
    life of a heavy tail: a sample that ran long tends to run on).
    """
    found = signal(sample)
    if found is None:
        return None
    tokens = max(found[0] - sample.resumed_tokens, float(sample.resumed_tokens))
    return min(tokens, sample.max_tokens) if sample.max_tokens else tokens


def call_tokens(sample: Request, budget: int | None) -> int | None:
    """The `max_tokens` a sample is sent with: its own, or the rollout's token budget if smaller
    (it then stops there as partial, `outcome`)."""
    if budget is None or sample.max_tokens is None:
        return sample.max_tokens
    return min(sample.max_tokens, budget)


def outcome(sample: Request) -> Outcome:
    """How a sample that ended ended: `done` (it stopped, or reached its own `max_tokens`),
    `partial` (the budget stopped it short of its own `max_tokens`), `cut` (first-k), `failed`."""
    if sample.finish_reason == CUT:
        return "cut"
    if sample.error is not None or sample.completion_tokens is None:
        return "failed"
    own_cap = sample.max_tokens
    if sample.finish_reason == "length" and own_cap is not None and sample.completion_tokens < own_cap:
        return "partial"
    return "done"


class SiblingEstimates:
    """What finished samples say about their siblings, the other samples of the same prompt.

    They share the prompt, not the length (within one prompt of the embedded model, most of the
    length variance is sampling noise), so a finished sibling is a noisy observation of the
    prompt's typical length. Each waiting sibling's estimate is its prior shrunk towards the
    lengths seen so far:

        estimate = (weight * prior + count * seen mean) / (weight + count)

    The seen mean is router.scheduling.length_stats's (a cut or partial sibling only says "at
    least"); with exact lengths only, count x seen mean is their sum. A prediction's weight is
    PREDICTION_WEIGHT samples; a history's is the lengths it rests on.
    """

    def __init__(self):
        self._seen: dict[Hashable, list[tuple[int, bool]]] = defaultdict(list)
        self._stats: dict[Hashable, HistoryStats] = {}  # per family, as of its last finished sample

    def estimate(self, family: Hashable, prior: float, weight: float) -> float:
        stats = self._stats.get(family)
        if stats is None:
            return prior
        return (weight * prior + stats.count * stats.mean_tokens) / (weight + stats.count)

    def finished(self, family: Hashable, tokens: int, censored: bool = False) -> None:
        self._seen[family].append((tokens, censored))
        self._stats[family] = censored_stats(self._seen[family])


class RolloutPlan:
    """The order of a rollout's samples and where they ask to run (`fifo` or `makespan`)."""

    def __init__(self, samples: Sequence[Request], schedule: Schedule, siblings: bool = False,
                 budget: int | None = None, tail: Set[str] = frozenset()):
        """`tail`: the ids of samples that start only once no other waits (a first-k rollout's
        extras, `FirstK.tail`: the samples most likely to be cut start last, and are cut before
        they start where they can be)."""
        if schedule not in ("fifo", "makespan"):
            raise ValueError(f"a slot-by-slot plan is fifo or makespan, not {schedule!r}")
        self.schedule = schedule
        self.waiting = list(samples)
        self._tail = tail
        self._budget = budget
        self._siblings = SiblingEstimates() if siblings and schedule == "makespan" else None

    def __len__(self) -> int:
        """Samples still to start (those cut while they waited never start)."""
        self.waiting = [s for s in self.waiting if s.finish_reason != CUT]
        return len(self.waiting)

    def current_estimate(self, sample: Request) -> float | None:
        """Its estimate, updated by its finished siblings, at most the budget it is sent with."""
        e = estimate(sample)
        if e is None:
            return None
        if self._siblings is not None and sample.family is not None:
            weight = sample.history.count if signal(sample)[1] == "history" else PREDICTION_WEIGHT
            e = self._siblings.estimate(sample.family, e, weight)
        return e if self._budget is None else min(e, self._budget)

    def next(self) -> Request:
        """The sample that takes the slot just freed (the plan must not be empty: `len`)."""
        if not len(self):
            raise IndexError("no sample waits")
        first = [s for s in self.waiting if s.id not in self._tail] or self.waiting
        if self.schedule == "makespan":
            sample = max(first, key=lambda s: self.current_estimate(s) or 0.0)
        else:
            sample = first[0]
        self.waiting.remove(sample)
        return sample

    def place(self, sample: Request, loads: Sequence[ReplicaLoad]) -> str | None:
        """The replica the sample asks for among `loads` (those with room), or None: the router's
        replica choice decides. A continued sample pinned to the replica whose prefix cache holds
        its tokens keeps it while it has room (a prefill saved beats a better balance)."""
        if sample.pinned is not None and any(load.replica == sample.pinned for load in loads):
            return sample.pinned
        if self.schedule != "makespan" or estimate(sample) is None:
            return None
        return least_work(loads)

    def finished(self, sample: Request, tokens: int | None = None, censored: bool = False) -> None:
        """A sample ended: its length (`tokens`, else its record's natural length) informs its
        waiting siblings. A sample that failed says nothing."""
        if self._siblings is None or sample.family is None:
            return
        if tokens is None:
            label = sample.natural_length()
            if label is None:
                return
            tokens, censored = label
        self._siblings.finished(sample.family, tokens, censored)


class FirstK:
    """First-k-of-n: when a rollout has enough, and which samples are then cut.

    A prompt (a family of samples) has enough once `k` of its samples are done (all of them when
    it has fewer); with `share`, the rollout has enough once that share of all its samples are
    done. Cut samples are marked on their records (`finish_reason` "cut"): a waiting one never
    starts, a running one is for the driver to abort. Neither given: every sample runs to its end.
    Partial and failed samples are not done: they never count towards k.
    """

    def __init__(self, samples: Sequence[Request], k: int | None = None, share: float | None = None):
        if k is not None and share is not None:
            raise ValueError("first-k is per prompt (k) or of the whole batch (share), not both")
        self._families: dict[Hashable, list[Request]] = defaultdict(list)
        for sample in samples:
            self._families[sample.family].append(sample)
        self._k = k
        self._total = None if share is None else max(1, math.ceil(share * len(samples)))
        self._done: dict[Hashable, int] = defaultdict(int)
        self._running: dict[str, Request] = {}
        self._left = {s.id for s in samples}  # neither ended nor cut
        self._unstarted = set(self._left)  # neither started nor cut

    @property
    def tail(self) -> frozenset[str]:
        """The samples past the first k of their prompt (none for a share of the batch): a plan
        that starts them last waits for no sample it is about to cut (RollPacker's tail batching)."""
        if self._k is None:
            return frozenset()
        return frozenset(s.id for family in self._families.values() for s in family[self._k:])

    @property
    def unstarted(self) -> int:
        """Samples still to start: none left, and a driver waiting for a slot needs it no more."""
        return len(self._unstarted)

    def wanted(self, sample: Request) -> bool:
        return sample.finish_reason != CUT

    def started(self, sample: Request) -> None:
        self._running[sample.id] = sample
        self._unstarted.discard(sample.id)

    def ended(self, sample: Request) -> list[Request]:
        """`sample` ended (its record says how, `outcome`): the running samples to abort now."""
        self._running.pop(sample.id, None)
        self._left.discard(sample.id)
        if outcome(sample) != "done":
            return []
        self._done[sample.family] += 1
        if self._total is not None:
            if sum(self._done.values()) < self._total:
                return []
            victims = [s for family in self._families.values() for s in family]
        else:
            family = self._families[sample.family]
            if self._k is None or self._done[sample.family] < min(self._k, len(family)):
                return []
            victims = family
        return self._cut([s for s in victims if s.id in self._left])

    def _cut(self, victims: list[Request]) -> list[Request]:
        running = []
        for sample in victims:
            if sample.finish_reason is not None:  # its last token is in, its end not yet told: done
                continue
            sample.finish_reason = CUT
            self._left.discard(sample.id)
            self._unstarted.discard(sample.id)
            if sample.id in self._running:
                running.append(sample)
            else:
                sample.completion_tokens = 0
        return running


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
