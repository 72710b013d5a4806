"""Scale runs: the same policies from 10 to 1,000 replicas at a constant offered load per replica.

Each cluster size gets its own seeded trace of `n` requests from the dataset's test split (the
predictor never trained on it) at `rps_per_replica` x replicas. Pools split the replicas evenly
(as ray_config.yaml's one replica each) or by their share of the decode work ("work" sizing, what
a deployer who knows the traffic would do). Every policy sees the identical trace; metrics are
the replay's own (benchmarks.replay.metrics).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tqdm import tqdm

from benchmarks.replay.metrics import summarise
from benchmarks.replay.trace import build_trace
from benchmarks.simulator.experiment import run
from benchmarks.simulator.setup import Setup

def replica_capacity_rps(setup: Setup, split: str = "test", replicas: int = 10, per_replica: int = 300,
                         seed: int = 0) -> float:
    """Requests/s one replica sustains with every slot busy, measured on the modelled engines: a
    backlog of the split's requests on `replicas` replicas of one pool (Ray's default policy,
    unbounded queue), completions per second over the middle 80% of them.

    Measured rather than computed from mean lengths: a long prompt's prefill stalls the decodes
    that share its steps, which a formula on averages misses (it overstated capacity by 14%).
    """
    trace = build_trace(split=split, n=replicas * per_replica, arrival="poisson", rate=1e6, seed=seed)
    records = run(setup, trace, "ray_default", replicas, "open", sizing="single", bounded_queue=False).records
    finishes = sorted(r.finish_s for r in records)
    lo, hi = len(finishes) // 10, 9 * len(finishes) // 10
    return (hi - lo) / (finishes[hi] - finishes[lo]) / replicas


def gains(by_policy: dict[str, dict], baseline: str = "round_robin") -> dict[str, dict]:
    """Per policy against the baseline: JCT and padding reductions, throughput ratio, and the
    share of the oracle's JCT reduction it reaches (1.0: as good as knowing every length)."""
    base, oracle = by_policy[baseline], by_policy.get("oracle")
    out = {}
    for policy, m in by_policy.items():
        g = {"jct_mean_reduction": 1 - m["mean_jct_s"] / base["mean_jct_s"],
             "throughput_ratio": m["throughput_tok_s"] / base["throughput_tok_s"]}
        if m.get("padding_ratio") is not None and base.get("padding_ratio"):
            g["padding_reduction"] = 1 - m["padding_ratio"] / base["padding_ratio"]
        oracle_gain = None if oracle is None else base["mean_jct_s"] - oracle["mean_jct_s"]
        if oracle_gain and oracle_gain > 0:
            g["share_of_oracle_gain"] = (base["mean_jct_s"] - m["mean_jct_s"]) / oracle_gain
        out[policy] = g
    return out


@dataclass(frozen=True)
class SimJob:
    """One simulated run: a cluster, a policy, a trace (arrival process and offered load)."""

    replicas: int
    policy: str
    mode: str = "open"
    sizing: str = "even"
    batch_size: int = 8
    noise: float = 0.0  # blurs the oracle (benchmarks.simulator.workload)
    arrival: str = "poisson"
    rps_per_replica: float = 0.1
    n: int = 100_000
    max_overtake_s: float | None = None  # None: the configured queue order (router.queue)
    rank_by: str | None = None  # None: the configured router.rank_by
    replica_choice: str | None = None  # None: the configured router.replica_choice


_WORKER: dict = {}  # per worker process: the setup and the traces it built


def _init_worker(setup: Setup, split: str, seed: int) -> None:
    _WORKER.update(setup=setup, split=split, seed=seed, traces={})


def _one(job: SimJob) -> tuple[SimJob, dict]:
    w, setup = _WORKER, _WORKER["setup"]
    rate = job.rps_per_replica * job.replicas
    key = (job.replicas, job.arrival, rate, job.n)
    if key not in w["traces"]:
        w["traces"][key] = build_trace(split=w["split"], n=job.n, arrival=job.arrival, rate=rate, seed=w["seed"])
    start = time.perf_counter()
    sim = run(setup, w["traces"][key], job.policy, job.replicas, job.mode, job.batch_size, seed=w["seed"],
              load_rps=rate, sizing=job.sizing, noise=job.noise, max_overtake_s=job.max_overtake_s,
              rank_by=job.rank_by, replica_choice=job.replica_choice)
    summary = summarise(sim.records, job.batch_size)
    summary["sim_wall_s"] = round(time.perf_counter() - start, 2)
    summary["fallback_share"] = sum(rec.routed_policy != job.policy for rec in sim.records) / len(sim.records)
    queued = sum(q.queued for q in sim.queues.values())
    summary["queued_share"] = queued / len(sim.records)
    summary["reordered_share"] = sum(q.reordered for q in sim.queues.values()) / max(1, queued)
    return job, summary


def simulate_jobs(setup: Setup, jobs: list[SimJob], split: str = "test", seed: int = 0,
                  workers: int = 2) -> dict[SimJob, dict]:
    """Summaries of the runs, in parallel processes, each its own seeded copy of every trace
    (identical across processes and policies)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(setup, split, seed)) as pool:
        return dict(tqdm(pool.map(_one, jobs), total=len(jobs), desc="simulate", unit="run"))
