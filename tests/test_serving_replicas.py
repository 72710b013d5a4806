"""The replica ledger and the replica router Ray Serve calls: counts, pins, spillover, backoff (no cluster).

tests/test_ray_request_ids.py runs the same router inside Ray Serve."""

import asyncio
from types import SimpleNamespace

from ray.serve._private.request_router.common import PendingRequest

from router.scheduling.replica_choice import ReplicaLoad, least_work, power_of_two, rank_replicas
from router.scheduling.request import Prediction, Request
from router.serving.replica_ledger import ReplicaLedger
from router.serving.replica_router import LedgerRequestRouter


def _ledger(*replicas) -> ReplicaLedger:
    ledger = ReplicaLedger()
    ledger.set_replicas(list(replicas))
    return ledger


def _routed(ledger: ReplicaLedger, request_id: str, replica: str, **fields) -> Request:
    request = Request(request_id, "x", **fields)
    ledger.track(request)
    ledger.routed(request_id, replica)
    return request


def test_the_ledger_counts_requests_and_their_remaining_work_until_the_replica_finishes_them():
    ledger = _ledger("r1", "r2")
    a = _routed(ledger, "a", "r1", prediction=Prediction("last", 200.0, {}, "default", {}))
    _routed(ledger, "b", "r1")
    loads = {load.replica: load for load in ledger.loads()}
    assert (loads["r1"].requests, loads["r1"].remaining_tokens) == (2, 201.0)  # b has no estimate: 1 token
    assert loads["r2"].requests == 0
    a.streamed = 150
    assert ledger.loads(["r1"])[0].remaining_tokens == 51.0
    ledger.completed("a")  # Ray's hook, by the id the call ran under (ours)
    assert ledger.loads(["r1"])[0].requests == 1
    assert ledger.get("a").replica == "r1"  # where it ran stays known until the pool client drops it
    ledger.drop("a")
    ledger.drop("b")
    assert ledger.get("a") is None and [load.requests for load in ledger.loads()] == [0, 0]


def test_a_pinned_request_counts_on_its_replica_before_ray_confirms():
    ledger = _ledger("r1", "r2")
    ledger.track(Request("pinned", "x", pinned="r2"))
    assert {load.replica: load.requests for load in ledger.loads()} == {"r1": 0, "r2": 1}


def _router(ledger: ReplicaLedger, choice="least_inflight") -> LedgerRequestRouter:
    router = object.__new__(LedgerRequestRouter)  # Ray builds it with a deployment; its logic needs none
    router.initialize_state(pool="unused", choice=choice)
    router._ledger = ledger
    return router


def _candidates(*ids):
    return [SimpleNamespace(replica_id=SimpleNamespace(unique_id=i)) for i in ids]


def _pending(request_id: str | None) -> PendingRequest:
    body = SimpleNamespace(request_id=request_id)
    return PendingRequest(args=[body], kwargs={}, metadata=SimpleNamespace(internal_request_id=request_id),
                          future=None)


def _ids(groups) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in group] for group in groups]


def test_every_answer_of_the_replica_router_offers_every_replica_and_asks_ray_to_back_off():
    """Ray retries at once, re-probing queue lengths, unless should_backoff is set."""
    ledger = _ledger("a", "b", "c", "d")
    for i, replica in enumerate(["a", "a", "a", "b", "c", "c"]):
        _routed(ledger, f"q{i}", replica)
    router = _router(ledger)
    pending = _pending("new")
    groups = asyncio.run(router.choose_replicas(_candidates("a", "b", "c", "d"), pending))
    assert _ids(groups) == [["d"], ["b"], ["c"], ["a"]]  # fewest requests first, every replica offered
    assert pending.routing_context.should_backoff
    ledger.track(Request("pinned", "x", pinned="a"))
    pinned = _pending("pinned")
    groups = asyncio.run(router.choose_replicas(_candidates("a", "b", "c", "d"), pinned))
    assert _ids(groups)[0] == ["a"] and sorted(sum(_ids(groups)[1:], [])) == ["b", "c", "d"]  # then spill
    assert pinned.routing_context.should_backoff


def test_replica_choices_rank_as_documented():
    loads = [ReplicaLoad("a", 3, 900.0), ReplicaLoad("b", 1, 50.0), ReplicaLoad("c", 2, 10.0)]
    import random

    rng = random.Random(0)
    assert rank_replicas("least_inflight", loads, rng) == [["b"], ["c"], ["a"]]
    two = power_of_two(loads, rng)
    assert len(two) == 2 and loads[[load.replica for load in loads].index(two[0])].requests <= \
        loads[[load.replica for load in loads].index(two[1])].requests
    assert least_work(loads) == "c"
    assert rank_replicas("least_inflight", loads, rng, pinned="a")[0] == ["a"]
    assert rank_replicas("least_inflight", loads, rng, pinned="gone") == [["b"], ["c"], ["a"]]
