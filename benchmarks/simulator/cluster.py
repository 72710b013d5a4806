"""The event loop: arrivals are routed to pools, pools hand requests to replicas, replicas step.

A pool is a Ray Serve deployment of identical replicas, each accepting at most
`max_ongoing_requests`; beyond that requests wait in the router's admission queue for the pool
(router.admission: FIFO for length-blind policies, shortest-first with aging for the others)
until a replica frees a slot, and a free slot goes to a replica chosen by `replica_choice`
(benchmarks.simulator.replica_choice; Ray's power of two choices by default). Open loop routes each request when it arrives (spillover, in-flight
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
from benchmarks.simulator.replica_choice import REPLICA_CHOICE, ReplicaScore
from benchmarks.simulator.routing import SimRouter
from router.admission import Admission
from router.siblings import SiblingEstimates
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
    replica_choice: str = "pow2"  # benchmarks.simulator.replica_choice.REPLICA_CHOICE

    def per_replica(self) -> int:
        """Requests a replica holds: its ongoing limit, or exactly one group in batch mode."""
        return self.batch_size if self.mode == "batch" else self.max_ongoing_requests

    def capacities(self) -> dict[str, int]:
        """A pool's slots: what its replicas hold together (max_ongoing_requests x replicas, as the
        stack counts them; in batch mode one group each)."""
        return {p: self.per_replica() * self.replicas[p] for p in self.pools}


@dataclass
class Workload:
    """Requests sorted by arrival; `jobs` are what the router's policies see for each."""

    arrival: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray  # true lengths, >= 1
    max_tokens: np.ndarray
    jobs: list[Job]
    # What prediction-informed replica choice reads: each request's predicted distribution
    # (head bins, probabilities), or None (benchmarks.simulator.replica_choice).
    distributions: list | None = None
    prompt_ids: list[str] | None = None  # siblings (router.siblings): requests of the same prompt

    def __len__(self) -> int:
        return len(self.arrival)


@dataclass
class Outcome:
    pool: np.ndarray  # pool index per request
    decided_by: list[str]  # the policy that chose each request's pool (the fallback's name if it did)
    first_token: np.ndarray
    finish: np.ndarray
    groups: list[list[int]]  # batch mode: the requests of every batch run
    rejected: np.ndarray  # bool per request: refused by a full queue (the stack's 429)
    replica: np.ndarray  # the replica (engine index) each request ran on, -1 if none


class _Pool:
    """A pool's replicas; `free` lists the replicas below their ongoing limit. Waiting requests
    are the router's business (its admission queue), not the pool's."""

    def __init__(self, engines: list[Engine], max_ongoing: int, rng: random.Random, score: ReplicaScore):
        self.engines, self.max_ongoing, self.rng, self.score = engines, max_ongoing, rng, score
        self.ongoing = [0] * len(engines)
        self.free = list(range(len(engines)))
        self._slot = list(range(len(engines)))  # replica -> its position in `free`, -1 when full

    def take(self, now: float) -> int:
        """A replica with room, by the pool's replica choice; one slot of it. The admission queue
        only dispatches while the pool has a free slot, so there always is one."""
        k = self.free[0] if len(self.free) == 1 else self.score.pick(self, now)
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
    seed: int = 0, siblings: SiblingEstimates | None = None,
) -> Outcome:
    """`siblings`: a finished request re-ranks the waiting requests of its prompt (a rollout)."""
    n = len(workload)
    rng = random.Random(seed)
    names = spec.pools
    pools, replica_pool, engines = [], [], []
    score = REPLICA_CHOICE[spec.replica_choice](workload, rng)
    for p, name in enumerate(names):
        members = []
        for _ in range(spec.replicas[name]):
            engine = Engine(limits, model, spec.batch_size if spec.mode == "batch" else None)
            members.append(len(engines))
            engines.append(engine)
            replica_pool.append((p, len(members) - 1))
        pools.append(_Pool([engines[i] for i in members], spec.per_replica(), rng, score))
    queues = [router.load.queues[name] for name in names]
    for name, q in zip(names, queues):
        if q.slots != spec.capacities()[name]:  # the router would dispatch to replicas that have no room
            raise ValueError(f"pool {name}: the router counts {q.slots} slots, its replicas hold {spec.capacities()[name]}")
    first_index = np.cumsum([0] + [spec.replicas[name] for name in names])
    version = [0] * len(engines)
    events: list[tuple[float, int, int]] = []  # (time, replica, version)
    pool_of = np.full(n, -1, dtype=np.int64)
    first_token = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    rejected = np.zeros(n, dtype=bool)
    replica_of = np.full(n, -1, dtype=np.int64)
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

    def dispatch(p: int, i: int, now: float) -> int:
        """The replica that takes request i now (the caller kicks it)."""
        if siblings is not None:
            siblings.started(i)
        r = int(first_index[p]) + pools[p].take(now)
        engines[r].submit(seqs.pop(i))
        replica_of[i] = r
        return r

    next_arrival = 0
    while next_arrival < n or events:
        if next_arrival < n and (not events or workload.arrival[next_arrival] <= events[0][0]):
            now = float(workload.arrival[next_arrival])
            touched = set()  # requests arriving together are scheduled together (a batch's group)
            while next_arrival < n and workload.arrival[next_arrival] == now:
                i = next_arrival
                next_arrival += 1
                decision, priority = router.route(workload.jobs[i], plan=planned)
                decided_by[i] = decision.policy
                if siblings is not None:
                    siblings.add(i, workload.prompt_ids[i], decision.rank_tokens)
                p = names.index(decision.pool)
                pool_of[i] = p
                seqs[i] = Sequence(i, int(workload.prompt_tokens[i]), int(workload.output_tokens[i]), priority)
                verdict = queues[p].offer(i, now, decision.rank_tokens, decision.on_prior)
                if verdict is Admission.DISPATCH:
                    touched.add(dispatch(p, i, now))
                elif verdict is Admission.FULL:  # 429: never served (first token and finish stay NaN)
                    rejected[i] = True
                    del seqs[i]
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
        touched = {r}  # slots freed at this boundary are filled before anyone schedules
        for i in log.finished:
            finish[i] = now
            pools[p].give_back(k)
            if siblings is not None:
                for sibling, tokens in siblings.finished(i, int(workload.output_tokens[i])):
                    queues[pool_of[sibling]].reprioritise(sibling, tokens)
            if (waiting := queues[p].release(now)) is not None:
                touched.add(dispatch(p, waiting, now))
        for t in touched:
            kick(t, now)
    groups = [g for e in engines for g in e.groups]
    return Outcome(pool=pool_of, decided_by=decided_by, first_token=first_token, finish=finish, groups=groups,
                   rejected=rejected, replica=replica_of)
