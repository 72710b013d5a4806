"""The event loop: arrivals are routed to pools, pools hand requests to replicas, replicas step.

A pool is a Ray Serve deployment of identical replicas, each accepting at most
`max_ongoing_requests`; beyond that requests wait in the pool's handle queue (FCFS) until a
replica frees a slot, and a free slot goes to the less busy of two sampled replicas (Ray's
power-of-two choice). Open loop routes each request when it arrives (spillover, in-flight
counts); batch mode is the replay's batch-synchronous mode: every request is there at t = 0, the
policy plans its pool beforehand (no spillover), and each replica decodes one group of
`batch_size` at a time, taking the pool's next group in trace order when its group is done.
Events are the next arrival (a pointer into the sorted workload) and each replica's end of its
current run of steps (a heap; a run cut short by an arrival is re-pushed with a new version and
its old entry skipped).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel

from benchmarks.simulator.engine import Engine, EngineLimits, Sequence
from benchmarks.simulator.routing import SimRouter
from benchmarks.simulator.step_time import StepTimeModel
from router.policies import Job


class ClusterSpec(BaseModel):
    pools: list[str]
    replicas: dict[str, int]  # replicas per pool
    max_ongoing_requests: int  # per replica (Ray Serve)
    mode: Literal["continuous", "batch"] = "continuous"
    batch_size: int = 16  # batch mode: requests decoded together
    # Every step takes this many times the calibrated time: replicas sharing fewer cores than
    # they are (the replay's 3 one-thread engines on 2 cores: 1.5). 1: each has its own hardware.
    step_slowdown: float = 1.0

    def per_replica(self) -> int:
        """Requests a replica holds: its ongoing limit, or exactly one group in batch mode."""
        return self.batch_size if self.mode == "batch" else self.max_ongoing_requests

    def capacities(self) -> dict[str, int]:
        """Where PoolLoad counts a pool saturated: max_ongoing_requests x replicas, as the stack does."""
        return {p: self.max_ongoing_requests * self.replicas[p] for p in self.pools}


@dataclass
class Workload:
    """Requests sorted by arrival; `jobs` are what the router's policies see for each."""

    arrival: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray  # true lengths, >= 1
    max_tokens: np.ndarray
    jobs: list[Job]

    def __len__(self) -> int:
        return len(self.arrival)


@dataclass
class Outcome:
    pool: np.ndarray  # pool index per request
    decided_by: list[str]  # the policy that chose each request's pool (the fallback's name if it did)
    first_token: np.ndarray
    finish: np.ndarray
    groups: list[list[int]]  # batch mode: the requests of every batch run


class _Pool:
    """A pool's replicas and its handle queue; `free` lists the replicas below their ongoing limit."""

    def __init__(self, engines: list, max_ongoing: int, rng: random.Random):
        self.engines, self.max_ongoing, self.rng = engines, max_ongoing, rng
        self.ongoing = [0] * len(engines)
        self.queue: deque[int] = deque()
        self.free = list(range(len(engines)))
        self._slot = list(range(len(engines)))  # replica -> its position in `free`, -1 when full

    def take(self) -> int | None:
        """The less busy of two sampled replicas with room (Ray's power of two choices); one slot of it."""
        if not self.free:
            return None
        if len(self.free) == 1:
            k = self.free[0]
        else:
            a, b = self.rng.sample(self.free, 2)
            k = a if self.ongoing[a] <= self.ongoing[b] else b
        self.ongoing[k] += 1
        if self.ongoing[k] >= self.max_ongoing:
            self._remove(k)
        return k

    def give_back(self, k: int) -> None:
        if self.ongoing[k] >= self.max_ongoing:
            self._slot[k] = len(self.free)
            self.free.append(k)
        self.ongoing[k] -= 1

    def _remove(self, k: int) -> None:
        i, last = self._slot[k], self.free[-1]
        self.free[i], self._slot[last] = last, i
        self.free.pop()
        self._slot[k] = -1


def simulate(
    workload: Workload, router: SimRouter, spec: ClusterSpec, limits: EngineLimits, model: StepTimeModel,
    seed: int = 0,
) -> Outcome:
    n = len(workload)
    rng = random.Random(seed)
    names = spec.pools
    pools, replica_pool, engines = [], [], []
    for p, name in enumerate(names):
        members = []
        for _ in range(spec.replicas[name]):
            engine = Engine(limits, model, spec.batch_size if spec.mode == "batch" else None)
            members.append(len(engines))
            engines.append(engine)
            replica_pool.append((p, len(members) - 1))
        pools.append(_Pool([engines[i] for i in members], spec.per_replica(), rng))
    first_index = np.cumsum([0] + [spec.replicas[name] for name in names])
    version = [0] * len(engines)
    events: list[tuple[float, int, int]] = []  # (time, replica, version)
    pool_of = np.full(n, -1, dtype=np.int64)
    first_token = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    planned = spec.mode == "batch"
    decided_by = [""] * n
    seqs: dict[int, Sequence] = {}

    def schedule(r: int, at: float) -> None:
        version[r] += 1
        heapq.heappush(events, (at, r, version[r]))

    def kick(r: int, now: float) -> None:
        engine = engines[r]
        if engine.busy_until is None:
            engine.start(now, spec.step_slowdown)
            if engine.busy_until is not None:
                schedule(r, engine.busy_until)
        else:
            cut = engine.arrival_cuts_run(now)
            if cut is not None:
                schedule(r, cut)

    def dispatch(p: int, i: int) -> int | None:
        """The replica that takes request i now (the caller kicks it), or None: all are full."""
        k = pools[p].take()
        if k is None:
            return None
        r = int(first_index[p]) + k
        engines[r].submit(seqs.pop(i))
        return r

    next_arrival = 0
    while next_arrival < n or events:
        if next_arrival < n and (not events or workload.arrival[next_arrival] <= events[0][0]):
            now = float(workload.arrival[next_arrival])
            touched = set()  # requests arriving together are scheduled together (a batch's group)
            while next_arrival < n and workload.arrival[next_arrival] == now:
                i = next_arrival
                next_arrival += 1
                decide = router.plan if planned else router.route
                name, priority, decided_by[i] = decide(workload.jobs[i], int(workload.max_tokens[i]))
                p = names.index(name)
                pool_of[i] = p
                seqs[i] = Sequence(i, int(workload.prompt_tokens[i]), int(workload.output_tokens[i]), priority)
                r = None if pools[p].queue else dispatch(p, i)
                if r is None:
                    pools[p].queue.append(i)
                else:
                    touched.add(r)
            for r in touched:
                kick(r, now)
            continue
        now, r, v = heapq.heappop(events)
        if v != version[r]:
            continue
        log = engines[r].settle()
        for i in log.first_token:
            first_token[i] = now
        p, k = replica_pool[r]
        for i in log.finished:
            finish[i] = now
            if not planned:
                router.load.release(names[p])
            pools[p].give_back(k)
        touched = {r}  # slots freed at this boundary are filled before anyone schedules
        while pools[p].queue:
            taker = dispatch(p, pools[p].queue[0])
            if taker is None:
                break
            pools[p].queue.popleft()
            touched.add(taker)
        for t in touched:
            kick(t, now)
    groups = [g for e in engines for g in e.groups]
    return Outcome(pool=pool_of, decided_by=decided_by, first_token=first_token, finish=finish, groups=groups)
