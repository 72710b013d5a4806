"""Which replica of a pool takes a dispatched request: one ranking, for Ray's router and the simulator.

The stack's Ray Serve request router (router.serving.replica_router) and the simulator's pools
(benchmarks.simulator.cluster) both call `rank_replicas`, so the simulator cannot choose
differently from the stack. The choices:
- `least_inflight` (the stack's): the replica with the fewest requests, ties at random. The
  continuous benchmark measured it against Ray's power of two choices and prediction-informed
  scores (predicted remaining work, sequences still running after a horizon): only it beat power
  of two (step time grows with the sequences a replica runs, not with their remaining work);
- `power_of_two`: Ray Serve's own default (two replicas sampled, the one with fewer requests
  first), for the stock Ray Serve LLM app the benchmarks compare against;
- `least_work`: the replica with the least predicted remaining work: with jobs taken longest
  first, the classic LPT rule for a batch's makespan (router.scheduling.rollout_plans).

A ranking is a list of groups, best first: Ray tries them in order and skips a replica it finds
full; a request pinned to a replica (a rollout plan's placement) offers that replica first and
the others after it, so a pin to a full replica spills instead of waiting.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Choice = Literal["least_inflight", "power_of_two"]


@dataclass(frozen=True)
class ReplicaLoad:
    replica: str
    requests: int  # in flight on it
    remaining_tokens: float = 0.0  # their predicted remaining work (requests without an estimate: 1 token)


def least_inflight(loads: Sequence[ReplicaLoad], rng: random.Random) -> list[str]:
    """Fewest requests first; ties in random order so equal replicas share the load."""
    shuffled = rng.sample(list(loads), len(loads))
    return [load.replica for load in sorted(shuffled, key=lambda load: load.requests)]


def power_of_two(loads: Sequence[ReplicaLoad], rng: random.Random) -> list[str]:
    """Two replicas sampled, the one with fewer requests first (Ray Serve's default)."""
    if len(loads) < 2:
        return [load.replica for load in loads]
    a, b = rng.sample(list(loads), 2)
    return [load.replica for load in sorted((a, b), key=lambda load: load.requests)]


def least_work(loads: Sequence[ReplicaLoad]) -> str | None:
    """The replica with the least predicted remaining work (None when there is none)."""
    return min(loads, key=lambda load: load.remaining_tokens).replica if loads else None


CHOICES = {"least_inflight": least_inflight, "power_of_two": power_of_two}


def rank_replicas(choice: Choice, loads: Sequence[ReplicaLoad], rng: random.Random,
                  pinned: str | None = None) -> list[list[str]]:
    """Ranked groups of replica ids: the pinned replica first (if it is among `loads`), then the
    choice's order; with power of two only the two sampled replicas are offered, as in Ray."""
    order = CHOICES[choice](loads, rng)
    if pinned is not None and any(load.replica == pinned for load in loads):
        order = [pinned, *(r for r in order if r != pinned)]
    return [[r] for r in order]
