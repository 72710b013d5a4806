"""Where requests wait when every replica is full: a bounded queue, shortest-predicted-first with aging.

Ray Serve's handle queue is FIFO, and vLLM's `priority` policy orders only the engine's own
waiting queue, which stays empty while requests are held back at `max_ongoing_requests`. So the
one place where an order can pay is the router, in front of the replicas: it dispatches a request
at once while a replica slot is free and holds it here otherwise. The queue is shared code: the
router (router.serving.gate) and the simulator admit, order and release through this same object, by
way of the scheduler (router.scheduling.scheduler).

Order. Each waiting request gets a key, its arrival time plus a slack that grows with its
predicted length, and the smallest key goes next:

    key = arrival + max_overtake_s * min(tokens, horizon_tokens) / horizon_tokens

With `max_overtake_s = 0` that is FIFO; as it grows, shortest-first. Between the two it is
shortest-first with linear aging, and the key never changes as time passes, so no re-sorting is
needed while requests wait (only when a late prediction changes a request's tokens).

Starvation bound: a request's key is at most its arrival + `max_overtake_s`, and any request that
arrives later has a key of at least its own arrival. So no request is ever passed by one that
arrived more than `max_overtake_s` after it: its wait is at most what FIFO would give it had it
arrived `max_overtake_s` later. A request whose prediction has not arrived yet ranks at
`prior_tokens` (a typical length): it never waits for the predictor.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from enum import Enum
from typing import Generic, Hashable, TypeVar

T = TypeVar("T", bound=Hashable)


class Admission(str, Enum):
    DISPATCH = "dispatch"  # a slot was free: send it now (it counts in flight from here on)
    QUEUED = "queued"  # wait for `release` to hand it a slot
    FULL = "full"  # the queue is at its bound: reject (429 with Retry-After)


@dataclass(frozen=True)
class QueueOrder:
    """How waiting requests are ranked; the defaults are FIFO."""

    max_overtake_s: float = 0.0  # the aging bound (see the module docstring); 0: FIFO
    horizon_tokens: float = 1024.0  # lengths beyond this rank alike
    prior_tokens: float = 256.0  # the rank of a request with no prediction (yet)

    def key(self, arrival: float, tokens: float | None) -> float:
        if self.max_overtake_s <= 0:
            return arrival
        t = self.prior_tokens if tokens is None else tokens
        share = min(max(t, 0.0), self.horizon_tokens) / self.horizon_tokens
        return arrival + self.max_overtake_s * share

    @property
    def fifo(self) -> bool:
        return self.max_overtake_s <= 0


@dataclass
class _Waiting:
    arrival: float
    key: float
    ranked: bool  # ranked by its own tokens, not the prior
    version: int = 0


@dataclass
class QueueStats:
    admitted: int = 0  # dispatched at once
    queued: int = 0
    rejected: int = 0
    released: int = 0  # handed a slot after waiting
    reordered: int = 0  # ... while an earlier arrival was still waiting
    withdrawn: int = 0  # left the queue without a slot (client gone, timeout)


class AdmissionQueue(Generic[T]):
    """In-flight slots plus the bounded queue of what waits for one. Items are any hashable ids."""

    def __init__(self, slots: int | None, max_waiting: int | None = None, order: QueueOrder = QueueOrder()):
        self.slots = slots  # None: unlimited (no replica limit known)
        self.max_waiting = max_waiting  # None: unbounded
        self.order = order
        self.inflight = 0
        self.stats = QueueStats()
        self._waiting: dict[T, _Waiting] = {}  # insertion order = arrival order
        self._heap: list[tuple[float, int, int, T]] = []  # (key, tie, version, item)
        self._tie = itertools.count()

    def __len__(self) -> int:
        return len(self._waiting)

    def has_room(self) -> bool:
        return self.slots is None or self.inflight < self.slots

    def offer(self, item: T, now: float, tokens: float | None = None, on_prior: bool = False) -> Admission:
        """A new request: dispatch at once while a slot is free, else queue it (or refuse: full).
        `on_prior`: its tokens are the caller's stand-in (the prior, bounded by what the request
        fixes), so it does not count as ranked by its own length until `reprioritise`."""
        if not self._waiting and self.has_room():
            self.inflight += 1
            self.stats.admitted += 1
            return Admission.DISPATCH
        if self.max_waiting is not None and len(self._waiting) >= self.max_waiting:
            self.stats.rejected += 1
            return Admission.FULL
        entry = _Waiting(arrival=now, key=self.order.key(now, tokens), ranked=tokens is not None and not on_prior)
        self._waiting[item] = entry
        heapq.heappush(self._heap, (entry.key, next(self._tie), entry.version, item))
        self.stats.queued += 1
        return Admission.QUEUED

    def reprioritise(self, item: T, tokens: float | None) -> None:
        """A prediction arrived for a waiting request: rank it by its tokens from now on."""
        entry = self._waiting.get(item)
        if entry is None or self.order.fifo:
            return
        entry.version += 1
        entry.key = self.order.key(entry.arrival, tokens)
        entry.ranked = tokens is not None
        heapq.heappush(self._heap, (entry.key, next(self._tie), entry.version, item))

    def withdraw(self, item: T) -> bool:
        """A waiting request leaves without a slot; False if it was not waiting."""
        if self._waiting.pop(item, None) is None:
            return False
        self.stats.withdrawn += 1
        return True

    def release(self, now: float) -> T | None:
        """A dispatched request is done with its slot: the next waiting one takes it (returned,
        already counted in flight), or the slot stays free (None)."""
        self.inflight -= 1
        return self.next_ready(now)

    def next_ready(self, now: float) -> T | None:
        """The next waiting request, if a slot is free (after a release or a resize)."""
        if not self.has_room():
            return None
        while self._heap:
            _, _, version, item = heapq.heappop(self._heap)
            entry = self._waiting.get(item)
            if entry is None or entry.version != version:
                continue  # withdrawn, or re-ranked since
            if item != next(iter(self._waiting)):
                self.stats.reordered += 1
            del self._waiting[item]
            self.inflight += 1
            self.stats.released += 1
            return item
        return None

    def ranked(self) -> int:
        """Waiting requests ranked by their own tokens (the rest rank at the prior)."""
        return sum(entry.ranked for entry in self._waiting.values())

    def oldest_wait_s(self, now: float) -> float:
        """How long the longest-waiting request has waited (0 when none waits)."""
        return now - next(iter(self._waiting.values())).arrival if self._waiting else 0.0
