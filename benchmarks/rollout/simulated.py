"""Rollout schedules at 10 / 100 / 1,000 replicas in the simulator, with the router's own queue and
replica-choice code (benchmarks.simulator).

A batch is every request at t = 0: `makespan` runs it on continuous-batching engines (the queue
longest-predicted-first, the replica with the least predicted work), `padding` on batch-synchronous
engines (the queue sorted by predicted length, so each replica's next group is the next `batch_size`
similar lengths). Length-blind baselines keep the batch's order: round-robin over replicas, or Ray's
power of two choices. Batches: RL (the test split's RL prompts, 8 samples each) and mixed (every
scenario's test samples), `PER_REPLICA` requests per replica (resampled).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from tqdm import tqdm

from benchmarks.replay.trace import build_trace
from benchmarks.rollout.metrics import batch_metrics
from benchmarks.simulator.experiment import run
from benchmarks.simulator.setup import Setup

PER_REPLICA = 80
REPLICAS = (10, 100, 1000)
BATCHES = {"rl": ["rl"], "mixed": None}
BATCH_SIZE = 8
# name -> (router policy, replica choice under the makespan schedule, ranked by length, siblings)
POLICIES = {
    "round_robin": ("round_robin", "round_robin", False, False),
    "ray_default": ("ray_default", "pow2", False, False),
    "egtp": ("egtp_work", "least_work", True, False),
    "estp": ("estp_work", "least_work", True, False),
    "estp+siblings": ("estp_work", "least_work", True, True),
    "last": ("last_work", "least_work", True, False),
    "ceiling": ("ceiling", "least_work", True, False),
    "oracle": ("oracle_work", "least_work", True, False),
}
# A full scan over 1,000 replicas per dispatch is too slow to simulate 80,000 requests here: two
# sampled replicas, the one with less predicted work, stand for it at that size.
SCAN_LIMIT = 100


def _one(args) -> tuple[tuple, dict]:
    setup, size, batch, name, schedule = args
    policy, choice, ranked, siblings = POLICIES[name]
    trace = build_trace(split="test", n=PER_REPLICA * size, arrival="poisson", rate=1.0, seed=0,
                        scenarios=BATCHES[batch])
    if schedule == "makespan":
        order = replace(setup.queue_order, max_overtake_s=1.0, longest_first=True) if ranked else \
            replace(setup.queue_order, max_overtake_s=0.0)
        if choice == "least_work" and size > SCAN_LIMIT:
            choice = "pow2_work"
        sim = run(setup, trace, policy, size, "rollout", sizing="single", replica_choice=choice, order=order,
                  siblings=siblings)
    else:
        order = replace(setup.queue_order, max_overtake_s=1e9 if ranked else 0.0, longest_first=False)
        sim = run(setup, trace, policy, size, "batch", batch_size=BATCH_SIZE, sizing="single",
                  replica_choice="round_robin" if policy == "round_robin" else "pow2", order=order,
                  siblings=siblings)
    ok = [(r, k) for r, k in zip(sim.records, sim.replica) if r.status == "ok"]
    metrics = batch_metrics([r.finish_s for r, _ in ok], [r.completion_tokens for r, _ in ok], [k for _, k in ok],
                            [r.group for r, _ in ok] if schedule == "padding" else None)
    return (size, batch, name, schedule), metrics


def grid(setup: Setup, replicas=REPLICAS, batches=tuple(BATCHES), policies=tuple(POLICIES),
         schedules=("makespan", "padding"), workers: int = 2) -> dict:
    """{"<replicas>": {"<batch>": {"<schedule>": {"<policy>": metrics}}}}"""
    jobs = [(setup, r, b, p, s) for r in replicas for b in batches for s in schedules for p in policies]
    out: dict = {}
    with ProcessPoolExecutor(workers) as pool:
        for (size, batch, name, schedule), m in tqdm(pool.map(_one, jobs), total=len(jobs), desc="rollouts"):
            out.setdefault(str(size), {}).setdefault(batch, {}).setdefault(schedule, {})[name] = m
    return out
