"""A pool's admission queue on the router's event loop: requests hold a slot, or wait for one.

router.admission decides who goes next; this adds what an HTTP request needs around it: an
awaitable turn, a bound on the wait, and the handover when a request waits no longer (its client
went away, it timed out) so that a slot is never lost and never given twice. Everything runs on
the one event loop of the router replica, so the handover needs no lock.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from router.admission import Admission, AdmissionQueue


class QueueFull(Exception):
    """The pool's queue is at its bound; `retry_after_s` is what the client should wait."""

    def __init__(self, retry_after_s: int):
        super().__init__(f"queue full, retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(eq=False)  # identity: two tickets are never the same request
class Ticket:
    request_id: str
    turn: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    queued: bool = False  # it waited (rather than dispatching at once)


class PoolGate:
    def __init__(self, queue: AdmissionQueue):
        self.queue = queue

    def offer(self, ticket: Ticket, tokens: float | None, on_prior: bool = False) -> Admission:
        """Dispatch (the ticket holds a slot), queue (await `wait`), or raise QueueFull."""
        verdict = self.queue.offer(ticket, time.monotonic(), tokens, on_prior)
        if verdict is Admission.FULL:
            raise QueueFull(self.retry_after_s())
        if verdict is Admission.DISPATCH:
            ticket.turn.set_result(None)
        else:
            ticket.queued = True
        return verdict

    async def wait(self, ticket: Ticket, timeout_s: float) -> None:
        """Until the ticket holds a slot. On timeout or cancellation it leaves the queue, and if a
        slot had just been handed to it, gives that slot to the next in line."""
        try:
            # Not wait_for: it swallows a cancellation that arrives just after the turn came.
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(ticket.turn)
        except BaseException:
            if not self.queue.withdraw(ticket) and ticket.turn.done() and not ticket.turn.cancelled():
                self.leave()  # it was handed a slot it will not use
            ticket.turn.cancel()
            raise

    def rerank(self, ticket: Ticket, tokens: float | None) -> None:
        self.queue.reprioritise(ticket, tokens)

    def leave(self) -> None:
        """A request holding a slot is done with it: the next waiting ticket takes it."""
        nxt = self.queue.release(time.monotonic())
        while nxt is not None and nxt.turn.done():  # gave up waiting in the meantime
            nxt = self.queue.release(time.monotonic())
        if nxt is not None:
            nxt.turn.set_result(None)

    def retry_after_s(self) -> int:
        """A rough time until the queue has room: how long its oldest request has waited so far."""
        return max(1, min(60, math.ceil(self.queue.oldest_wait_s(time.monotonic()))))
