"""Scale runs: the same policies from 10 to 1,000 replicas at a constant offered load per replica.

Each cluster size gets its own seeded trace of `n` requests from the dataset's test split (the
predictor never trained on it) at `rps_per_replica` x replicas. Pools split the replicas evenly
(as ray_config.yaml's one replica each) or by their share of the decode work ("work" sizing, what
a deployer who knows the traffic would do). Every policy sees the identical trace; metrics are
the replay's own (benchmarks.replay.metrics).
"""

from __future__ import annotations

import time

from tqdm import tqdm

from benchmarks.replay.metrics import summarise
from benchmarks.replay.trace import build_trace
from benchmarks.simulator.experiment import run
from benchmarks.simulator.setup import Setup

POLICY_ORDER = ("round_robin", "ray_default", "input_length", "egtp", "estp", "oracle")


def replica_capacity_rps(setup: Setup, split: str = "test") -> float:
    """Requests/s one replica sustains when full (max_ongoing_requests decoding together), from
    the step-time model and the split's mean prompt and output lengths: each request costs its
    prefill plus its share of the full batch's decode steps."""
    from benchmarks.forelen.build import DEFAULT_OUT
    from predictor.dataset import load_samples

    rows = load_samples(DEFAULT_OUT, split=split)
    prompt = sum(r["prompt_tokens"] for r in rows) / len(rows)
    output = sum(r["output_tokens"] for r in rows) / len(rows)
    batch = min(setup.config.pools[0].deployment.get("max_ongoing_requests", 16), setup.limits.max_num_seqs)
    step = setup.model.step(batch, 0, batch * (prompt + output / 2))
    per_request = setup.model.step(0, prompt, prompt) + output * step / batch
    return 1 / per_request


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


_WORKER: dict = {}  # per worker process: the setup and the traces it built


def _init_worker(setup: Setup, n: int, rps_per_replica: float, split: str, seed: int) -> None:
    _WORKER.update(setup=setup, n=n, rps=rps_per_replica, split=split, seed=seed, traces={})


def _one(job: tuple[str, int, str, str, int, float]) -> tuple[tuple, dict]:
    sizing, r, mode, policy, batch_size, noise = job
    w = _WORKER
    if r not in w["traces"]:
        w["traces"][r] = build_trace(split=w["split"], n=w["n"], arrival="poisson", rate=w["rps"] * r, seed=w["seed"])
    start = time.perf_counter()
    records = run(w["setup"], w["traces"][r], policy, r, mode, batch_size, seed=w["seed"], load_rps=w["rps"] * r,
                  sizing=sizing, noise=noise).records
    summary = summarise(records, batch_size)
    summary["sim_wall_s"] = round(time.perf_counter() - start, 2)
    summary["fallback_share"] = sum(rec.routed_policy != policy for rec in records) / len(records)
    return job, summary


def simulate_jobs(setup: Setup, jobs: list[tuple], n: int, rps_per_replica: float, split: str = "test",
                  seed: int = 0, workers: int = 2) -> dict[tuple, dict]:
    """Summaries of (sizing, replicas, mode, policy, batch_size, oracle noise) runs, in parallel
    processes, each its own seeded copy of every trace (identical across processes)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, initializer=_init_worker,
                             initargs=(setup, n, rps_per_replica, split, seed)) as pool:
        return dict(tqdm(pool.map(_one, jobs), total=len(jobs), desc="simulate", unit="run"))


def scale_runs(setup: Setup, replicas: list[int], n: int, rps_per_replica: float, modes: list[str],
               batch_size: int, sizings: list[str], split: str = "test", seed: int = 0,
               policies=POLICY_ORDER, workers: int = 2) -> dict:
    """{sizing: {replicas: {mode: {"policies": {policy: metrics}, "gains": ...}}}}"""
    jobs = [(s, r, mode, p, batch_size, 0.0) for r in replicas for s in sizings for mode in modes for p in policies]
    results: dict = {}
    for (sizing, r, mode, policy, *_), summary in simulate_jobs(setup, jobs, n, rps_per_replica, split, seed,
                                                                workers).items():
        results.setdefault(sizing, {}).setdefault(str(r), {}).setdefault(mode, {})[policy] = summary
    for by_size in results.values():
        for by_mode in by_size.values():
            for mode, by_policy in by_mode.items():
                by_mode[mode] = {"policies": by_policy, "gains": gains(by_policy),
                                 "gains_vs_ray_default": gains(by_policy, "ray_default")}
    return results
