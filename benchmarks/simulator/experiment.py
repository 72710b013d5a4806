"""One simulated run: a trace, a policy, a cluster size, a mode -> per-request records.

Records have the replay's shape (benchmarks.replay.records.RequestRecord), so the simulator's
runs and the real replay's are summarised by the same code and compared field by field.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.replay.records import RequestRecord
from benchmarks.replay.trace import TraceRequest
from benchmarks.simulator.cluster import Outcome, simulate
from benchmarks.simulator.routing import SimRouter
from benchmarks.simulator.setup import Setup
from benchmarks.simulator.workload import build_workload, head_for, known_lengths
from router.admission import QueueOrder, QueueStats
from router.siblings import SiblingEstimates

# rollout: a batch (every request there at t = 0) on continuous-batching engines, for its makespan.
MODES = {"open": "continuous", "batch": "batch", "rollout": "continuous"}


@dataclass
class SimRun:
    records: list[RequestRecord]  # one per request of the trace
    queues: dict[str, QueueStats]  # the router's admission queues per pool: waits, reorders
    replica: np.ndarray  # the replica each request ran on (trace order, sorted by arrival)


def run(setup: Setup, trace: list[TraceRequest], policy: str, replicas: int, mode: str = "open",
        batch_size: int = 8, seed: int = 0, load_rps: float | None = None, sizing: str = "even",
        noise: float = 0.0, replica_choice: str = "pow2", order: QueueOrder | None = None,
        rank_by: str | None = None, bounded_queue: bool = True, siblings: bool = False) -> SimRun:
    """Simulate `trace` under `policy` on `replicas` replicas; one record per request. `noise`
    blurs the oracle's lengths (see benchmarks.simulator.workload); `sizing` "single" puts every
    replica in one pool; `order` and `rank_by` override the configured queue order (router.admission)
    and ranking statistic (router.decision). Open loop bounds the queues as configured
    (router.queue.max_waiting_per_slot: the excess is rejected, as the stack's 429) unless
    `bounded_queue` is False. `siblings`: finished samples re-rank their waiting siblings
    (router.siblings; ranked policies only)."""
    config = setup.config
    head = head_for(policy)
    trace = sorted(trace, key=lambda r: r.arrival_s)
    if mode in ("batch", "rollout"):  # every request is there at t = 0, as in the replay's batch mode
        trace = [r.model_copy(update={"arrival_s": 0.0}) for r in trace]
    spec = setup.cluster(replicas, MODES[mode], batch_size, sizing)
    bins = setup.bins_for(spec.pools)
    workload = build_workload(trace, setup.predictions[head], setup.head_bins[head], bins,
                              setup.max_prompt_tokens, known_lengths(trace, policy, noise, seed))
    spec = spec.model_copy(update={"replica_choice": replica_choice})
    router = SimRouter(
        policy, config.router.fallback_policy, bins, setup.input_edges if len(spec.pools) > 1 else [],
        spec.replicas, spec.capacities(), config.router.spillover, config.model.max_model_len, seed=seed,
        order=order or setup.queue_order, shortest_first=config.router.shortest_first, rank_by=rank_by or config.router.rank_by,
        waiting_per_slot=config.router.queue.max_waiting_per_slot if mode == "open" and bounded_queue else None,
    )
    outcome = simulate(workload, router, spec, setup.limits, setup.model, seed=seed,
                       siblings=SiblingEstimates() if siblings else None)
    return SimRun(_records(trace, workload.jobs, outcome, spec.pools, policy, mode, load_rps),
                  {pool: q.stats for pool, q in router.load.queues.items()}, outcome.replica)


def _records(trace, jobs, outcome: Outcome, pools: list[str], policy: str, mode: str, load_rps) -> list[RequestRecord]:
    group_of = np.full(len(trace), -1)
    for g, members in enumerate(outcome.groups):
        group_of[members] = g
    out = []
    for i, r in enumerate(trace):
        prediction = jobs[i].prediction
        served = not outcome.rejected[i]
        out.append(RequestRecord.model_construct(  # fields typed here already: no validation per record
            policy=policy, mode="batch" if mode == "batch" else "open", load_rps=load_rps if mode == "open" else None,
            request_id=r.request_id,
            scenario=r.scenario, arrival_s=r.arrival_s, sent_s=r.arrival_s,
            first_token_s=float(outcome.first_token[i]) if served else None,
            finish_s=float(outcome.finish[i]) if served else None,
            prompt_tokens=r.prompt_tokens, completion_tokens=max(1, r.true_output_tokens) if served else None,
            true_output_tokens=r.true_output_tokens,
            predicted_tokens=None if prediction is None else round(prediction["expected_tokens"]),
            pool=pools[outcome.pool[i]], routed_policy=outcome.decided_by[i],
            group=int(group_of[i]) if group_of[i] >= 0 else None,
            status="ok" if served else "failed", error=None if served else "rejected: queue full (429)",
        ))
    return out
