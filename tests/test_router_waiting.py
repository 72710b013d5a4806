"""The admission queue on an event loop: turns, timeouts and the handover of slots (no server)."""

import asyncio

import pytest

from router.admission import AdmissionQueue, QueueOrder
from router.waiting import PoolGate, QueueFull, Ticket


def _gate(slots=1, max_waiting=None) -> PoolGate:
    return PoolGate(AdmissionQueue(slots, max_waiting, QueueOrder(max_overtake_s=100.0)))


def test_waiters_get_slots_shortest_first_and_a_full_queue_refuses():
    async def scenario():
        gate = _gate(max_waiting=2)
        running = Ticket("running")
        gate.offer(running, None)
        long, short = Ticket("long"), Ticket("short")
        gate.offer(long, 900)
        gate.offer(short, 10)
        with pytest.raises(QueueFull) as full:
            gate.offer(Ticket("third"), 1)
        assert full.value.retry_after_s >= 1
        order = []

        async def serve(t: Ticket):
            await gate.wait(t, 5)
            order.append(t.request_id)
            gate.leave()

        tasks = [asyncio.create_task(serve(t)) for t in (long, short)]
        await asyncio.sleep(0)
        gate.leave()  # the running request is done
        await asyncio.gather(*tasks)
        return order, gate.queue.inflight

    order, inflight = asyncio.run(scenario())
    assert order == ["short", "long"] and inflight == 0


def test_a_waiter_that_gives_up_loses_nothing_and_the_next_one_gets_the_slot():
    async def scenario():
        gate = _gate()
        gate.offer(Ticket("running"), None)
        impatient, patient = Ticket("impatient"), Ticket("patient")
        gate.offer(impatient, 1)
        gate.offer(patient, 2)
        with pytest.raises(TimeoutError):
            await gate.wait(impatient, 0.01)
        waiter = asyncio.create_task(gate.wait(patient, 5))
        await asyncio.sleep(0)
        gate.leave()
        await waiter
        gate.leave()
        return gate.queue

    queue = asyncio.run(scenario())
    assert queue.inflight == 0 and len(queue) == 0 and queue.stats.withdrawn == 1


def test_a_slot_handed_to_a_cancelled_waiter_goes_to_the_next():
    async def scenario():
        gate = _gate()
        gate.offer(Ticket("running"), None)
        first, second = Ticket("first"), Ticket("second")
        gate.offer(first, 1)
        gate.offer(second, 2)
        w1 = asyncio.create_task(gate.wait(first, 5))
        w2 = asyncio.create_task(gate.wait(second, 5))
        await asyncio.sleep(0)
        gate.leave()  # first is handed the slot ...
        w1.cancel()  # ... and its client goes away before it runs
        with pytest.raises(asyncio.CancelledError):
            await w1
        await w2  # second got the slot first gave back
        gate.leave()
        return gate.queue

    queue = asyncio.run(scenario())
    assert queue.inflight == 0
