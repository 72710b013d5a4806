"""The simulated half: every policy at 10 / 100 / 1,000 replicas, loads and arrival processes.

Each policy runs on the layout a deployer would give it: Ray's default (`ray_default`) and the
work policies on one pool of all replicas (the router's queue in front of them); round-robin on
three even pools; the paper's length pools (`input_length`, `estp`, `egtp`, `oracle`) on three
pools sized by their share of the decode work. Every policy of one (size, arrival, load) sees the
identical trace. Load is a fraction of the replicas' modelled capacity (benchmarks.simulator.
scale.replica_capacity_rps): above 1.0 the trace is an overload that lasts its `n` requests.

The design sweeps (aging bound, ranking statistic, replica choice) run at one size beside them:
they are how the router's defaults were chosen, and they keep only what beats Ray's default.
"""

from __future__ import annotations

import numpy as np

from benchmarks.simulator.scale import SimJob, replica_capacity_rps, simulate_jobs
from benchmarks.simulator.setup import Setup

GRID_POLICIES = ("round_robin", "ray_default", "input_length", "egtp", "estp", "last", "oracle",
            "egtp_work", "estp_work", "last_work", "oracle_work", "ceiling")
LAYOUT = {"round_robin": "even", "ray_default": "single", "input_length": "work", "estp": "work", "egtp": "work",
          "last": "work", "oracle": "work", "estp_work": "single", "egtp_work": "single", "last_work": "single",
          "oracle_work": "single", "ceiling": "single"}
REPLICAS = (10, 100, 1000)
LOADS = (0.5, 0.8, 0.95, 1.1)
ARRIVALS = ("poisson", "azure", "mooncake")
METRICS = ("mean_jct_s", "p50_jct_s", "p99_jct_s", "short_p99_jct_s", "mean_ttft_s", "throughput_tok_s",
           "queued_share", "reordered_share")
DESIGN_REPLICAS = 100
AGING_S = (0.0, 15.0, 30.0, 60.0, 120.0, 300.0, 1e9)  # 0: FIFO; 1e9: pure shortest-first (no aging)
RANK_BY = ("mean", "p50", "p90")
REPLICA_CHOICES = ("power_of_two", "least_inflight")  # router.scheduling.replica_choice


def requests_for(replicas: int) -> int:
    """Enough requests per replica for a steady state at 10 replicas, and a bounded cost at 1,000."""
    return min(100_000, 2_000 * replicas)


def _keep(summary: dict) -> dict:
    return {k: summary.get(k) for k in METRICS}


def grid(setup: Setup, replicas=REPLICAS, loads=LOADS, arrivals=ARRIVALS, policies=GRID_POLICIES,
         workers: int = 2, seed: int = 0) -> dict:
    """{"<replicas>": {"<arrival>@<load>": {"<policy>": metrics}}}"""
    capacity = replica_capacity_rps(setup)
    jobs = [SimJob(r, p, sizing=LAYOUT[p], arrival=a, rps_per_replica=load * capacity, n=requests_for(r))
            for r in replicas for a in arrivals for load in loads for p in policies]
    out: dict = {}
    for job, summary in simulate_jobs(setup, jobs, seed=seed, workers=workers).items():
        load = round(job.rps_per_replica / capacity, 4)
        out.setdefault(str(job.replicas), {}).setdefault(f"{job.arrival}@{load:g}", {})[job.policy] = _keep(summary)
    return out


def design(setup: Setup, workers: int = 2, seed: int = 0, replicas: int = DESIGN_REPLICAS) -> dict:
    """The sweeps behind the router's defaults, at one cluster size, on queueing workloads."""
    capacity = replica_capacity_rps(setup)
    n = requests_for(replicas)

    def job(policy, arrival, load, **knobs):
        return SimJob(replicas, policy, sizing=LAYOUT[policy], arrival=arrival, rps_per_replica=load * capacity,
                      n=n, **knobs)

    queueing = [("poisson", 1.1), ("azure", 0.8)]
    jobs = {}
    for arrival, load in queueing:
        jobs[("baseline", arrival, load)] = job("ray_default", arrival, load)
        for policy in ("last_work", "estp_work", "oracle_work"):
            for s in AGING_S:
                jobs[("aging", arrival, load, policy, s)] = job(policy, arrival, load, max_overtake_s=s)
        for stat in RANK_BY:
            jobs[("rank_by", arrival, load, "last_work", stat)] = job("last_work", arrival, load, rank_by=stat)
    for load in (0.8, 0.95, 1.1):
        for policy in ("ray_default", "last_work", "oracle_work"):
            for choice in REPLICA_CHOICES:
                jobs[("replica_choice", "poisson", load, policy, choice)] = job(policy, "poisson", load,
                                                                                replica_choice=choice)
    done = simulate_jobs(setup, list(set(jobs.values())), seed=seed, workers=workers)
    out: dict = {"replicas": replicas, "requests": n, "baseline": {}, "aging": {}, "rank_by": {}, "replica_choice": {}}
    for key, j in jobs.items():
        kind, arrival, load, *rest = key
        where = f"{arrival}@{load:g}"
        if kind == "baseline":
            out["baseline"][where] = _keep(done[j])
            continue
        policy, knob = rest
        out[kind].setdefault(where, {}).setdefault(policy, {})[str(knob)] = _keep(done[j])
    return out


def merge(old: dict, new: dict) -> dict:
    """`new` runs over `old` ones, policy by policy."""
    out = {size: {w: dict(by_policy) for w, by_policy in by_w.items()} for size, by_w in old.items()}
    for size, by_w in new.items():
        for workload, by_policy in by_w.items():
            out.setdefault(size, {}).setdefault(workload, {}).update(by_policy)
    return out


BURST_REPLICAS = (2, 4, 10, 100)
BURST_POLICIES = ("ray_default", "last_work", "early_work", "ceiling", "oracle_work")
BURST_PER_SLOT = 4  # a burst of 4x the slots, as the real one (128 onto 32)
BURST_METRICS = ("mean_jct_s", "p50_jct_s", "p99_jct_s", "short_p99_jct_s", "mean_ttft_s", "throughput_tok_s")


def _burst_one(args) -> tuple[tuple, dict]:
    from benchmarks.replay.metrics import summarise
    from benchmarks.replay.trace import build_trace
    from benchmarks.simulator.experiment import run

    setup, replicas, policy, seed = args
    slots = replicas * setup.config.pools[0].deployment.get("max_ongoing_requests", 16)
    trace = build_trace(split=("val", "test"), n=BURST_PER_SLOT * slots, arrival="poisson", rate=1.0, seed=seed,
                        max_tokens=1024)
    trace = [r.model_copy(update={"arrival_s": 0.0}) for r in trace]
    summary = summarise(run(setup, trace, policy, replicas, "open", sizing="single", seed=seed,
                            bounded_queue=False).records, 8)
    return (replicas, policy, seed), {k: summary[k] for k in BURST_METRICS}


def bursts(setup: Setup, replicas=BURST_REPLICAS, policies=BURST_POLICIES, seeds: int = 10, workers: int = 2) -> dict:
    """{"<replicas>": {"<policy>": {metric: mean over seeds, "<metric>_range": [min, max]}}}: a burst
    of 4x the slots of the dataset's val and test prompts, each seed its own draw."""
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    jobs = [(setup, r, p, s) for r in replicas for p in policies for s in range(seeds)]
    by_cell: dict = {}
    with ProcessPoolExecutor(workers) as pool:
        for (r, p, s), m in tqdm(pool.map(_burst_one, jobs), total=len(jobs), desc="bursts"):
            by_cell.setdefault((r, p), {})[s] = m
    out: dict = {}
    for (r, p), per_seed in by_cell.items():
        cell = {k: float(np.mean([m[k] for m in per_seed.values()])) for k in BURST_METRICS}
        base = by_cell[(r, "ray_default")]
        for k in ("mean_jct_s", "short_p99_jct_s", "p99_jct_s"):  # change against FIFO, seed by seed
            changes = [per_seed[s][k] / base[s][k] - 1 for s in per_seed]
            cell[f"{k}_change"] = float(np.median(changes))
            cell[f"{k}_change_range"] = [float(min(changes)), float(max(changes))]
        out.setdefault(str(r), {})[p] = cell
    return out
