"""The simulator against real runs: the same requests, the same pools, compared metric by metric.

Validation pins each request to the pool it was really served by and to the tokens it really
generated, so what is compared is the simulator's timing (engine scheduling, the step-time
model, queueing), not a second draw of routing or sampling. Two sources:
- the real replay (benchmarks/results/replay_requests.jsonl: the stack over HTTP, 3 pools x 1
  replica sharing the machine's cores), per policy and mode;
- the engine replay (`python -m benchmarks.simulator measure`): one vLLM engine fed a trace in
  real time, no Ray; the simulator's single-replica case.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.replay.metrics import summarise
from benchmarks.replay.records import RequestRecord, read_records
from benchmarks.simulator.cluster import ClusterSpec, Workload, simulate
from benchmarks.simulator.setup import Setup
from router.decision import Decider, Decision
from router.policies import Job, PolicyContext
from router.pool_load import PoolLoad

# Not the padding ratio: pools, groups and lengths are pinned to the real ones, so it matches by construction.
COMPARED = ("mean_jct_s", "p50_jct_s", "p99_jct_s", "mean_ttft_s", "throughput_tok_s")


class PinnedRoutes:
    """Sends every request where the measurement says it went, with the priority it had there;
    beyond the replicas' limits they wait in arrival order, as in Ray Serve's queue."""

    def __init__(self, spec: ClusterSpec, pinned: list[tuple[str, int]]):
        self.load = PoolLoad(spec.pools, spec.capacities())
        self._pinned = pinned
        self._next = 0

    def route(self, job: Job, plan: bool = False) -> tuple[Decision, int]:
        pool, priority = self._pinned[self._next]
        self._next += 1
        return Decision(pool, pool, "pinned", None, None), priority


def _errors(real: dict, sim: dict) -> dict:
    out = {}
    for key in COMPARED:
        if real.get(key) and sim.get(key) is not None:
            out[key] = {"real": real[key], "sim": sim[key], "rel_error": (sim[key] - real[key]) / real[key]}
    return out


def _simulate_records(setup: Setup, records: list[RequestRecord], priorities: list[int], spec: ClusterSpec,
                      ) -> list[RequestRecord]:
    """Replays `records` (sorted by arrival, then trace order) and returns them with simulated times."""
    n = len(records)
    workload = Workload(
        arrival=np.array([r.arrival_s for r in records]),
        prompt_tokens=np.array([r.prompt_tokens for r in records]),
        output_tokens=np.array([max(1, r.completion_tokens) for r in records]),
        max_tokens=np.full(n, setup.config.model.max_model_len), jobs=[Job()] * n,
    )
    routes = PinnedRoutes(spec, [(r.pool, p) for r, p in zip(records, priorities)])
    out = simulate(workload, routes, spec, setup.limits, setup.model)
    group_of = {i: g for g, members in enumerate(out.groups) for i in members}
    return [r.model_copy(update={"first_token_s": float(out.first_token[i]), "finish_s": float(out.finish[i]),
                                 "group": group_of.get(i) if spec.mode == "batch" else None})
            for i, r in enumerate(records)]


def _priority(setup: Setup, decider: Decider, r: RequestRecord) -> int:
    """What the router gave the request to schedule on (Decider.engine_priority), from its record."""
    job = Job(prediction=None if r.predicted_tokens is None else {"expected_tokens": r.predicted_tokens},
              true_tokens=r.true_output_tokens if r.policy == "oracle" else None)
    policy = r.routed_policy or r.policy
    decision = Decision(r.pool, r.pool, policy, None, decider.rank(job, policy))
    return decider.engine_priority(decision, setup.config.model.max_model_len)


def _golden_min(f, lo: float, hi: float, iterations: int = 24) -> float:
    """The minimiser of a unimodal f on [lo, hi]."""
    ratio = (5 ** 0.5 - 1) / 2
    a, b = lo, hi
    for _ in range(iterations):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if f(c) <= f(d):
            b = d
        else:
            a = c
    return (a + b) / 2


def against_replay(setup: Setup, path: Path) -> dict:
    """Per (policy, mode) of the real replay: its metrics against the simulator's on the same requests.

    Three times: with the calibrated step times as they are; stretched by engines / cores (the
    replay runs one one-thread engine per pool on this machine's cores); and stretched by one
    factor fitted to all runs' mean JCTs, which stands for what the model leaves out (the router,
    the predictor's prefills and the clients share those cores). With that single factor the
    remaining errors say whether the simulator orders and spaces the policies as the real stack did.
    """
    by_run: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    for r in read_records(path):
        by_run[(r.policy, r.mode)].append(r)
    replicas = {p.name: p.replicas() for p in setup.config.pools}
    shared = max(1.0, sum(replicas.values()) / setup.calibration["settings"]["cpus"])
    # Ranks and priorities need no policy objects, only the pools' edges.
    decider = Decider(PolicyContext(setup.pools, setup.pool_bins, [], replicas, PoolLoad(setup.pools, {})), [],
                      "round_robin")
    runs = {}
    for (policy, mode), records in sorted(by_run.items()):
        ok = sorted((r for r in records if r.status == "ok"), key=lambda r: (r.arrival_s, r.request_id))
        if not ok:
            continue
        sizes = defaultdict(int)
        for r in ok:
            sizes[r.group] += 1
        batch_size = max(sizes.values()) if mode == "batch" else 8
        spec = ClusterSpec(pools=setup.pools, replicas=replicas,
                           max_ongoing_requests=setup.config.pools[0].deployment.get("max_ongoing_requests", 16),
                           mode="batch" if mode == "batch" else "continuous", batch_size=batch_size)
        priorities = [_priority(setup, decider, r) for r in ok]
        runs[f"{policy}/{mode}"] = (ok, len(records) - len(ok), spec, priorities, summarise(ok, batch_size))

    def simulated(key: str, slowdown: float) -> dict:
        ok, _, spec, priorities, _ = runs[key]
        return summarise(_simulate_records(setup, ok, priorities, spec.model_copy(update={"step_slowdown": slowdown})),
                         spec.batch_size)

    def misfit(slowdown: float) -> float:
        return sum(np.log(simulated(k, slowdown)["mean_jct_s"] / real["mean_jct_s"]) ** 2
                   for k, (*_, real) in runs.items())

    fitted = _golden_min(misfit, 1.0, 10.0) if runs else None
    results = {}
    for key, (ok, failed, _, _, real) in runs.items():
        results[key] = {"requests": len(ok), "failed_in_real": failed,
                        "errors": _errors(real, simulated(key, 1.0)),
                        "errors_shared_cores": _errors(real, simulated(key, shared)),
                        "errors_fitted": _errors(real, simulated(key, fitted))}
    return {"runs": results, "shared_cores_slowdown": shared, "fitted_slowdown": fitted}


def against_engine(setup: Setup, path: Path) -> dict:
    """The engine replay on one simulated replica (no Ray limit: the engine takes every request)."""
    measured = json.loads(Path(path).read_text())
    rows = measured["requests"]
    records = [RequestRecord(policy="estp", mode="open", request_id=r["request_id"], scenario="",
                             arrival_s=r["arrival_s"], first_token_s=r["first_token_s"], finish_s=r["finish_s"],
                             prompt_tokens=r["prompt_tokens"], completion_tokens=r["completion_tokens"],
                             true_output_tokens=r["true_output_tokens"], pool="engine", status="ok") for r in rows]
    spec = ClusterSpec(pools=["engine"], replicas={"engine": 1}, max_ongoing_requests=len(rows))
    simulated = _simulate_records(setup, records, [r["priority"] for r in rows], spec)
    jct_real = np.array([r.jct_s for r in records])
    jct_sim = np.array([r.jct_s for r in simulated])
    per_request = np.abs(jct_sim - jct_real) / jct_real
    return {"trace": measured["trace"], "requests": len(rows),
            "errors": _errors(summarise(records, 8), summarise(simulated, 8)),
            "per_request_jct_rel_error_median": float(np.median(per_request)),
            "per_request_jct_rel_error_p90": float(np.quantile(per_request, 0.9))}
