"""One replica's engine: continuous batching (vLLM-like) or batch-synchronous decoding.

The engine is driven by the cluster's event loop: `submit` hands it a request,
`settle()` ends the run of steps in progress (first tokens, finishes), `start(now)` schedules the
next run and sets `busy_until` (None: idle), and `arrival_cuts_run(now)` shortens a run of decode
steps to the boundary at which a newly submitted request can join.

Continuous batching works like vLLM's scheduler: at every step boundary finished sequences leave,
waiting ones are admitted (FCFS or by priority = predicted tokens) while the running-sequence
limit and the KV-token budget allow, prompts are prefilled in chunks of the step's token budget
together with the running decodes, and a prompt's last prefill chunk yields its first token.
Simplified: a request is admitted when its prompt fits the free KV tokens, and the cache of
running sequences may then grow past the budget (vLLM would preempt and later recompute the
lowest-priority one); with the stack's 16 requests per replica and ~23k KV tokens that is rare.
Prefix caching (vLLM's default): a prompt this engine has prefilled before (a sequence's
`family`, e.g. the samples of one rollout prompt) is prefilled again only past its last full
cached block, so a rollout's later samples skip most of their prefill.
Between two events nothing changes the batch, so a run of identical decode steps is timed in
one closed form (`StepTimeModel.decode_run`) instead of step by step: the simulator's cost is
per request, not per token.

Batch-synchronous mode (`batch_size` set) is the same engine admitting a new batch only when
the previous one is done: an idle replica takes up to B waiting requests and decodes them until
the longest is done. Finished members leave the step (vLLM computes no padding tokens), but their
slots stay empty until the batch ends: the barrel effect the padding ratio measures.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

from benchmarks.simulator.step_time import StepTimeModel


@dataclass
class Sequence:
    index: int  # the request's position in the workload
    prompt: int
    output: int  # tokens it will generate (the true length, >= 1)
    priority: float
    family: Hashable | None = None  # sequences of one family share their prompt (prefix caching)
    prefill_left: int = 0
    generated: int = 0

    def __post_init__(self):
        self.prefill_left = self.prompt


@dataclass
class EngineLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_tokens: int
    shortest_first: bool = True
    block_size: int = 16  # KV cache block: the unit prefix caching reuses


@dataclass
class StepLog:
    """What the cluster needs to know after a run of steps: first tokens and finishes."""

    first_token: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    generated: dict[int, int] = field(default_factory=dict)  # a finished sequence's tokens


class Engine:
    def __init__(self, limits: EngineLimits, model: StepTimeModel, batch_size: int | None = None):
        self.limits, self.model, self.batch_size = limits, model, batch_size
        self.groups: list[list[int]] = []  # batch mode: the requests of every batch, for the padding ratio
        self._waiting: list[tuple[float, int, Sequence]] = []  # heap on (priority or arrival order)
        self._order = itertools.count()
        self.running: list[Sequence] = []
        self.busy_until: float | None = None  # end of the run of steps in progress
        # the run in progress: its start, steps, and (for pure decode runs) its shape
        self._run_start = 0.0
        self._run_slowdown = 1.0
        self._run_steps = 0
        self._run_decode: tuple[int, float] | None = None
        self._run_prefill: dict[int, int] = {}  # sequence index -> prefill tokens this step
        self._kv = 0  # kept up to date at every run's end (see kv_tokens)
        # Families whose prompt is in this engine's prefix cache, oldest first, with their prompt
        # tokens: freed blocks stay cached until newer ones need the room (about half the KV cache
        # is free while the engine runs its share of requests).
        self._cached: OrderedDict[Hashable, int] = OrderedDict()

    def submit(self, seq: Sequence) -> None:
        """Waits in priority order under shortest-first, else in arrival order (batches: the
        client's groups, always in trace order)."""
        key = seq.priority if self.limits.shortest_first and self.batch_size is None else 0.0
        heapq.heappush(self._waiting, (key, next(self._order), seq))

    def waiting(self):
        """Requests submitted but not yet running."""
        return (seq for _, _, seq in self._waiting)

    def steps_done(self, now: float) -> int:
        """Decode steps of the run in progress completed by `now` (sequences' `generated` counts
        only finished runs)."""
        if self.busy_until is None or self._run_decode is None:
            return 0
        seqs, kv = self._run_decode
        done = self.model.decode_steps_within(seqs, kv, (now - self._run_start) / self._run_slowdown)
        return min(done, self._run_steps)

    def kv_tokens(self) -> int:
        """Tokens in the KV cache: prompts prefilled so far plus tokens generated, of running sequences."""
        return self._kv

    def arrival_cuts_run(self, now: float) -> float | None:
        """The step boundary at which a request submitted at `now` is scheduled, if it shortens the run."""
        if self.busy_until is None or self._run_decode is None or self._run_steps <= 1 or self.batch_size:
            return None  # idle (the loop starts it), a single step, or a batch nobody may join
        seqs, kv = self._run_decode
        done = self.model.decode_steps_within(seqs, kv, (now - self._run_start) / self._run_slowdown)
        if done + 1 >= self._run_steps:
            return None
        self._run_steps = done + 1
        self.busy_until = self._run_start + self._run_slowdown * self.model.decode_run(seqs, kv, self._run_steps)
        return self.busy_until

    def abort(self, index: int, now: float) -> str | None:
        """Cut a sequence short (a first-k rollout's): one still waiting leaves at once ("waiting");
        one running ends at the run's next step boundary with what it generated by then
        ("running", `busy_until` moved there; a prompt still prefilling ends after its first
        token). None: it is not here."""
        for k, (_, _, seq) in enumerate(self._waiting):
            if seq.index == index:
                self._waiting.pop(k)
                heapq.heapify(self._waiting)
                return "waiting"
        seq = next((s for s in self.running if s.index == index), None)
        if seq is None:
            return None
        if seq.prefill_left:
            seq.output = 1
            return "running"
        seq.output = min(seq.output, seq.generated + self.steps_done(now) + 1)
        if self._run_decode is not None and seq.output - seq.generated < self._run_steps:
            seqs, kv = self._run_decode
            self._run_steps = seq.output - seq.generated
            self.busy_until = self._run_start + self._run_slowdown * self.model.decode_run(seqs, kv, self._run_steps)
        return "running"

    def _finish_run(self, log: StepLog) -> None:
        steps, prefill, still = self._run_steps, self._run_prefill, []
        for s in self.running:
            if s.prefill_left == 0:
                s.generated += steps
                self._kv += steps
            elif s.index in prefill:
                chunk = prefill[s.index]
                s.prefill_left -= chunk
                self._kv += chunk
                if s.prefill_left == 0:
                    s.generated = 1
                    self._kv += 1
                    log.first_token.append(s.index)
                    if s.family is not None:
                        self._remember(s)
            if s.prefill_left == 0 and s.generated >= s.output:
                log.finished.append(s.index)
                log.generated[s.index] = s.generated
                self._kv -= s.prompt + s.generated
            else:
                still.append(s)
        self.running = still

    def _admit(self) -> None:
        if self.batch_size is not None:
            self._admit_batch()
            return
        kv = self.kv_tokens()
        while self._waiting and len(self.running) < self.limits.max_num_seqs:
            seq = self._waiting[0][2]
            if self.running and kv + seq.prompt > self.limits.kv_cache_tokens:
                break  # vLLM waits for blocks; an empty engine takes any prompt that fits the context
            heapq.heappop(self._waiting)
            if seq.family is not None and seq.family in self._cached:  # only past the last full cached block
                self._cached.move_to_end(seq.family)
                seq.prefill_left = max(1, seq.prompt % self.limits.block_size)
                self._kv += seq.prompt - seq.prefill_left
            self.running.append(seq)
            kv += seq.prompt

    def _remember(self, seq: Sequence) -> None:
        self._cached[seq.family] = seq.prompt
        self._cached.move_to_end(seq.family)
        while sum(self._cached.values()) > self.limits.kv_cache_tokens // 2 and len(self._cached) > 1:
            self._cached.popitem(last=False)

    def _admit_batch(self) -> None:
        """A new batch only into an empty engine: up to B waiting requests, in scheduling order."""
        if self.running or not self._waiting:
            return
        take = min(self.batch_size, self.limits.max_num_seqs, len(self._waiting))
        self.running = [heapq.heappop(self._waiting)[2] for _ in range(take)]
        self.groups.append([s.index for s in self.running])

    def settle(self) -> StepLog:
        """At the end of the run in progress: who got a first token, who finished."""
        log = StepLog()
        if self.busy_until is not None:
            self._finish_run(log)
            self.busy_until = None
        return log

    def start(self, now: float, slowdown: float = 1.0) -> None:
        """At a step boundary of an idle engine: admit, then start the next run (or stay idle).

        `slowdown` stretches the run's steps (the cluster's `step_slowdown`)."""
        self._admit()
        if not self.running:
            return
        decoding = [s for s in self.running if s.prefill_left == 0]
        budget = self.limits.max_num_batched_tokens - len(decoding)
        self._run_prefill = {}
        for s in self.running:
            if s.prefill_left and budget > 0:
                take = min(s.prefill_left, budget)
                self._run_prefill[s.index] = take
                budget -= take
        kv = self.kv_tokens()  # the context every decode attends to; a prefill chunk attends to itself too
        self._run_start, self._run_slowdown = now, slowdown
        if self._run_prefill:
            prefill = sum(self._run_prefill.values())
            self._run_steps, self._run_decode = 1, None
            self.busy_until = now + slowdown * self.model.step(len(decoding), prefill, kv + prefill)
        else:
            self._run_steps = min(s.output - s.generated for s in decoding)
            self._run_decode = (len(decoding), kv)
            self.busy_until = now + slowdown * self.model.decode_run(len(decoding), kv, self._run_steps)
