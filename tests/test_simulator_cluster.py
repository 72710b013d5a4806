"""The event loop's accounting and the router's own policies driving it (no Ray, no model)."""

import numpy as np
import pytest

from benchmarks.simulator.cluster import ClusterSpec, Workload, simulate
from benchmarks.simulator.engine import EngineLimits
from benchmarks.simulator.routing import SimRouter
from benchmarks.simulator.step_time import StepTimeModel
from router.length_bins import PoolBins
from router.policies import POLICIES

POOLS = ("short", "medium", "long")
BINS = PoolBins(POOLS, (50.0, 200.0))
MODEL = StepTimeModel(const=0.02, decode_seqs=0.002, prefill_tokens=0.0002, kv_tokens=1e-6)
LIMITS = EngineLimits(max_num_seqs=64, max_num_batched_tokens=512, kv_cache_tokens=20_000)


def _workload(n=400, rate=20.0, seed=0) -> Workload:
    from router.policies import Job

    rng = np.random.default_rng(seed)
    outputs = rng.integers(1, 600, n)
    prompts = rng.integers(5, 400, n)
    jobs = [Job(prompt_tokens=int(p), true_tokens=int(o),
                prediction={"bin": BINS.pool_of(o), "expected_tokens": float(o)}) for p, o in zip(prompts, outputs)]
    return Workload(np.cumsum(rng.exponential(1 / rate, n)), prompts, outputs, np.full(n, 1024), jobs)


def _spec(mode="continuous", replicas=(2, 2, 3), max_ongoing=8):
    return ClusterSpec(pools=list(POOLS), replicas=dict(zip(POOLS, replicas)), max_ongoing_requests=max_ongoing,
                       mode=mode, batch_size=4)


def _router(policy, spec, spillover=True):
    return SimRouter(policy, "input_length", BINS, [100, 250], spec.replicas, spec.capacities(), spillover, 4096)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("mode", ["continuous", "batch"])
def test_every_request_finishes_exactly_once_after_its_first_token(policy, mode):
    workload, spec = _workload(), _spec(mode)
    router = _router(policy, spec)
    out = simulate(workload, router, spec, LIMITS, MODEL)
    assert not np.isnan(out.finish).any() and not np.isnan(out.first_token).any()
    assert (out.first_token > workload.arrival).all() and (out.finish >= out.first_token).all()
    assert all(router.load.inflight(p) == 0 for p in POOLS)  # every acquire was released
    if mode == "batch":
        members = sorted(i for g in out.groups for i in g)
        assert members == list(range(len(workload)))  # each request decoded in exactly one batch
        assert max(len(g) for g in out.groups) <= spec.batch_size


def test_decode_time_covers_every_generated_token():
    """A lone replica at one sequence at a time: the last finish is the sum of all step times."""
    workload = _workload(n=30, rate=1000.0)
    spec = ClusterSpec(pools=["only"], replicas={"only": 1}, max_ongoing_requests=1)
    router = SimRouter("round_robin", "input_length", PoolBins(("only",), ()), [], {"only": 1}, {"only": 1}, True, 4096)
    out = simulate(workload, router, spec, LIMITS, MODEL)
    expected = workload.arrival[0]
    for p, o in zip(workload.prompt_tokens, workload.output_tokens):
        chunks = [min(LIMITS.max_num_batched_tokens, p - k) for k in range(0, p, LIMITS.max_num_batched_tokens)]
        done = 0
        for c in chunks:
            done += c
            expected += MODEL.step(0, c, done)
        expected += MODEL.decode_run(1, p + 1, o - 1)
    assert out.finish.max() == pytest.approx(expected)


def test_the_router_classes_decide_and_the_oracle_lands_every_request_in_its_true_pool():
    workload, spec = _workload(rate=2.0), _spec(replicas=(4, 4, 4), max_ongoing=64)
    router = _router("oracle", spec)
    assert isinstance(router.decider.chain.policies["oracle"], POLICIES["oracle"])
    out = simulate(workload, router, spec, LIMITS, MODEL)
    true_pools = [POOLS.index(BINS.pool_of(o)) for o in workload.output_tokens]
    assert out.pool.tolist() == true_pools
    assert set(out.decided_by) == {"oracle"}


def test_round_robin_spreads_requests_evenly_over_the_pools():
    workload, spec = _workload(n=300), _spec(max_ongoing=1000)
    out = simulate(workload, _router("round_robin", spec), spec, LIMITS, MODEL)
    assert np.bincount(out.pool).tolist() == [100, 100, 100]


def test_a_saturated_pool_spills_to_its_neighbour():
    """Everything predicted short, one slot in the short pool: the rest spill to medium (PoolLoad.spill)."""
    from router.policies import Job

    n = 6
    jobs = [Job(prompt_tokens=10, prediction={"bin": "short", "expected_tokens": 10.0}) for _ in range(n)]
    workload = Workload(np.zeros(n), np.full(n, 10), np.full(n, 100), np.full(n, 1024), jobs)
    spec = _spec(replicas=(1, 1, 1), max_ongoing=1)
    out = simulate(workload, _router("estp", spec), spec, LIMITS, MODEL)
    assert out.pool.tolist()[:3] == [0, 1, 2]  # short, its neighbour, then the far one
    assert set(out.pool.tolist()[3:]) == {0}  # all full: stays with its own pool and queues


def test_ray_default_reads_in_flight_counts_through_the_shared_pool_load():
    workload, spec = _workload(n=200, rate=50.0), _spec(replicas=(1, 1, 10), max_ongoing=1000)
    out = simulate(workload, _router("ray_default", spec), spec, LIMITS, MODEL)
    counts = np.bincount(out.pool, minlength=3)
    assert counts[2] > counts[0] + counts[1]  # the pool with most replicas draws most requests


def _single_pool(policy, order, n=300, rate=40.0, replica_choice="pow2"):
    from router.admission import QueueOrder

    workload = _workload(n=n, rate=rate)
    spec = ClusterSpec(pools=["one"], replicas={"one": 3}, max_ongoing_requests=4, replica_choice=replica_choice)
    router = SimRouter(policy, "round_robin", PoolBins(("one",), ()), [], spec.replicas, spec.capacities(), True,
                       4096, order=QueueOrder(max_overtake_s=order))
    return workload, router, simulate(workload, router, spec, LIMITS, MODEL)


def test_work_policies_order_the_shared_queue_shortest_first_within_the_aging_bound():
    workload, _, fifo = _single_pool("ray_default", order=30.0)
    _, router, sjf = _single_pool("oracle_work", order=30.0)
    jct = lambda out: (out.finish - workload.arrival)
    assert jct(sjf).mean() < 0.9 * jct(fifo).mean()  # overloaded: shortest-first pays
    stats = router.load.queues["one"].stats
    assert stats.queued > 0 and stats.reordered > 0


@pytest.mark.parametrize("choice", ["pow2", "least_inflight", "pow2_work", "pow2_running"])
def test_every_replica_choice_serves_every_request(choice):
    workload, router, out = _single_pool("oracle_work", order=30.0, replica_choice=choice)
    assert not np.isnan(out.finish).any()
    assert router.load.inflight("one") == 0
