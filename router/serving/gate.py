"""Where a request waits for a slot: the scheduler's queues on the router's event loop.

router.scheduling.scheduler decides who goes next; this adds what a request in flight needs around
it: an awaitable turn, a bound on the wait, and the handover when a request waits no longer
(its client went away, it timed out) so that a slot is never lost and never given twice.
Everything runs on the one event loop of the router replica, so the handover needs no lock.
"""

from __future__ import annotations

import asyncio
import math
import time

from router.scheduling.admission import Admission
from router.scheduling.request import Request
from router.scheduling.scheduler import Scheduler


class QueueFull(Exception):
    """The pool's queue is at its bound; `retry_after_s` is what the client should wait."""

    def __init__(self, pool: str, retry_after_s: int):
        super().__init__(f"the {pool} pool's queue is full, retry after {retry_after_s} s")
        self.pool = pool
        self.retry_after_s = retry_after_s


class Gate:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self._turns: dict[Request, asyncio.Future] = {}  # waiting requests

    def offer(self, request: Request) -> Admission:
        """Dispatch (the request holds a slot) or queue (await `wait`); raises QueueFull."""
        verdict = self.scheduler.admit(request, time.time())
        if verdict is Admission.FULL:
            raise QueueFull(request.pool, self.retry_after_s(request.pool))
        if verdict is Admission.QUEUED:
            self._turns[request] = asyncio.get_running_loop().create_future()
        return verdict

    async def wait(self, request: Request, timeout_s: float) -> None:
        """Until the request holds a slot. On timeout or cancellation it leaves the queue, and if a
        slot had just been handed to it, gives that slot to the next in line."""
        turn = self._turns.get(request)
        if turn is None:
            return  # it dispatched at once
        try:
            # Not wait_for: it swallows a cancellation that arrives just after the turn came.
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(turn)
        except BaseException:
            if not self.scheduler.withdraw(request) and turn.done() and not turn.cancelled():
                self.leave(request)  # it was handed a slot it will not use
            turn.cancel()
            raise
        finally:
            self._turns.pop(request, None)

    def leave(self, request: Request) -> None:
        """A request holding a slot is done with it: the next waiting request takes it."""
        while (nxt := self.scheduler.release(request.pool, time.time())) is not None:
            turn = self._turns.get(nxt)
            if turn is not None and not turn.done():
                turn.set_result(None)
                return
            # gave up waiting in the meantime: the slot passes on

    def retry_after_s(self, pool: str) -> int:
        """A rough time until the queue has room: how long its oldest request has waited so far."""
        return max(1, min(60, math.ceil(self.scheduler.queues[pool].oldest_wait_s(time.time()))))
