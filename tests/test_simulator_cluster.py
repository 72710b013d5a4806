"""The event loop's accounting, driven by the router's own scheduling core (no Ray, no model)."""

import asyncio
import random

import numpy as np
import pytest

from benchmarks.simulator.cluster import ClusterSpec, simulate, simulate_rollout
from benchmarks.simulator.engine import EngineLimits
from benchmarks.simulator.step_time import StepTimeModel
from benchmarks.simulator.workload import Workload
from router.scheduling.admission import QueueOrder
from router.scheduling.policies import POLICIES
from router.scheduling.pools import Pools
from router.scheduling.request import Prediction, Request
from router.scheduling.scheduler import Scheduler

POOLS = ("short", "medium", "long")
EDGES = Pools(POOLS, (50.0, 200.0))
MODEL = StepTimeModel(const=0.02, decode_seqs=0.002, prefill_tokens=0.0002, kv_tokens=1e-6)
LIMITS = EngineLimits(max_num_seqs=64, max_num_batched_tokens=512, kv_cache_tokens=20_000)


def _workload(policy="round_robin", n=400, rate=20.0, seed=0, arrivals=None) -> Workload:
    rng = np.random.default_rng(seed)
    outputs = rng.integers(1, 600, n)
    prompts = rng.integers(5, 400, n)
    times = np.cumsum(rng.exponential(1 / rate, n)) if arrivals is None else arrivals
    requests = [Request(f"r{i}", policy, arrival=float(t), prompt_tokens=int(p), told_tokens=int(o), max_tokens=1024,
                        prediction=Prediction("estp", float(o), {}, EDGES.pool_of(o), {}))
                for i, (t, p, o) in enumerate(zip(times, prompts, outputs))]
    return Workload(requests, outputs)


def _spec(mode="continuous", replicas=(2, 2, 3), max_ongoing=8, **kwargs):
    return ClusterSpec(pools=list(POOLS), replicas=dict(zip(POOLS, replicas)), max_ongoing_requests=max_ongoing,
                       mode=mode, batch_size=4, **kwargs)


def _scheduler(policy, spec, pools=EDGES, order=QueueOrder(), spillover=True):
    several = len(pools.names) > 1
    return Scheduler(pools, spec.capacities(), [policy], "input_length" if several else "ray_default",
                     input_edges=[100, 250] if several else (), replicas=spec.replicas, order=order,
                     spillover=spillover, rng=random.Random(0))


def _pool_index(workload):
    return [POOLS.index(r.pool) for r in workload.requests]


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("mode", ["continuous", "batch"])
def test_every_request_finishes_exactly_once_after_its_first_token(policy, mode):
    spec = _spec(mode)
    workload = _workload(policy)
    scheduler = _scheduler(policy, spec)
    out = simulate(workload, scheduler, spec, LIMITS, MODEL, 4096)
    arrival = np.array([r.arrival for r in workload.requests])
    assert not np.isnan(out.finish).any() and not np.isnan(out.first_token).any()
    assert (out.first_token > arrival).all() and (out.finish >= out.first_token).all()
    assert all(scheduler.inflight(p) == 0 for p in POOLS)  # every slot taken was given back
    assert all(r.decided_by is not None and r.replica is not None for r in workload.requests)
    if mode == "batch":
        members = sorted(i for g in out.groups for i in g)
        assert members == list(range(len(workload)))  # each request decoded in exactly one batch
        assert max(len(g) for g in out.groups) <= spec.batch_size


def test_decode_time_covers_every_generated_token():
    """A lone replica at one sequence at a time: the last finish is the sum of all step times."""
    workload = _workload(n=30, rate=1000.0)
    spec = ClusterSpec(pools=["only"], replicas={"only": 1}, max_ongoing_requests=1)
    scheduler = Scheduler(Pools(("only",), ()), {"only": 1}, ["round_robin"], "round_robin")
    out = simulate(workload, scheduler, spec, LIMITS, MODEL, 4096)
    expected = workload.requests[0].arrival
    for r, o in zip(workload.requests, workload.output_tokens):
        p = r.prompt_tokens
        chunks = [min(LIMITS.max_num_batched_tokens, p - k) for k in range(0, p, LIMITS.max_num_batched_tokens)]
        done = 0
        for c in chunks:
            done += c
            expected += MODEL.step(0, c, done)
        expected += MODEL.decode_run(1, p + 1, o - 1)
    assert out.finish.max() == pytest.approx(expected)


def test_the_oracle_lands_every_request_in_its_true_pool():
    spec = _spec(replicas=(4, 4, 4), max_ongoing=64)
    workload = _workload("oracle", rate=2.0)
    simulate(workload, _scheduler("oracle", spec), spec, LIMITS, MODEL, 4096)
    assert _pool_index(workload) == [POOLS.index(EDGES.pool_of(o)) for o in workload.output_tokens]
    assert {r.decided_by for r in workload.requests} == {"oracle"}


def test_round_robin_spreads_requests_evenly_over_the_pools():
    spec = _spec(max_ongoing=1000)
    workload = _workload(n=300)
    simulate(workload, _scheduler("round_robin", spec), spec, LIMITS, MODEL, 4096)
    assert np.bincount(_pool_index(workload)).tolist() == [100, 100, 100]


def test_a_saturated_pool_spills_to_its_neighbour():
    """Everything predicted short, one slot per pool: the rest spill (Scheduler.spill)."""
    n = 6
    requests = [Request(f"r{i}", "estp", prompt_tokens=10, prediction=Prediction("estp", 10.0, {}, "short", {}))
                for i in range(n)]
    workload = Workload(requests, np.full(n, 100))
    spec = _spec(replicas=(1, 1, 1), max_ongoing=1)
    simulate(workload, _scheduler("estp", spec), spec, LIMITS, MODEL, 4096)
    assert _pool_index(workload)[:3] == [0, 1, 2]  # short, its neighbour, then the far one
    assert set(_pool_index(workload)[3:]) == {0}  # all full: stays with its own pool and queues


def test_ray_default_reads_in_flight_counts_from_the_scheduler():
    spec = _spec(replicas=(1, 1, 10), max_ongoing=1000)
    workload = _workload("ray_default", n=200, rate=50.0)
    simulate(workload, _scheduler("ray_default", spec), spec, LIMITS, MODEL, 4096)
    counts = np.bincount(_pool_index(workload), minlength=3)
    assert counts[2] > counts[0] + counts[1]  # the pool with most replicas draws most requests


def _single_pool(policy, order, n=300, rate=40.0, choice="least_inflight"):
    workload = _workload(policy, n=n, rate=rate)
    spec = ClusterSpec(pools=["one"], replicas={"one": 3}, max_ongoing_requests=4, replica_choice=choice)
    scheduler = _scheduler(policy, spec, Pools(("one",), ()), QueueOrder(max_overtake_s=order))
    return workload, scheduler, simulate(workload, scheduler, spec, LIMITS, MODEL, 4096)


def test_work_policies_order_the_shared_queue_shortest_first_within_the_aging_bound():
    workload, _, fifo = _single_pool("ray_default", order=30.0)
    _, scheduler, sjf = _single_pool("oracle_work", order=30.0)
    arrival = np.array([r.arrival for r in workload.requests])
    assert (sjf.finish - arrival).mean() < 0.9 * (fifo.finish - arrival).mean()  # overloaded: shortest-first pays
    stats = scheduler.queues["one"].stats
    assert stats.queued > 0 and stats.reordered > 0


@pytest.mark.parametrize("choice", ["least_inflight", "power_of_two"])
def test_every_replica_choice_serves_every_request(choice):
    workload, scheduler, out = _single_pool("oracle_work", order=30.0, choice=choice)
    assert not np.isnan(out.finish).any() and scheduler.inflight("one") == 0
    assert set(out.replica.tolist()) == {0, 1, 2}


def _samples(lengths: list[int]) -> Workload:
    requests = [Request(f"s{i}", "rollout", told_tokens=n, prompt_tokens=20, pool="one") for i, n in enumerate(lengths)]
    return Workload(requests, np.array(lengths))


def test_a_simulated_makespan_rollout_starts_longest_first_on_the_least_loaded_replica():
    lengths = [100, 10, 50, 70, 30, 90]
    spec = ClusterSpec(pools=["one"], replicas={"one": 2}, max_ongoing_requests=2)
    workload = _samples(lengths)
    out = simulate_rollout(workload, "makespan", spec, LIMITS, MODEL)
    by_start = sorted(workload.requests, key=lambda r: (r.dispatched_at, -r.told_tokens))
    assert [r.told_tokens for r in by_start[:4]] == [100, 90, 70, 50]  # the four slots, longest first
    assert [out.replica[int(r.id[1:])] for r in by_start[:4]] == [0, 1, 1, 0]  # LPT: least predicted work
    assert not np.isnan(out.finish).any()


def test_the_simulator_and_the_router_place_a_makespan_rollout_alike():
    """One plan, two drivers: the first slots go to the same samples on the same replicas."""
    from router.serving.gate import Gate
    from router.serving.pool_client import PoolClient
    from router.serving.replica_ledger import ReplicaLedger
    from router.serving.rollout import RolloutRequest, RolloutRunner
    from tests.fakes import FakePool

    lengths = [100, 10, 50, 70]
    spec = ClusterSpec(pools=["one"], replicas={"one": 2}, max_ongoing_requests=2)
    workload = _samples(lengths)
    simulated = simulate_rollout(workload, "makespan", spec, LIMITS, MODEL)
    sim_order = [(r.told_tokens, int(simulated.replica[int(r.id[1:])]))
                 for r in sorted(workload.requests, key=lambda r: (r.dispatched_at, -r.told_tokens))]

    ledger = ReplicaLedger()
    fake = FakePool(ledger, replicas=["0", "1"], tokens=lambda body: int(body.messages[0]["content"]))
    gate = Gate(Scheduler(Pools(("one",), ()), {"one": 4}, ["ray_default"], "ray_default"))

    async def render(request, body, kind):
        return [1], ""

    runner = RolloutRunner(PoolClient("one", fake, ledger), gate, None, render, 100, 2)
    prompts = [str(n) for n in lengths]
    out = asyncio.run(runner.run(RolloutRequest(model="m", prompts=prompts, max_tokens=500, schedule="makespan",
                                                known_tokens=[[n] for n in lengths])))
    real_order = [(s["completion_tokens"], int(s["replica"])) for s in sorted(out["samples"],
                                                                              key=lambda s: s["dispatched_s"])]
    assert real_order == sim_order == [(100, 0), (70, 1), (50, 1), (10, 0)]


def test_a_simulated_padding_rollout_runs_similar_lengths_together_one_group_per_replica():
    lengths = [80, 10, 70, 20, 60, 30, 50, 40]
    spec = ClusterSpec(pools=["one"], replicas={"one": 2}, max_ongoing_requests=8)
    workload = _samples(lengths)
    out = simulate_rollout(workload, "padding", spec, LIMITS, MODEL, batch_size=2)
    assert sorted(sorted(int(workload.output_tokens[i]) for i in g) for g in out.groups) == [
        [10, 20], [30, 40], [50, 60], [70, 80]]
    for k in (0, 1):  # a replica's next group starts after its previous group ended
        lane = sorted((r for r in workload.requests if out.replica[int(r.id[1:])] == k), key=lambda r: r.dispatched_at)
        for before, after in zip(lane, lane[1:]):
            if before.group != after.group:
                assert after.dispatched_at >= max(out.finish[int(r.id[1:])] for r in lane if r.group == before.group)


def test_a_simulated_first_k_rollout_cuts_each_prompts_tail_in_the_engines():
    """Two prompts x 4 samples, k = 2: each prompt's two shortest finish, the others end when the
    second does (aborted mid-decode, their slots given back), so the rollout ends far sooner."""
    lengths = [20, 30, 400, 500, 25, 35, 450, 480]
    spec = ClusterSpec(pools=["one"], replicas={"one": 2}, max_ongoing_requests=4)

    def run(k):
        workload = _samples(lengths)
        for i, r in enumerate(workload.requests):
            r.family = i // 4
        return workload, simulate_rollout(workload, "fifo", spec, LIMITS, MODEL, k=k)

    full_workload, full = run(None)
    cut_workload, cut = run(2)
    assert [r.finish_reason for r in cut_workload.requests].count("cut") == 4
    for r in cut_workload.requests:
        if r.finish_reason == "cut":
            assert r.completion_tokens < r.told_tokens  # stopped mid-decode, not run to its length
    assert cut.finish.max() < 0.5 * full.finish.max()
    assert all(r.finish_reason != "cut" for r in full_workload.requests)
