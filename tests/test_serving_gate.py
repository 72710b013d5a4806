"""Where a request waits: turns, timeouts and the handover of slots on an event loop (no server)."""

import asyncio

import pytest

from router.scheduling.admission import QueueOrder
from router.scheduling.pools import Pools
from router.scheduling.request import Request
from router.scheduling.scheduler import Scheduler
from router.serving.gate import Gate, QueueFull


def _gate(slots=1, waiting_per_slot=None) -> Gate:
    scheduler = Scheduler(Pools(("p",), ()), {"p": slots}, ["oracle_work"], "ray_default",
                          order=QueueOrder(max_overtake_s=100.0), waiting_per_slot=waiting_per_slot)
    return Gate(scheduler)


def _request(name: str, tokens: float | None = None) -> Request:
    return Request(id=name, policy="oracle_work", pool="p", rank_tokens=tokens)


def _busy_gate_with_two_waiting(first: str, second: str) -> tuple[Gate, Request, Request, Request]:
    """One slot held by `running`, and two waiters behind it, the first ranked shorter."""
    gate = _gate()
    running = _request("running")
    gate.offer(running)
    a, b = _request(first, 1), _request(second, 2)
    gate.offer(a)
    gate.offer(b)
    return gate, running, a, b


def test_waiters_get_slots_shortest_first_and_a_full_queue_refuses():
    async def scenario():
        gate = _gate(waiting_per_slot=2)
        running = _request("running")
        gate.offer(running)
        long, short = _request("long", 900), _request("short", 10)
        gate.offer(long)
        gate.offer(short)
        with pytest.raises(QueueFull) as full:
            gate.offer(_request("third", 1))
        assert full.value.retry_after_s >= 1 and full.value.pool == "p"
        order = []

        async def serve(r: Request):
            await gate.wait(r, 5)
            order.append(r.id)
            gate.leave(r)

        tasks = [asyncio.create_task(serve(r)) for r in (long, short)]
        await asyncio.sleep(0)
        gate.leave(running)
        await asyncio.gather(*tasks)
        return order, gate.scheduler.queues["p"].inflight, short

    order, inflight, short = asyncio.run(scenario())
    assert order == ["short", "long"] and inflight == 0
    assert short.queued and short.dispatched_at is not None  # the record says it waited, and when it left


def test_a_waiter_that_gives_up_loses_nothing_and_the_next_one_gets_the_slot():
    async def scenario():
        gate, running, impatient, patient = _busy_gate_with_two_waiting("impatient", "patient")
        with pytest.raises(TimeoutError):
            await gate.wait(impatient, 0.01)
        waiter = asyncio.create_task(gate.wait(patient, 5))
        await asyncio.sleep(0)
        gate.leave(running)
        await waiter
        gate.leave(patient)
        return gate.scheduler.queues["p"]

    queue = asyncio.run(scenario())
    assert queue.inflight == 0 and len(queue) == 0 and queue.stats.withdrawn == 1


def test_a_slot_handed_to_a_cancelled_waiter_goes_to_the_next():
    async def scenario():
        gate, running, first, second = _busy_gate_with_two_waiting("first", "second")
        w1 = asyncio.create_task(gate.wait(first, 5))
        w2 = asyncio.create_task(gate.wait(second, 5))
        await asyncio.sleep(0)
        gate.leave(running)  # first is handed the slot ...
        w1.cancel()  # ... and its client goes away before it runs
        with pytest.raises(asyncio.CancelledError):
            await w1
        await w2  # second got the slot first gave back
        gate.leave(second)
        return gate.scheduler.queues["p"]

    queue = asyncio.run(scenario())
    assert queue.inflight == 0
