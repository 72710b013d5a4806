"""One simulated run: a trace, a policy, a cluster size, a mode -> per-request records.

Records have the replay's shape (benchmarks.replay.records.RequestRecord), so the simulator's
runs and the real replay's are summarised by the same code and compared field by field.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.replay.records import RequestRecord
from benchmarks.replay.trace import TraceRequest
from benchmarks.simulator.cluster import Outcome, simulate, simulate_rollout
from benchmarks.simulator.hops import REPLICAS_PER_PROXY
from benchmarks.simulator.setup import Setup
from benchmarks.simulator.workload import Workload, build_workload, head_for, known_lengths
from router.scheduling.admission import QueueStats
from router.scheduling.policies import POLICIES

# Modes: open loop and batch-synchronous replays decided by the router's scheduler; a rollout's
# schedules (every sample there at t = 0) by its plans.
MODES = {"open": "continuous", "batch": "batch", "fifo": "continuous", "makespan": "continuous",
         "padding": "continuous"}
ROLLOUTS = ("fifo", "makespan", "padding")


@dataclass
class SimRun:
    records: list[RequestRecord]  # one per request of the trace
    queues: dict[str, QueueStats]  # the router's admission queues per pool: waits, reorders
    replica: np.ndarray  # the replica each request ran on (trace order, sorted by arrival)


def run(setup: Setup, trace: list[TraceRequest], policy: str, replicas: int, mode: str = "open",
        batch_size: int = 8, seed: int = 0, load_rps: float | None = None, sizing: str = "even",
        noise: float = 0.0, max_overtake_s: float | None = None, rank_by: str | None = None,
        replica_choice: str | None = None, bounded_queue: bool = True, siblings: bool = False) -> SimRun:
    """Simulate `trace` under `policy` on `replicas` replicas; one record per request. `mode`: open,
    batch, or a rollout schedule (fifo, makespan, padding). `noise` blurs the oracle's lengths
    (benchmarks.simulator.workload); `sizing` "single" puts every replica in one pool;
    `max_overtake_s`, `rank_by` and `replica_choice` override the configured queue order, ranking
    statistic and replica choice.
    Open loop bounds the queues as configured (the excess is rejected, as the stack's 429)
    unless `bounded_queue` is False. `siblings`: finished samples re-rank their waiting siblings."""
    trace = sorted(trace, key=lambda r: r.arrival_s)
    if mode != "open":  # every request is there at t = 0, as in a batch or a rollout
        trace = [r.model_copy(update={"arrival_s": 0.0}) for r in trace]
    spec = setup.cluster(replicas, MODES[mode], batch_size, "single" if mode in ROLLOUTS else sizing)
    if replica_choice is not None:
        spec = spec.model_copy(update={"replica_choice": replica_choice})
    scheduler = setup.scheduler(policy, spec, seed, bounded=bounded_queue and mode == "open",
                                max_overtake_s=max_overtake_s, rank_by=rank_by)
    head = head_for(policy)
    workload = build_workload(trace, policy, setup.predictions[head], setup.head_bins[head], scheduler.pools,
                              setup.max_prompt_tokens, known_lengths(trace, policy, noise, seed))
    if mode not in ROLLOUTS:  # the router sees a request after the hops before it, a proxy per node
        proxies = max(1, replicas // REPLICAS_PER_PROXY)
        arrivals = setup.hops.router_arrivals(np.array([r.arrival for r in workload.requests]), proxies)
        for request, arrival in zip(workload.requests, arrivals):
            request.arrival = float(arrival)
    if mode in ROLLOUTS:
        if POLICIES[policy].head is None:  # a length-blind rollout predicts nothing: its plan keeps the batch order
            for request in workload.requests:
                request.prediction = None
        outcome = simulate_rollout(workload, mode, spec, setup.limits, setup.model, batch_size, siblings, seed)
    else:
        outcome = simulate(workload, scheduler, spec, setup.limits, setup.model, setup.config.model.max_model_len, seed)
        outcome.first_token += setup.hops.out_s  # as the client sees them
        outcome.finish += setup.hops.out_s
    return SimRun(_records(trace, workload, outcome, policy, mode, load_rps),
                  {pool: q.stats for pool, q in scheduler.queues.items()}, outcome.replica)


def _records(trace, workload: Workload, outcome: Outcome, policy: str, mode: str, load_rps) -> list[RequestRecord]:
    group_of = np.full(len(trace), -1)
    for g, members in enumerate(outcome.groups):
        group_of[members] = g
    out = []
    for i, (r, request) in enumerate(zip(trace, workload.requests)):
        served = not outcome.rejected[i]
        out.append(RequestRecord.model_construct(  # fields typed here already: no validation per record
            policy=policy, mode="open" if mode == "open" else "batch", load_rps=load_rps if mode == "open" else None,
            request_id=r.request_id,
            scenario=r.scenario, arrival_s=r.arrival_s, sent_s=r.arrival_s,
            first_token_s=float(outcome.first_token[i]) if served else None,
            finish_s=float(outcome.finish[i]) if served else None,
            prompt_tokens=r.prompt_tokens, completion_tokens=max(1, r.true_output_tokens) if served else None,
            true_output_tokens=r.true_output_tokens,
            predicted_tokens=None if request.prediction is None else round(request.prediction.expected_tokens),
            pool=request.pool, routed_policy=request.decided_by,
            group=int(group_of[i]) if group_of[i] >= 0 else None,
            status="ok" if served else "failed", error=None if served else "rejected: queue full (429)",
        ))
    return out
