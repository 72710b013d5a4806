"""The admission queue: dispatch while a slot is free, shortest-first with aging, its starvation bound."""

import random

from router.scheduling.admission import Admission, AdmissionQueue, QueueOrder

SJF = QueueOrder(max_overtake_s=100.0, horizon_tokens=1000.0, prior_tokens=500.0)


def _full_queue(order=SJF, slots=1, max_waiting=None) -> AdmissionQueue:
    q = AdmissionQueue(slots, max_waiting, order)
    assert q.offer("running", now=0.0) is Admission.DISPATCH
    return q


def _drain(q: AdmissionQueue, now: float) -> list:
    out = []
    while (item := q.release(now)) is not None:
        out.append(item)
    return out


def test_dispatches_while_slots_are_free_then_queues_then_refuses():
    q = AdmissionQueue(slots=2, max_waiting=1)
    assert [q.offer(i, 0.0) for i in range(4)] == [Admission.DISPATCH, Admission.DISPATCH, Admission.QUEUED,
                                                  Admission.FULL]
    assert (q.inflight, len(q), q.stats.rejected) == (2, 1, 1)
    assert q.release(1.0) == 2 and q.inflight == 2  # the waiting one took the freed slot
    assert q.release(2.0) is None and q.inflight == 1


def test_fifo_by_default_and_shortest_first_with_a_slack():
    fifo = _full_queue(QueueOrder())
    sjf = _full_queue()
    for i, tokens in enumerate([900, 10, 400]):
        fifo.offer(f"r{i}", now=float(i), tokens=tokens)
        sjf.offer(f"r{i}", now=float(i), tokens=tokens)
    assert _drain(fifo, 10.0) == ["r0", "r1", "r2"]
    assert _drain(sjf, 10.0) == ["r1", "r2", "r0"]
    assert fifo.stats.reordered == 0 and sjf.stats.reordered == 2  # r1 and r2 left before an older r0


def test_unpredicted_requests_rank_at_the_prior_and_a_late_prediction_reranks():
    q = _full_queue()
    q.offer("long", now=0.0, tokens=900)
    q.offer("unknown", now=0.0)  # ranks at the prior, 500 tokens
    q.offer("mid", now=0.0, tokens=600)
    q.reprioritise("unknown", 50)  # its prediction arrives while it waits
    assert _drain(q, 1.0) == ["unknown", "mid", "long"]


def test_a_request_ranked_on_the_prior_counts_as_ranked_only_once_its_own_length_lands():
    q = _full_queue()
    q.offer("predicted", now=0.0, tokens=900)
    q.offer("waiting", now=0.0, tokens=100, on_prior=True)  # the prior, bounded by its max_tokens
    assert q.ranked() == 1
    q.reprioritise("waiting", 50)
    assert q.ranked() == 2


def test_aging_a_long_request_is_never_passed_by_one_that_arrived_max_overtake_s_later():
    q = _full_queue()
    q.offer("long", now=0.0, tokens=5000)  # beyond the horizon: the largest slack, 100 s
    q.offer("short-early", now=99.0, tokens=1)
    q.offer("short-late", now=100.5, tokens=1)
    assert _drain(q, 200.0) == ["short-early", "long", "short-late"]


def test_starvation_bound_holds_under_a_random_stream():
    """Whatever the tokens: nothing that arrived more than max_overtake_s after a request leaves before it."""
    rng = random.Random(7)
    q = AdmissionQueue(slots=2, order=SJF)
    arrival, left = {}, []
    now = 0.0
    for i in range(3000):
        now += rng.expovariate(1.0)
        arrival[i] = now
        if q.offer(i, now, tokens=rng.choice([5, 50, 5000, None])) is Admission.DISPATCH:
            left.append(i)
        if rng.random() < 0.45:  # slots free a little slower than requests come: a queue builds
            if (item := q.release(now)) is not None:
                left.append(item)
    left += _drain(q, now)
    assert sorted(left) == list(range(3000))
    position = {item: k for k, item in enumerate(left)}
    for a in range(3000):
        passers = [b for b in left[:position[a]] if arrival[b] > arrival[a] + SJF.max_overtake_s]
        assert not passers, (a, passers[:3])
    assert q.stats.reordered > 0


def test_withdrawn_requests_never_get_a_slot():
    q = _full_queue()
    q.offer("gone", now=0.0, tokens=1)
    q.offer("stays", now=0.0, tokens=900)
    assert q.withdraw("gone") and not q.withdraw("gone")
    assert _drain(q, 1.0) == ["stays"]
    assert q.stats.withdrawn == 1


def test_unlimited_slots_never_queue():
    q = AdmissionQueue(slots=None)
    assert all(q.offer(i, 0.0) is Admission.DISPATCH for i in range(100))
