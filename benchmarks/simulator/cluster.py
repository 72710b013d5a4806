"""The event loop: requests are decided, admitted and released by the router's own scheduling core,
replicas are chosen by its replica choice, and modelled engines step.

A pool is a Ray Serve deployment of identical replicas, each accepting at most
`max_ongoing_requests`. Every decision is the stack's code, on the simulation's clock:
- online (`continuous`): each arrival goes through `Scheduler.decide` and `Scheduler.admit`
  (router.scheduling.scheduler): it dispatches while its pool has a free slot and waits in the pool's
  queue otherwise; a freed slot goes to `Scheduler.release`'s pick, on the replica that
  `rank_replicas` (router.scheduling.replica_choice) ranks first among those with room;
- `batch`: the replay's batch-synchronous mode: every request is there at t = 0, the policy plans
  its pool beforehand (no spillover), and each replica decodes one group of `batch_size` at a time;
- rollouts (`simulate_rollout`): every sample is there at t = 0, and the rollout's plan
  (router.scheduling.rollout_plans) picks which sample takes each freed slot and which replica it asks
  for, exactly as the router's rollout runner does; `padding` runs similar-length groups, one
  group per replica at a time.
Events are the next arrival (a pointer into the sorted workload) and each replica's end of its
current run of steps (a heap; a run cut short by an arrival is re-pushed with a new version and
its old entry skipped).
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from pydantic import BaseModel

from benchmarks.simulator.engine import Engine, EngineLimits, Sequence
from benchmarks.simulator.step_time import StepTimeModel
from benchmarks.simulator.workload import Workload
from router.scheduling.admission import Admission
from router.scheduling.replica_choice import Choice, ReplicaLoad, rank_replicas
from router.scheduling.request import Request
from router.scheduling.rollout_plans import FirstK, RolloutPlan, padding_groups, remaining_tokens
from router.scheduling.scheduler import Scheduler


class ClusterSpec(BaseModel):
    pools: list[str]
    replicas: dict[str, int]  # replicas per pool
    max_ongoing_requests: int  # per replica (Ray Serve)
    mode: Literal["continuous", "batch"] = "continuous"
    batch_size: int = 16  # batch mode: requests decoded together
    # Every step takes this many times the calibrated time: replicas sharing fewer cores than
    # they are. 1: each has its own hardware.
    step_slowdown: float = 1.0
    replica_choice: Choice = "least_inflight"  # the stack's (router.replica_choice)
    # On one CPU machine the predictor's prefill runs on the engines' cores: while it works
    # (sorted, disjoint intervals on the simulation's clock), a run of steps that starts then takes
    # `predictor_slowdown` times as long. Empty: the predictor has hardware of its own.
    predictor_busy: list[tuple[float, float]] = []
    predictor_slowdown: float = 1.0

    def slowdown_at(self, now: float) -> float:
        i = bisect.bisect_right(self.predictor_busy, (now, float("inf"))) - 1
        busy = i >= 0 and now < self.predictor_busy[i][1]
        return self.step_slowdown * (self.predictor_slowdown if busy else 1.0)

    def per_replica(self) -> int:
        """Requests a replica holds: its ongoing limit, or exactly one group in batch mode."""
        return self.batch_size if self.mode == "batch" else self.max_ongoing_requests

    def capacities(self) -> dict[str, int]:
        """A pool's slots: what its replicas hold together (max_ongoing_requests x replicas, as the
        stack counts them; in batch mode one group each)."""
        return {p: self.per_replica() * self.replicas[p] for p in self.pools}


@dataclass
class Outcome:
    first_token: np.ndarray
    finish: np.ndarray
    groups: list[list[int]]  # batch mode and padding: the requests of every group run together
    rejected: np.ndarray  # bool per request: refused by a full queue (the stack's 429)
    replica: np.ndarray  # the replica (engine index) each request ran on, -1 if none


class _Pool:
    """A pool's replicas and their requests in flight, as Ray's router sees them."""

    def __init__(self, first: int, engines: list[Engine], max_ongoing: int, choice: Choice, rng: random.Random):
        self.first, self.engines, self.max_ongoing, self.choice, self.rng = first, engines, max_ongoing, choice, rng
        self.ongoing = [0] * len(engines)
        self.free = list(range(len(engines)))  # replicas below their ongoing limit
        self._slot = list(range(len(engines)))  # replica -> its position in `free`, -1 when full

    def loads(self, work: Callable[[int], float] | None = None) -> list[ReplicaLoad]:
        """What the replica choice sees of the replicas with room (their engine indices as ids)."""
        return [ReplicaLoad(str(k), self.ongoing[k], work(k) if work else 0.0) for k in self.free]

    def choose(self, pinned: int | None = None) -> int:
        """The stack's replica choice among the replicas with room (a pin first, if it has room)."""
        if len(self.free) == 1:
            return self.free[0]
        groups = rank_replicas(self.choice, self.loads(), self.rng, None if pinned is None else str(pinned))
        return int(groups[0][0])

    def take(self, k: int) -> None:
        self.ongoing[k] += 1
        if self.ongoing[k] >= self.max_ongoing:
            i, last = self._slot[k], self.free[-1]
            self.free[i], self._slot[last] = last, i
            self.free.pop()
            self._slot[k] = -1

    def give_back(self, k: int) -> None:
        if self.ongoing[k] >= self.max_ongoing:
            self._slot[k] = len(self.free)
            self.free.append(k)
        self.ongoing[k] -= 1


class _Loop:
    """Engines, pools and the event heap shared by every mode."""

    def __init__(self, spec: ClusterSpec, limits: EngineLimits, model: StepTimeModel, n: int, seed: int):
        rng = random.Random(seed)
        self.spec = spec
        self.engines: list[Engine] = []
        self.pools: dict[str, _Pool] = {}
        self.pool_of_engine: list[str] = []
        batch = spec.batch_size if spec.mode == "batch" else None
        for name in spec.pools:
            members = [Engine(limits, model, batch) for _ in range(spec.replicas[name])]
            self.pools[name] = _Pool(len(self.engines), members, spec.per_replica(), spec.replica_choice, rng)
            self.engines += members
            self.pool_of_engine += [name] * len(members)
        self.version = [0] * len(self.engines)
        self.events: list[tuple[float, int, int]] = []  # (time, engine, version)
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.rejected = np.zeros(n, dtype=bool)
        self.replica_of = np.full(n, -1, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)  # tokens each finished request generated

    def submit(self, i: int, request: Request, output: int, pool: str, k: int, now: float) -> int:
        """Request i starts on replica k of `pool` now; returns its engine index (the caller kicks it)."""
        p = self.pools[pool]
        p.take(k)
        r = p.first + k
        self.engines[r].submit(Sequence(i, int(request.prompt_tokens or 1), output, request.priority or 0,
                                        request.family))
        self.replica_of[i] = r
        request.replica, request.dispatched_at = str(r), now
        return r

    def kick(self, r: int, now: float) -> None:
        engine = self.engines[r]
        if engine.busy_until is None:
            engine.start(now, self.spec.slowdown_at(now))
            if engine.busy_until is not None:
                self._schedule(r, engine.busy_until)
        else:
            cut = engine.arrival_cuts_run(now)
            if cut is not None:
                self._schedule(r, cut)

    def _schedule(self, r: int, at: float) -> None:
        self.version[r] += 1
        heapq.heappush(self.events, (at, r, self.version[r]))

    def next_event_time(self) -> float | None:
        while self.events and self.events[0][2] != self.version[self.events[0][1]]:
            heapq.heappop(self.events)
        return self.events[0][0] if self.events else None

    def step(self) -> tuple[float, int, list[int]]:
        """The next engine event: (time, engine, requests finished there); first tokens recorded."""
        now, r, _ = heapq.heappop(self.events)
        log = self.engines[r].settle()
        for i in log.first_token:
            self.first_token[i] = now
        for i in log.finished:
            self.finish[i] = now
            self.generated[i] = log.generated[i]
            self._give_back(r)
        return now, r, log.finished

    def _give_back(self, r: int) -> None:
        pool = self.pools[self.pool_of_engine[r]]
        pool.give_back(r - pool.first)

    def abort(self, i: int, now: float) -> bool:
        """Request i is cut (a first-k rollout's): it ends at its engine's next step boundary with
        what it generated by then, or now if it never started (True: it ended now)."""
        r = int(self.replica_of[i])
        where = self.engines[r].abort(i, now)
        if where == "waiting":
            self.finish[i] = now
            self._give_back(r)
            return True
        if where == "running" and self.engines[r].busy_until is not None:
            self._schedule(r, self.engines[r].busy_until)
        return False

    def outcome(self) -> Outcome:
        return Outcome(self.first_token, self.finish, [g for e in self.engines for g in e.groups], self.rejected,
                       self.replica_of)


def simulate(workload: Workload, scheduler: Scheduler, spec: ClusterSpec, limits: EngineLimits, model: StepTimeModel,
             max_model_len: int, seed: int = 0) -> Outcome:
    """Online (continuous) or batch mode: the scheduler decides, admits and releases every request."""
    requests, n = workload.requests, len(workload)
    for name, q in scheduler.queues.items():
        if q.slots != spec.capacities()[name]:  # the router would dispatch to replicas that have no room
            raise ValueError(f"pool {name}: the router counts {q.slots} slots, its replicas hold {spec.capacities()[name]}")
    loop = _Loop(spec, limits, model, n, seed)
    index = {id(r): i for i, r in enumerate(requests)}
    planned = spec.mode == "batch"

    def start(request: Request, now: float) -> int:
        i = index[id(request)]
        return loop.submit(i, request, int(workload.output_tokens[i]), request.pool,
                           loop.pools[request.pool].choose(), now)

    next_arrival = 0
    while next_arrival < n or loop.events:
        t_event = loop.next_event_time()
        if next_arrival < n and (t_event is None or requests[next_arrival].arrival <= t_event):
            now = requests[next_arrival].arrival
            touched = set()  # requests arriving together are scheduled together (a batch's group)
            while next_arrival < n and requests[next_arrival].arrival == now:
                request = requests[next_arrival]
                next_arrival += 1
                scheduler.decide(request, spill=not planned)
                request.priority = scheduler.priority(request, max_model_len)
                verdict = scheduler.admit(request, now)
                if verdict is Admission.DISPATCH:
                    touched.add(start(request, now))
                elif verdict is Admission.FULL:  # 429: never served (first token and finish stay NaN)
                    loop.rejected[index[id(request)]] = True
            for r in touched:
                loop.kick(r, now)
            continue
        if t_event is None:
            break
        now, r, finished = loop.step()
        touched = {r}  # slots freed at this boundary are filled before anyone schedules
        for i in finished:
            if (waiting := scheduler.release(requests[i].pool, now)) is not None:
                touched.add(start(waiting, now))
        for t in touched:
            loop.kick(t, now)
    return loop.outcome()


def simulate_rollout(workload: Workload, schedule: str, spec: ClusterSpec, limits: EngineLimits, model: StepTimeModel,
                     batch_size: int = 8, siblings: bool = False, seed: int = 0, k: int | None = None) -> Outcome:
    """A rollout of one pool: every sample at t = 0, scheduled by the router's rollout plans; with
    `k`, the plans' first-k cuts each prompt's tail (router.scheduling.rollout_plans.FirstK), the
    cut samples aborted in their engines as the router aborts them."""
    requests, n = workload.requests, len(workload)
    (pool_name,) = spec.pools
    loop = _Loop(spec, limits, model, n, seed)
    pool = loop.pools[pool_name]
    index = {id(r): i for i, r in enumerate(requests)}
    for request in requests:
        request.pool = pool_name

    def start(request: Request, k: int, now: float) -> int:
        i = index[id(request)]
        return loop.submit(i, request, int(workload.output_tokens[i]), pool_name, k, now)

    def work(k: int, now: float) -> float:
        """Predicted work left on replica k: its samples' estimates less what they generated."""
        engine = pool.engines[k]
        seqs = [*engine.running, *engine.waiting()]
        progress = engine.steps_done(now)
        return remaining_tokens([requests[s.index] for s in seqs],
                                [s.generated + (progress if s.prefill_left == 0 else 0) for s in seqs])

    if schedule == "padding":
        groups = padding_groups(requests, batch_size)
        for k in range(len(pool.engines)):  # each replica takes the next group when its own is done
            if groups:
                for request in groups.pop(0):
                    start(request, k, 0.0)
                loop.kick(pool.first + k, 0.0)
        while loop.next_event_time() is not None:
            now, r, _ = loop.step()
            engine = loop.engines[r]
            if not engine.running and not any(True for _ in engine.waiting()) and groups:
                for request in groups.pop(0):
                    start(request, r - pool.first, now)
            loop.kick(r, now)
        out = loop.outcome()
        return replace(out, groups=_groups_of(requests, index))
    enough = FirstK(requests, k)
    plan = RolloutPlan(requests, schedule, siblings, tail=enough.tail)

    def fill(now: float) -> set[int]:
        touched = set()
        while len(plan) and pool.free:
            sample = plan.next()
            pinned = plan.place(sample, pool.loads(lambda k: work(k, now)) if plan.schedule == "makespan" else [])
            touched.add(start(sample, pool.choose(None if pinned is None else int(pinned)), now))
            enough.started(sample)
        return touched

    def ended(i: int, now: float) -> None:
        sample = requests[i]
        sample.completion_tokens = int(loop.generated[i])
        if sample.finish_reason is None:  # one that was not cut ran to its length
            sample.finish_reason = "length" if sample.max_tokens and sample.completion_tokens >= sample.max_tokens else "stop"
        plan.finished(sample)
        for victim in enough.ended(sample):
            if loop.abort(index[id(victim)], now):
                ended(index[id(victim)], now)

    for r in fill(0.0):
        loop.kick(r, 0.0)
    while loop.next_event_time() is not None:
        now, r, finished = loop.step()
        for i in finished:
            ended(i, now)
        for t in fill(now) | {r}:
            loop.kick(t, now)
    return loop.outcome()


def _groups_of(requests: list[Request], index: dict) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for request in requests:
        groups.setdefault(request.group, []).append(index[id(request)])
    return [groups[g] for g in sorted(groups)]
