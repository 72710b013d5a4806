"""The accuracy sweep's parts: the blurred oracle, its pool accuracy, the break-even point (no Ray, no model)."""

import pytest

from benchmarks.simulator.experiment import run
from benchmarks.simulator.sweep import break_even, pool_accuracy
from benchmarks.simulator.workload import oracle_tokens
from tests.sim_setup import tiny_setup, tiny_trace


def test_the_blurred_oracle_is_seeded_and_exact_without_noise():
    trace = tiny_trace(400)
    true = [r.true_output_tokens for r in trace]
    assert oracle_tokens(trace) == true
    blurred = oracle_tokens(trace, noise=0.5, seed=1)
    assert blurred == oracle_tokens(trace, noise=0.5, seed=1)
    assert blurred != oracle_tokens(trace, noise=0.5, seed=2)
    assert min(blurred) >= 1
    assert sum(b > t for b, t in zip(blurred, true)) == pytest.approx(len(true) / 2, rel=0.2)  # median factor 1


def test_pool_accuracy_falls_from_one_as_the_noise_grows():
    setup, trace = tiny_setup(), tiny_trace(400)
    accuracy = [pool_accuracy(setup, trace, "oracle", s, seed=0) for s in (0.0, 0.5, 2.5)]
    assert accuracy[0] == 1.0
    assert accuracy[0] > accuracy[1] > accuracy[2]
    assert accuracy[2] < 0.6


def test_the_simulator_routes_on_the_blurred_lengths():
    setup, trace = tiny_setup(), tiny_trace(200)
    pool_of = setup.plan.pools.pool_of
    for noise in (0.0, 1.0):
        routed = {r.request_id: r.pool for r in run(setup, trace, "oracle", 3, "batch", batch_size=4, noise=noise).records}
        in_true_pool = sum(routed[r.request_id] == pool_of(r.true_output_tokens) for r in trace) / len(trace)
        assert in_true_pool == pytest.approx(pool_accuracy(setup, trace, "oracle", noise, seed=0))


def _point(accuracy, gain):
    return {"pool_accuracy": accuracy, "gains": {"round_robin": {"jct_mean_reduction": gain}}}


def test_break_even_interpolates_where_the_gain_turns_positive():
    points = [_point(0.9, 0.2), _point(0.3, -0.1), _point(0.6, 0.1)]  # any order
    assert break_even(points, "round_robin") == pytest.approx(0.45)
    assert break_even([_point(0.3, -0.2), _point(0.9, -0.05)], "round_robin") is None
