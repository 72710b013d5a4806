"""Rollouts on a fake pool (no server): the plans' order and placement through the pool client and
the admission queue, every sample returned, and a full queue ending the rollout with 429 and no
sample left running. tests/test_rollout_e2e.py runs them on the real stack."""

import asyncio

import pytest

from router.scheduling.pools import Pools
from router.scheduling.request import Request
from router.scheduling.scheduler import Scheduler
from router.serving.errors import APIError
from router.serving.gate import Gate, QueueFull
from router.serving.pool_client import PoolClient
from router.serving.replica_ledger import ReplicaLedger
from router.serving.rollout import RolloutRequest, RolloutRunner
from tests.fakes import FakePool


def _runner(lengths: dict[str, int], slots=4, per_replica=2) -> tuple[RolloutRunner, FakePool, Gate]:
    ledger = ReplicaLedger()
    fake = FakePool(ledger, replicas=["r1", "r2"], delay_s=0.0005,
                    tokens=lambda body: lengths[body.messages[0]["content"]])
    gate = Gate(Scheduler(Pools(("p",), ()), {"p": slots}, ["ray_default"], "ray_default"))

    async def render(request, body, kind):
        return [1, 2, 3], ""

    return RolloutRunner(PoolClient("p", fake, ledger), gate, None, render, 100, per_replica), fake, gate


def _request(lengths, **extra) -> RolloutRequest:
    prompts = list(lengths)
    return RolloutRequest(model="m", prompts=prompts, max_tokens=500, known_tokens=[[lengths[p]] for p in prompts],
                          **extra)



def test_makespan_starts_the_longest_first_on_the_replica_with_the_least_work():
    lengths = {"a": 100, "b": 10, "c": 50, "d": 70}
    runner, fake, gate = _runner(lengths)
    out = asyncio.run(runner.run(_request(lengths, schedule="makespan")))
    order = sorted(out["samples"], key=lambda s: s["dispatched_s"])
    assert [s["completion_tokens"] for s in order] == [100, 70, 50, 10]
    # a -> r1 (100), d -> r2 (70), c -> r2 (120 there vs 100), b: r2 is full (2 per replica) -> r1
    assert [c.replica for c in fake.calls] == ["r1", "r2", "r2", "r1"]
    assert [s["completion_tokens"] for s in out["samples"]] == [100, 10, 50, 70]  # in prompt order
    assert [s["replica"] for s in out["samples"]] == ["r1", "r1", "r2", "r2"]
    assert all(s["error"] is None and s["finished_s"] >= s["dispatched_s"] for s in out["samples"])
    assert gate.scheduler.queues["p"].inflight == 0 and runner._pool.ledger.loads(["r1", "r2"])[0].requests == 0


def test_every_sample_runs_under_its_own_internal_id_and_the_ledger_counts_them_right():
    lengths = {p: n for p, n in zip("abcdefgh", [30, 10, 25, 5, 40, 15, 20, 35])}
    runner, fake, _ = _runner(lengths)
    asyncio.run(runner.run(_request(lengths, schedule="makespan")))
    assert [c.internal_id for c in fake.calls] == [c.request_id for c in fake.calls]
    assert max(fake.peak.values()) <= 2  # the ledger's counts kept every replica within its limit


def test_padding_groups_similar_lengths_one_group_per_replica_at_a_time():
    lengths = {p: n for p, n in zip("abcdefgh", [80, 10, 70, 20, 60, 30, 50, 40])}
    runner, fake, _ = _runner(lengths, slots=8, per_replica=4)
    out = asyncio.run(runner.run(_request(lengths, schedule="padding", batch_size=2)))
    groups = {}
    for s in out["samples"]:
        groups.setdefault(s["group"], []).append(s["completion_tokens"])
    assert sorted(sorted(g) for g in groups.values()) == [[10, 20], [30, 40], [50, 60], [70, 80]]
    by_replica = {}
    for s in sorted(out["samples"], key=lambda s: s["dispatched_s"]):
        by_replica.setdefault(s["replica"], []).append(s)
    for lane in by_replica.values():  # a replica's next group starts after its previous group ended
        for before, after in zip(lane, lane[1:]):
            if before["group"] != after["group"]:
                assert after["dispatched_s"] >= max(x["finished_s"] for x in lane if x["group"] == before["group"])


def test_fifo_keeps_prompt_order_and_every_sample_of_n_comes_back():
    lengths = {"a": 5, "b": 50}
    runner, fake, _ = _runner(lengths)
    out = asyncio.run(runner.run(RolloutRequest(model="m", prompts=["a", "b"], n=3, max_tokens=500, schedule="fifo")))
    assert [s["completion_tokens"] for s in sorted(out["samples"], key=lambda s: s["dispatched_s"])] == [5] * 3 + [50] * 3
    assert [(s["prompt_index"], s["sample_index"]) for s in out["samples"]] == [(p, k) for p in (0, 1) for k in range(3)]
    assert all(s["text"] == "t" * s["completion_tokens"] for s in out["samples"])


def test_a_queue_that_fills_mid_rollout_is_a_429_with_no_sample_left_running():
    # The first sample is short, so its slot frees while the next three still decode: the full queue
    # must then cancel them mid-stream (equal lengths would all end together on a slow machine).
    lengths = {p: 10 if p == "a" else 4000 for p in "abcdefgh"}
    runner, fake, gate = _runner(lengths)
    offer, offered = gate.offer, []

    def fills_on_the_sixth(request: Request):
        offered.append(request)
        if len(offered) == 6:
            raise QueueFull("p", 3)  # online traffic filled the queue while the rollout waited for slots
        return offer(request)

    gate.offer = fills_on_the_sixth

    async def run():
        with pytest.raises(APIError) as err:
            await runner.run(_request(lengths, schedule="fifo"))
        await asyncio.sleep(0.01)  # anything left running would still be streaming now
        return err.value

    err = asyncio.run(run())
    assert err.status == 429 and err.headers["Retry-After"] == "3" and err.code == "queue_full"
    assert len(fake.calls) >= 4 and any(s.cancelled for s in fake.streams)
    assert sum(fake.active.values()) == 0  # every stream ended or was cancelled: nothing decodes for nobody
    assert gate.scheduler.queues["p"].inflight == 0 and len(gate.scheduler.queues["p"]) == 0
    assert all(load.requests == 0 for load in runner._pool.ledger.loads(["r1", "r2"]))
