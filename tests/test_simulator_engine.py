"""The simulator's engine and event loop against hand-computed schedules (no Ray, no model)."""

import numpy as np
import pytest

from benchmarks.replay.metrics import padding_ratio
from benchmarks.simulator.cluster import ClusterSpec, simulate
from benchmarks.simulator.engine import EngineLimits
from benchmarks.simulator.step_time import StepTimeModel
from benchmarks.simulator.workload import Workload
from router.scheduling.pools import Pools
from router.scheduling.request import Request
from router.scheduling.scheduler import Scheduler

ONE_SECOND_STEPS = StepTimeModel(const=1.0, decode_seqs=0.0, prefill_tokens=0.0, kv_tokens=0.0)
LIMITS = EngineLimits(max_num_seqs=8, max_num_batched_tokens=100, kv_cache_tokens=10_000)


def _one_replica(arrivals, outputs, prompts=None, mode="continuous", batch_size=4, limits=LIMITS,
                 model=ONE_SECOND_STEPS):
    prompts = prompts or [10] * len(arrivals)
    spec = ClusterSpec(pools=["only"], replicas={"only": 1}, max_ongoing_requests=16, mode=mode, batch_size=batch_size)
    return simulate(_workload(arrivals, prompts, outputs), _scheduler(spec), spec, limits, model, 4096)


def _workload(arrivals, prompts, outputs) -> Workload:
    return Workload([Request(f"r{i}", "round_robin", arrival=t, prompt_tokens=p)
                     for i, (t, p) in enumerate(zip(arrivals, prompts))], np.array(outputs))


def _scheduler(spec: ClusterSpec) -> Scheduler:
    return Scheduler(Pools(("only",), ()), spec.capacities(), ["round_robin"], "round_robin")


def test_a_request_arriving_during_a_prefill_joins_at_the_next_step():
    # t=0-1 prefill A (A's first token); 1-2 A decodes while B prefills; 2-3 both decode, both done.
    out = _one_replica([0.0, 0.5], [3, 2])
    assert out.first_token.tolist() == [1.0, 2.0]
    assert out.finish.tolist() == [3.0, 3.0]


def test_an_arrival_cuts_a_run_of_decode_steps_at_the_next_boundary():
    # A decodes steps 1..10; B arrives at 3.5, joins at the boundary t=4, prefills 4-5, decodes 5-6.
    out = _one_replica([0.0, 3.5], [10, 2])
    assert out.first_token.tolist() == [1.0, 5.0]
    assert out.finish.tolist() == [10.0, 6.0]


def test_decode_runs_are_timed_with_the_growing_kv_cache():
    model = StepTimeModel(const=0.0, decode_seqs=0.0, prefill_tokens=0.01, kv_tokens=0.001)
    out = _one_replica([0.0], [4], prompts=[100], model=model)
    # prefill: 100 tokens x 0.01 + kv 100 x 0.001; decodes with 101, 102, 103 tokens cached.
    prefill = 1.0 + 0.1
    assert out.first_token[0] == pytest.approx(prefill)
    assert out.finish[0] == pytest.approx(prefill + 0.001 * (101 + 102 + 103))


def test_long_prompts_are_prefilled_in_chunks_of_the_token_budget():
    out = _one_replica([0.0], [1], prompts=[250])  # 100 + 100 + 50 tokens: three steps
    assert out.first_token[0] == 3.0 and out.finish[0] == 3.0


def test_the_running_limit_holds_back_requests_until_a_slot_frees():
    limits = EngineLimits(max_num_seqs=1, max_num_batched_tokens=100, kv_cache_tokens=10_000)
    out = _one_replica([0.0, 0.0], [2, 2], limits=limits)
    assert out.finish.tolist() == [2.0, 4.0]


def test_batch_mode_admits_nobody_until_the_whole_batch_is_done():
    out = _one_replica([0.0, 0.0, 0.5, 0.5, 0.6], [3, 5, 2, 2, 1], mode="batch", batch_size=4)
    # t=0 the idle replica takes the two requests present (0-5); the rest wait for it: 5-7.
    assert out.groups == [[0, 1], [2, 3, 4]]
    assert out.first_token.tolist() == [1.0, 1.0, 6.0, 6.0, 6.0]
    assert out.finish.tolist() == [3.0, 5.0, 7.0, 7.0, 6.0]


def test_batch_mode_groups_in_trace_order_and_pads_to_the_longest():
    outputs = [3, 5, 2, 2, 1]
    out = _one_replica([0.0] * 5, outputs, mode="batch", batch_size=4)
    assert out.groups == [[0, 1, 2, 3], [4]]
    # group 1 ends with its longest member (prefill 1 s + 4 decode steps); group 2 starts then
    assert out.finish.tolist() == [3.0, 5.0, 2.0, 2.0, 6.0]
    lengths = [[outputs[i] for i in g] for g in out.groups]
    assert padding_ratio(lengths) == pytest.approx((4 * 5 - 12) / 13)


def test_a_step_slowdown_stretches_every_step():
    spec = ClusterSpec(pools=["only"], replicas={"only": 1}, max_ongoing_requests=16, step_slowdown=2.0)
    out = simulate(_workload([0.0, 3.5], [10, 10], [10, 2]), _scheduler(spec), spec, LIMITS, ONE_SECOND_STEPS, 4096)
    # 2 s steps: A's prefill 0-2, decodes from 2; B arrives at 3.5 during A's second step (2-4),
    # prefills 4-6, decodes 6-8; A's 10 tokens take 10 steps: done at 20.
    assert out.first_token.tolist() == [2.0, 6.0]
    assert out.finish.tolist() == [20.0, 8.0]


def test_steps_that_start_while_the_predictor_prefills_take_longer():
    spec = ClusterSpec(pools=["only"], replicas={"only": 1}, max_ongoing_requests=16,
                       predictor_busy=[(0.0, 1.5), (10.0, 11.0)], predictor_slowdown=3.0)
    out = simulate(_workload([0.0, 20.0], [10, 10], [3, 3]), _scheduler(spec), spec, LIMITS, ONE_SECOND_STEPS, 4096)
    # A's prefill starts at 0, inside the first window: 3 s; its two decode steps start after it: 1 s
    # each. B arrives at 20, after both windows: the calibrated 1 s steps throughout.
    assert out.first_token.tolist() == [3.0, 21.0]
    assert out.finish.tolist() == [5.0, 23.0]


def test_a_prompt_prefilled_before_on_the_engine_skips_its_cached_blocks():
    """Prefix caching: the second sample of a prompt prefills only past its last full block."""
    limits = EngineLimits(max_num_seqs=8, max_num_batched_tokens=100, kv_cache_tokens=10_000, block_size=16)
    spec = ClusterSpec(pools=["only"], replicas={"only": 1}, max_ongoing_requests=16)

    def run(families):
        requests = [Request(f"r{i}", "round_robin", arrival=t, prompt_tokens=250, family=f)
                    for i, (t, f) in enumerate(zip([0.0, 20.0], families))]
        return simulate(Workload(requests, np.array([2, 2])), _scheduler(spec), spec, limits, ONE_SECOND_STEPS, 4096)

    fresh, cached = run(["a", "b"]), run(["a", "a"])
    assert fresh.first_token[1] - 20.0 == 3.0  # 250 tokens in chunks of 100: three prefill steps
    assert cached.first_token[1] - 20.0 == 1.0  # 250 % 16 = 10 tokens left: one step
