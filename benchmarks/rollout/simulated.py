"""Rollout schedules at 10 / 100 / 1,000 replicas in the simulator, through the router's own rollout
plans (router.scheduling.rollout_plans) and replica choice (benchmarks.simulator).

A batch is every sample at t = 0. `makespan` takes the longest estimate first onto the replica with
the least predicted work; `padding` runs groups of similar estimates, one group per replica at a
time. The length-blind baseline (`ray_default`) keeps the batch's order: fifo under makespan's
column, groups in batch order under padding's. Batches: RL (the test split's RL prompts, 8 samples
each) and mixed (every scenario's test samples), `PER_REPLICA` requests per replica (resampled).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

from tqdm import tqdm

from benchmarks.replay.trace import build_trace
from benchmarks.rollout.metrics import batch_metrics
from benchmarks.simulator.experiment import run
from benchmarks.simulator.setup import Setup

PER_REPLICA = 80
REPLICAS = (10, 100, 1000)
BATCHES = {"rl": ["rl"], "mixed": None}
BATCH_SIZE = 8
# run name -> (the policy whose lengths the plan reads, siblings)
RUNS = {
    "ray_default": ("ray_default", False),
    "egtp": ("egtp_work", False),
    "estp": ("estp_work", False),
    "estp+siblings": ("estp_work", True),
    "last": ("last_work", False),
    "ceiling": ("ceiling", False),
    "oracle": ("oracle_work", False),
}


def _one(args) -> tuple[tuple, dict]:
    setup, size, batch, name, schedule = args
    policy, siblings = RUNS[name]
    trace = build_trace(split="test", n=PER_REPLICA * size, arrival="poisson", rate=1.0, seed=0,
                        scenarios=BATCHES[batch])
    mode = "fifo" if name == "ray_default" and schedule == "makespan" else schedule
    sim = run(setup, trace, policy, size, mode, batch_size=BATCH_SIZE, siblings=siblings)
    ok = [(r, k) for r, k in zip(sim.records, sim.replica) if r.status == "ok"]
    metrics = batch_metrics([r.finish_s for r, _ in ok], [r.completion_tokens for r, _ in ok], [k for _, k in ok],
                            [r.group for r, _ in ok] if schedule == "padding" else None)
    return (size, batch, name, schedule), metrics


def grid(setup: Setup, replicas=REPLICAS, batches=tuple(BATCHES), policies=tuple(RUNS),
         schedules=("makespan", "padding"), workers: int = 2) -> dict:
    """{"<replicas>": {"<batch>": {"<schedule>": {"<policy>": metrics}}}}"""
    jobs = [(setup, r, b, p, s) for r in replicas for b in batches for s in schedules for p in policies]
    out: dict = {}
    with ProcessPoolExecutor(workers) as pool:
        for (size, batch, name, schedule), m in tqdm(pool.map(_one, jobs), total=len(jobs), desc="rollouts"):
            out.setdefault(str(size), {}).setdefault(batch, {}).setdefault(schedule, {})[name] = m
    return out
