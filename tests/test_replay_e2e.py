"""A small trace replayed end to end through the real stack by Ray actors: nothing lost.

The actors join the stack's own Ray cluster (the one its `serve run` started) and stream through
the router with the openai client, open loop.
"""

from pathlib import Path

import pytest

from benchmarks.replay.actors import account, replay, spawn_actors
from benchmarks.replay.metrics import summarise
from benchmarks.replay.trace import build_trace
from tests import FORELEN_TINY as TINY  # fixed short prompts: predictions well inside the timeout

pytestmark = pytest.mark.stack
POOLS = {"default"}


@pytest.fixture(scope="module")
def trace():
    return build_trace(TINY, n=6, arrival="poisson", rate=2.0, max_tokens=12, seed=0)


@pytest.fixture(scope="module")
def actors(stack):
    yield spawn_actors(stack.base_url, 2, request_timeout_s=240)
    import ray

    ray.shutdown()  # the driver connection only; the stack's cluster stays


def test_open_loop_replay_records_every_request(stack, trace, actors):
    records = replay(stack.base_url, trace, actors=actors, timeout_s=300)  # the router's own policy
    tally = account(trace, records)
    assert (tally.lost, tally.failed, tally.completed) == (0, 0, len(trace)), [r.error for r in records]
    for r, req in zip(sorted(records, key=lambda r: r.request_id), trace):
        assert r.request_id == req.request_id and r.policy == "last_work" and r.pool in POOLS
        assert r.routed_policy == "last_work" and 0 < r.completion_tokens <= 12
        # Six requests never fill the slots: none waits, and none needs a prediction: a cap of 12
        # tokens, under the head's 10th training percentile, is the length (source max_tokens).
        assert r.queued_s == 0 and r.predicted_tokens == 12 and r.length_source == "max_tokens"
        assert r.arrival_s <= r.sent_s < r.first_token_s <= r.finish_s
        assert r.sent_s - r.arrival_s < 5  # sent on time: open loop
    assert summarise(records, batch_size=4)["throughput_tok_s"] > 0


def test_the_speed_probe_gets_answers_of_exactly_its_length_through_the_stack(stack, actors):
    import time

    from benchmarks.replay.actors import START_LEAD_S
    from benchmarks.replay.probe import PROBE_TOKENS, probe_trace, step_seconds

    records = replay(stack.base_url, probe_trace("e2e"), actors=actors, timeout_s=300, t0=time.time() + START_LEAD_S)
    assert [r.completion_tokens for r in records] == [PROBE_TOKENS] * len(records), [r.error for r in records]
    assert 0 < step_seconds(records) < 5
